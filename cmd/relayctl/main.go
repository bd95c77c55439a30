// Command relayctl sees and mends a relay's outbox from a terminal: why nothing
// is delivered, the dead rows, re-queue, purge, who holds the election, and a
// pause that stops delivery during an incident without a deploy.
//
//	relayctl status                  counts, lag, the election, and a diagnosis
//	relayctl dead --type orders      dead rows, a page at a time
//	relayctl requeue --all           dead rows back to PENDING
//	relayctl purge --older-than 30d  SENT rows older than 30 days, in chunks
//	relayctl who                     who holds the election right now
//	relayctl pause --for 15m         hold the election so that no relay delivers
//	relayctl resume                  end a pause held elsewhere
//
// It reads the database from DATABASE_URL and the app, table and ceiling from
// the relays' own RELAY_* variables (relay.ConfigFromEnv), so that run beside a
// service it sees what the service's relays see; flags override both. Exit
// codes are for scripts, status's for pagers: see the usage text (relayctl -h).
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/xadm/relay"
)

// Exit codes.
const (
	exitOK    = 0 // done
	exitError = 1 // bad configuration, an unreachable database, a failed statement, an action refused or not confirmed
	exitUsage = 2 // an unknown command or flag, a bad flag value, a missing confirmation
	exitHeld  = 5 // pause: another session holds the election; resume: what holds it is not a pause
)

// The exit codes of status: the states pagers expect (Nagios), the verdict
// table of docs/operations.md.
const (
	statusOK       = 0 // OK: nothing waits long, rows move, or they wait out retries
	statusWarning  = 1 // WARNING: a message undelivered past -w, dead rows, two apps on one type
	statusCritical = 2 // CRITICAL: a message undelivered past -c, or nothing delivers (STALLED, PAUSED)
	statusUnknown  = 3 // UNKNOWN: status could not look within --timeout: a bad flag, the database unreachable or locked
)

const usage = `relayctl sees and mends a relay's outbox: why nothing is delivered, dead rows,
re-queue, purge, who holds the election, pause and resume.

Usage:
  relayctl [flags of every command] <command> [flags]

The flags of every command (below) may come before the command or after it:
relayctl --database-url URL status and relayctl status --database-url URL are
the same. A command's own flags come after it.

Commands:
  status   counts by type and status, the lag, the election's holder, and a
           diagnosis: "nothing is delivered because ..."; its exit code is a
           pager's state (below)
  dead     the dead rows, a page at a time (--type, --after, --limit)
  requeue  re-queue dead rows: --id N[,N...], --type T or --all
  purge    delete SENT rows older than --older-than (e.g. 30d, 12h), in chunks,
           with a bar, the rate and the time left; --dry-run only counts
  who      who holds the app's election right now
  pause    hold the app's election, as a JVM relay would, so that no relay
           delivers, until Ctrl-C or --for elapses
  resume   end a pause held by relayctl pause elsewhere

Flags of every command:
  --database-url URL  the database (default $DATABASE_URL)
  --app NAME          the app: its election and the ceiling it shares
                      (default $RELAY_APP_NAME, else "app")
  --table NAME        the outbox table (default $RELAY_TABLE, else "mensagem_m2m")
  --max-attempts N    the relays' ceiling: a row that failed N times is dead
                      (default $RELAY_MAX_ATTEMPTS, else 10)
  --json              machine-readable output on stdout (every command but
                      pause and resume)

Flags of requeue and purge (which rows they write, and the confirmation):
  --types A,B         these types only
  --all-types         every type of the table, the other apps' rows too
                      (default: the types the live relays of --app serve;
                      without a live relay of --app, one of the two is
                      needed, or nothing is written)
  --other-app NAME    take over the rows of app NAME, whose relays are down:
                      the types the registry of types gives to it join the
                      scope (the confirmation says so)
  --yes               confirm without a prompt, for scripts
  Never a type that live relays of another app serve, nor one the registry
  of types gives to another app (without --other-app): they are left alone,
  and naming one in --types is refused. Each asks first: it says how many
  rows of which types it would change, and acts on "y" at the prompt; without
  a terminal it needs --yes.

Exit codes:
  0  done
  1  error: bad configuration, the database unreachable, a statement failed,
     an action refused (another app's types, another MaxAttempts) or not
     confirmed at the prompt
  2  usage: unknown command or flag, bad value, no types to act on, no
     terminal to confirm on and no --yes
  5  pause: another session holds the election; resume: it is held by
     something that is not a pause

Flags of status (a Nagios plugin: the first line is the verdict alone, then
the details, then performance data after a "|"):
  -w, --warning AGE    WARNING when a type's oldest message not yet delivered
                       is older than AGE, whatever it waits for, the
                       destination included: 5m, or TYPE=AGE for one type
                       (repeatable; default $RELAY_STATUS_WARNING, else 5m)
  -c, --critical AGE   CRITICAL past AGE (default $RELAY_STATUS_CRITICAL,
                       else 15m)
  --timeout D          answer UNKNOWN if the database has not answered
                       within D, waits for locks included (default
                       $RELAY_STATUS_TIMEOUT, else 10s)

Exit codes of status (a pager's states; docs/operations.md has the table):
  0  OK: nothing waits longer than -w
  1  WARNING: a message undelivered past -w (LATE), two apps with a sender
     for one type (OVERLAP), or dead rows wait for an operator (DEAD)
  2  CRITICAL: a message undelivered past -c (LATE), or nothing delivers:
     no relay, a pause, a stuck election (STALLED, PAUSED)
  3  UNKNOWN: status could not look within --timeout (a bad flag, the
     database unreachable, the table locked); the first line says what it
     waited on

Run relayctl <command> -h for a command's own flags.
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run runs relayctl with args (without the program's name) and returns the
// exit code; a confirmation is read from the process's stdin.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return runWith(ctx, args, input{r: os.Stdin, terminal: isTerminal(os.Stdin)}, stdout, stderr)
}

// input is where a confirmation is read, and whether a person types it.
type input struct {
	r        io.Reader
	terminal bool
}

// command is one subcommand: its flags are added to fs, and exec runs it.
type command struct {
	name, summary string
	flags         func(fs *flag.FlagSet, o *opts)
	exec          func(ctx context.Context, e *env) int
}

var commands = []command{
	{"status", "counts, lag, the election and a diagnosis", statusFlags, runStatus},
	{"dead", "the dead rows, a page at a time", deadFlags, runDead},
	{"requeue", "re-queue dead rows", requeueFlags, runRequeue},
	{"purge", "delete old SENT rows", purgeFlags, runPurge},
	{"who", "who holds the election", func(*flag.FlagSet, *opts) {}, runWho},
	{"pause", "hold the election so that no relay delivers", pauseFlags, runPause},
	{"resume", "end a pause held elsewhere", func(*flag.FlagSet, *opts) {}, runResume},
}

// opts are the parsed flags of every command; each command reads its own.
type opts struct {
	databaseURL, app, table string
	maxAttempts             int
	json                    bool

	// status
	sample, stallAfter, timeout time.Duration
	warning, critical           thresholdFlag
	// dead
	deadType    string
	deadTypeSet bool
	after       int64
	limit       int
	// requeue
	ids    idList
	typ    string
	typSet bool
	all    bool
	// requeue and purge: the Admin's scope
	types     string
	allTypes  bool
	otherApps string // --other-app: apps whose rows the operator takes over
	// purge
	olderThan ageFlag
	dryRun    bool
	// requeue and purge
	yes bool
	// pause
	holdFor, wait time.Duration
}

// env is what a command runs with.
type env struct {
	o              opts
	cfg            relay.Config
	stdin          input
	stdout, stderr io.Writer
	pool           *pgxpool.Pool // pause also opens a session of its own
	admin          *relay.Admin
	judged         bool // status reached a verdict: its code is the verdict's
}

// runWith is run with a confirmation read from in.
func runWith(ctx context.Context, args []string, in input, stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(stderr, usage)
		if len(args) == 0 {
			return exitUsage
		}
		return exitOK
	}
	leading, name, rest, err := splitCommand(args)
	if err != nil {
		fmt.Fprintf(stderr, "relayctl: %v\n\n%s", err, usage)
		return exitUsage
	}
	var cmd *command
	for i := range commands {
		if commands[i].name == name {
			cmd = &commands[i]
		}
	}
	if cmd == nil {
		fmt.Fprintf(stderr, "relayctl: unknown command %q\n\n%s", name, usage)
		return exitUsage
	}

	e := &env{stdin: in, stdout: stdout, stderr: stderr}
	code := e.run(ctx, cmd, leading, rest)
	if cmd.name == "status" && !e.judged && code != exitOK {
		return statusUnknown // no verdict: a pager reads 1 and 2 as states
	}
	return code
}

// run parses cmd's flags and runs it.
func (e *env) run(ctx context.Context, cmd *command, leading, rest []string) int {
	stderr := e.stderr
	fs := flag.NewFlagSet("relayctl "+cmd.name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&e.o.databaseURL, "database-url", "", "the database (default $DATABASE_URL)")
	fs.StringVar(&e.o.app, "app", "", `the app (default $RELAY_APP_NAME, else "app")`)
	fs.StringVar(&e.o.table, "table", "", `the outbox table (default $RELAY_TABLE, else "mensagem_m2m")`)
	fs.IntVar(&e.o.maxAttempts, "max-attempts", 0, "the relays' ceiling (default $RELAY_MAX_ATTEMPTS, else 10)")
	if cmd.name != "pause" && cmd.name != "resume" {
		fs.BoolVar(&e.o.json, "json", false, "machine-readable output on stdout")
	}
	cmd.flags(fs, &e.o)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: relayctl %s [flags]: %s\n\nFlags:\n", cmd.name, cmd.summary)
		fs.PrintDefaults()
	}
	if err := fs.Parse(append(leading, rest...)); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "type" {
			e.o.deadTypeSet, e.o.typSet = true, true
		}
	})
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "relayctl %s: unexpected argument %q (flags only)\n", cmd.name, fs.Arg(0))
		return exitUsage
	}

	if msg := e.o.check(cmd.name); msg != "" {
		fmt.Fprintf(stderr, "relayctl %s: %s\n", cmd.name, msg)
		return exitUsage
	}

	cfg, err := relay.ConfigFromEnv()
	if err != nil {
		fmt.Fprintf(stderr, "relayctl: %v\n", err)
		return exitError
	}
	if e.o.app != "" {
		cfg.AppName = e.o.app
	}
	if e.o.table != "" {
		cfg.Table = e.o.table
	}
	if e.o.maxAttempts != 0 {
		cfg.MaxAttempts = e.o.maxAttempts
	}
	e.cfg = cfg
	url := e.o.databaseURL
	if url == "" {
		url = os.Getenv("DATABASE_URL")
	}
	if strings.TrimSpace(url) == "" {
		fmt.Fprintln(stderr, "relayctl: no database: set DATABASE_URL or pass --database-url (a postgres:// URL or key=value DSN)")
		return exitUsage
	}
	e.o.databaseURL = url

	var bound time.Duration // status answers within its timeout, waits for locks included
	if cmd.name == "status" {
		if bound, err = e.statusTimeout(); err != nil {
			return e.usageErr("status: %v", err)
		}
	}
	pool, err := openPool(ctx, url, "relayctl "+cmd.name, bound)
	if err != nil {
		fmt.Fprintf(stderr, "relayctl: %v\n", err)
		return exitError
	}
	defer pool.Close()
	e.pool = pool
	var aopts []relay.AdminOption
	if e.o.types != "" {
		var types []string
		for _, t := range strings.Split(e.o.types, ",") {
			types = append(types, strings.TrimSpace(t))
		}
		aopts = append(aopts, relay.AdminTypes(types...))
	}
	if e.o.allTypes {
		if e.o.types != "" {
			return e.usageErr("give --types or --all-types, not both")
		}
		aopts = append(aopts, relay.AdminAllTypes())
	}
	for _, app := range strings.Split(e.o.otherApps, ",") {
		if app = strings.TrimSpace(app); app != "" {
			aopts = append(aopts, relay.AdminOtherApp(app))
		}
	}
	if e.admin, err = relay.NewAdmin(pool, cfg, aopts...); err != nil {
		fmt.Fprintf(stderr, "relayctl: %v\n", err)
		var fe *relay.FieldError
		if errors.As(err, &fe) && e.o.fromFlag(fe.Field) {
			return exitUsage // the flag's value, not the environment's
		}
		return exitError
	}
	return cmd.exec(ctx, e)
}

// globalFlags are the flags of every command, which may come before the
// command; true for those that take a value.
var globalFlags = map[string]bool{"database-url": true, "app": true, "table": true, "max-attempts": true, "json": false}

// splitCommand splits args into the flags before the command, the command and
// what follows it. Only the flags of every command may come first (a command's
// own flags are not known before the command is).
func splitCommand(args []string) (leading []string, name string, rest []string, err error) {
	for i := 0; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "-") {
			return args[:i:i], a, args[i+1:], nil
		}
		flagName, _, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		takesValue, ok := globalFlags[flagName]
		if !ok {
			return nil, "", nil, fmt.Errorf("flag %s before the command: only the flags of every command may come first (--database-url, --app, --table, --max-attempts, --json)", a)
		}
		if takesValue && !hasValue {
			i++ // its value
		}
	}
	return nil, "", nil, errors.New("no command after the flags")
}

// check returns what is wrong with the flags every command shares and with
// cmd's text flags, or "": text that PostgreSQL cannot take (a NUL byte,
// invalid UTF-8) or that names nothing (blank) is a usage error, before any
// statement. Numbers and durations are checked by the flag package (not a
// number) and by each command (out of range).
func (o *opts) check(cmd string) string {
	texts := []struct {
		flag, v string
		set     bool
	}{
		{"--app", o.app, o.app != ""},
		{"--table", o.table, o.table != ""},
		{"--database-url", o.databaseURL, o.databaseURL != ""},
	}
	switch cmd {
	case "dead":
		texts = append(texts, struct {
			flag, v string
			set     bool
		}{"--type", o.deadType, o.deadTypeSet})
	case "requeue":
		texts = append(texts, struct {
			flag, v string
			set     bool
		}{"--type", o.typ, o.typSet})
	}
	for _, t := range texts {
		if !t.set {
			continue
		}
		if msg := checkText(t.v); msg != "" {
			if t.flag == "--database-url" {
				return t.flag + " " + msg // never echoed: it may hold a password
			}
			return fmt.Sprintf("%s %q %s", t.flag, t.v, msg)
		}
	}
	if o.types != "" {
		for _, t := range strings.Split(o.types, ",") {
			if msg := checkText(t); msg != "" {
				return fmt.Sprintf("--types %q: the type %q %s", o.types, t, msg)
			}
		}
	}
	if o.maxAttempts < 0 {
		return fmt.Sprintf("--max-attempts must be at least 1, got %d", o.maxAttempts)
	}
	return ""
}

// checkText says what is wrong with v as a name PostgreSQL stores, or "".
func checkText(v string) string {
	switch {
	case !utf8.ValidString(v):
		return "is not valid UTF-8"
	case strings.ContainsRune(v, 0):
		return "contains a NUL byte, which PostgreSQL text cannot hold"
	case strings.TrimSpace(v) == "":
		return "is blank"
	}
	return ""
}

// fromFlag says the Config field was given by a flag rather than the environment.
func (o *opts) fromFlag(field string) bool {
	switch field {
	case "AppName":
		return o.app != ""
	case "Table":
		return o.table != ""
	case "MaxAttempts":
		return o.maxAttempts != 0
	}
	return false
}

// connectTimeout bounds a connection attempt that the URL does not bound.
const connectTimeout = 10 * time.Second

// openPool opens a small pool on url; its sessions are named app unless the
// URL names them. With bound > 0, connecting, each statement, and each wait
// for a lock are bounded within it (status: lockTimeout, statement_timeout).
func openPool(ctx context.Context, url, app string, bound time.Duration) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("DATABASE_URL: %w", err)
	}
	pc.MaxConns = 2
	if pc.ConnConfig.ConnectTimeout == 0 {
		pc.ConnConfig.ConnectTimeout = connectTimeout
	}
	if bound > 0 {
		pc.ConnConfig.ConnectTimeout = min(pc.ConnConfig.ConnectTimeout, bound)
		pc.ConnConfig.RuntimeParams["lock_timeout"] = strconv.Itoa(int(lockTimeout(bound) / time.Millisecond))
		pc.ConnConfig.RuntimeParams["statement_timeout"] = strconv.Itoa(int(bound / time.Millisecond))
	}
	if _, ok := pc.ConnConfig.RuntimeParams["application_name"]; !ok {
		pc.ConnConfig.RuntimeParams["application_name"] = app
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("DATABASE_URL: %w", err)
	}
	return pool, nil
}

// fail reports err and returns exitError.
func (e *env) fail(err error) int {
	fmt.Fprintf(e.stderr, "relayctl: %v\n", err)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" { // undefined_table
		fmt.Fprintf(e.stderr, "relayctl: is %q the relays' table? Set RELAY_TABLE or --table (schema.table if it is not on the search_path).\n", e.cfg.Table)
	}
	return exitError
}

// scopeFlags are the flags of the commands that write rows: which types,
// and the confirmation.
func scopeFlags(fs *flag.FlagSet, o *opts) {
	fs.StringVar(&o.types, "types", "", "act on these types only, separated by commas (default: the types the live relays of --app serve; "+
		"without a live relay of --app, this or --all-types is needed)")
	fs.BoolVar(&o.allTypes, "all-types", false, "act on every type of the table, the other apps' rows too, but those their live relays serve "+
		"and those the registry of types gives to another app")
	fs.StringVar(&o.otherApps, "other-app", "", "take over the rows of these other apps (comma-separated), whose relays are down: "+
		"their types, as the registry of types names them, join the scope; never while their relays run")
	fs.BoolVar(&o.yes, "yes", false, "confirm without a prompt (needed without a terminal)")
}

// scope says on stderr which types a command writes, and returns them; or,
// when the Admin writes nothing (no types to act on, another app's types),
// it says why and returns the exit code (ok false).
func (e *env) scope(ctx context.Context) (s relay.AdminScope, code int, ok bool) {
	s, err := e.admin.Scope(ctx)
	if err != nil {
		return s, e.fail(err), false
	}
	if !e.o.json { // the JSON answer carries them
		fmt.Fprintf(e.stderr, "relayctl: acting on %s of app %q in %s\n", s, e.cfg.AppName, e.cfg.Table)
		for _, app := range s.OtherApps {
			fmt.Fprintf(e.stderr, "relayctl: --other-app: this takes over the rows of app %q, another app, whose relays are down: "+
				"its types are written as if they were app %q's\n", app, e.cfg.AppName)
		}
	}
	if err := s.Err(); err != nil {
		fmt.Fprintf(e.stderr, "relayctl: nothing done: %v\n", err)
		if errors.Is(err, relay.ErrScopeUnknown) {
			return s, exitUsage, false // --types or --all-types is missing
		}
		return s, exitError, false
	}
	return s, 0, true
}

// confirm asks on the terminal whether to do what (a question without its
// question mark), and says whether to go on; otherwise it returns the exit
// code. --yes answers for scripts; without a terminal and without --yes it
// refuses.
func (e *env) confirm(ctx context.Context, cmd, what string) (code int, ok bool) {
	if e.o.yes {
		return 0, true
	}
	if !e.stdin.terminal {
		fprintf(e.stderr, "relayctl %s: nothing done: it asks first, and stdin is not a terminal to answer on; pass --yes to confirm from a script\n", cmd)
		return exitUsage, false
	}
	fprintf(e.stderr, "%s? [y/N] ", what)
	answer := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(e.stdin.r).ReadString('\n')
		answer <- strings.ToLower(strings.TrimSpace(line))
	}()
	select {
	case a := <-answer:
		if a == "y" || a == "yes" {
			return 0, true
		}
		fprintf(e.stderr, "relayctl %s: not confirmed: nothing done\n", cmd)
		return exitError, false
	case <-ctx.Done():
		fprintf(e.stderr, "\nrelayctl %s: interrupted: nothing done\n", cmd)
		return exitError, false
	}
}

// usageErr reports a bad flag value and returns exitUsage.
func (e *env) usageErr(format string, args ...any) int {
	fmt.Fprintf(e.stderr, "relayctl: "+format+"\n", args...)
	return exitUsage
}
