// Command relaybench measures the relay's throughput beside pgbench's, on the
// same durable PostgreSQL server, in one run:
//
//	go run ./cmd/relaybench                       # every scenario, about 3-4 minutes
//	go run ./cmd/relaybench -scenarios default,g100,guard
//	go run ./cmd/relaybench -scenarios history    # cost of an empty pass in a large history
//
// It uses the server in DATABASE_URL if that is set, and otherwise starts a
// throwaway local cluster with PostgreSQL's durability defaults (fsync on,
// synchronous_commit on, full_page_writes on; pgserver.Options.Durable), so a
// commit costs a WAL flush, as in production.
//
// The reference is pgbench on that server: -M prepared, a script doing one
// single-row UPDATE by primary key, random id, on a table of -rows rows, with 1
// client and with 8 clients (-j 2). Each relay scenario loads -rows PENDING rows
// into a fresh outbox table (INSERT … SELECT generate_series), and drains them
// through the periodic tick (Start … Stop: the path production uses, batches
// drained under one election) with a sender that does nothing. Its rate is rows
// over the time from the relay's first statement to the last recorded outcome.
// Every measurement is repeated -repeat times; the table shows medians.
//
// Scenarios (-scenarios, comma-separated; "all" is the default):
//
//	ceiling-c1     no relay: the relay's own SENT UPDATE (fenced, by id) sent by plain
//	               pgx in a loop, one statement per row, on 1 connection: the most a
//	               drain with one transaction per outcome can reach on this server
//	ceiling-c8     the same on 8 connections
//	ceiling-g100   no relay: the relay's own select of a batch and grouped SENT update,
//	               captured from a relay, replayed by plain pgx for batches of 100: the
//	               next batch selected on one connection while the last is updated on another
//	ceiling-g1000  the same for batches of 1000
//	default        DefaultConfig(): Concurrency 1, one transaction per outcome,
//	               AsyncCommit on                     target ≥ 0.7 × pgbench c1 with
//	                                                  synchronous_commit = off
//	default-sync   the same with AsyncCommit off: every outcome waits for its WAL flush
//	c8             Concurrency 8                                   target ≥ 0.8 × pgbench c8
//	c8-sync        Concurrency 8 with AsyncCommit off
//	g100           GroupOutcomes 100, BatchSize 100                target ≥ 6 × pgbench c1
//	g100-c4        the same with Concurrency 4
//	g100-sync      GroupOutcomes 100 with AsyncCommit off
//	g1000          GroupOutcomes 1000, BatchSize 1000
//	g1000-c4       the same with Concurrency 4
//	g1000-sync     GroupOutcomes 1000 with AsyncCommit off
//	slow20-c16     a destination answering in 20 ms, Concurrency 16, -slow-rows rows
//	                                                               target ≥ 90% of 800 msg/s
//	slow20-c16-b160  the same with BatchSize 160, a multiple of Concurrency
//	guard          round trips and time of an empty pass: direct, elected, coalesced
//	history        an empty pass with 10,000 vs -history-rows SENT rows (target ≤ 1.5×)
//	notify-cost    commits/s of 8 producers with and without the wake-up's NOTIFY (target ≥ 0.9×)
//	enqueue        commits/s of 8 producers: Enqueue beside a plain INSERT, and the pieces of
//	               Enqueue's statement alone (target ≥ 0.95×)
//	enqueue-many   rows/s of 8 producers, transactions of 1,000 messages: EnqueueMany beside a
//	               plain INSERT … SELECT FROM unnest(…) and a loop of Enqueue
//	                                                 target ≥ 0.8× the INSERT, ≥ 4× the loop
//	latency        commit → Send at -latency-rate, wake-ups vs polling only (target p50 ≤ 5 ms, p99 ≤ 50 ms)
//	partitions     -partition-replicas replicas (4) with -partitions Partitions (16) vs 1 replica,
//	               -partition-concurrency (4) each, a destination answering in -partition-delay
//	               (20 ms), -partition-rows rows over -partition-keys keys: every row once, each
//	               key in order                 target ≥ 0.875× per replica (3.5× at 4, 14× at 16)
//	               the shares settled after the replicas' start            target ≤ 5 s
//	               idle fleets of 1 and -partition-replicas: round trips, by a proxy
//	                                                     target ≤ 1 per replica per Interval
//	               and an empty pass of a partitioned member vs a single-key one   target ≤ 2×
//	isolation      types x and y: y's commit → Send while x's receiver hangs, ignores its
//	               context, or takes 1s (isolation.go; only when named)    target y max ≤ 3s
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"runtime"
	"runtime/pprof"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/xadm/relay"
	"github.com/xadm/relay/internal/testkit/pgserver"
	"github.com/xadm/relay/internal/tools/benchkit"
)

// scenario is one way of draining the outbox.
type scenario struct {
	name        string
	concurrency int
	batch       int
	group       int
	sync        bool          // AsyncCommit off (DefaultConfig has it on)
	sendDelay   time.Duration // the destination's answer time; 0 = no-op
	raw         bool          // no relay: the relay's SENT UPDATE from plain pgx, on concurrency connections
	rawAsync    bool          // raw, with the statement AsyncCommit sends (synchronous_commit off for its own transaction)
	rawGroup    int           // raw, the relay's own grouped statements for batches of rawGroup (ceiling.go)
	slow        bool          // uses -slow-rows instead of -rows

	// target, if set, returns the target's text and whether it is met.
	target func(rate float64, ref refs) (string, bool)
}

// refs are the pgbench figures that targets are ratios of: 1 client, 1
// client with synchronous_commit off, 8 clients.
type refs struct{ c1, c1off, c8 float64 }

func atLeastC1(k float64) func(float64, refs) (string, bool) {
	return func(rate float64, ref refs) (string, bool) {
		return fmt.Sprintf("≥ %.1f× c1", k), ref.c1 > 0 && rate >= k*ref.c1
	}
}

var drainScenarios = []scenario{
	{name: "ceiling-c1", concurrency: 1, raw: true},
	{name: "ceiling-c8", concurrency: 8, raw: true},
	{name: "ceiling-c1-async", concurrency: 1, raw: true, rawAsync: true},
	{name: "ceiling-g100", concurrency: 1, raw: true, rawGroup: 100},
	{name: "ceiling-g1000", concurrency: 1, raw: true, rawGroup: 1000},
	{name: "default", concurrency: 1, batch: 100, target: func(rate float64, ref refs) (string, bool) {
		return "≥ 0.7× c1 async", ref.c1off > 0 && rate >= 0.7*ref.c1off
	}},
	{name: "default-sync", concurrency: 1, batch: 100, sync: true},
	{name: "c8", concurrency: 8, batch: 100, target: func(rate float64, ref refs) (string, bool) {
		return "≥ 0.8× c8", ref.c8 > 0 && rate >= 0.8*ref.c8
	}},
	{name: "c8-sync", concurrency: 8, batch: 100, sync: true},
	{name: "g100", concurrency: 1, batch: 100, group: 100, target: atLeastC1(6)},
	{name: "g100-c4", concurrency: 4, batch: 100, group: 100},
	{name: "g100-sync", concurrency: 1, batch: 100, group: 100, sync: true},
	{name: "g1000", concurrency: 1, batch: 1000, group: 1000},
	{name: "g1000-c4", concurrency: 4, batch: 1000, group: 1000},
	{name: "g1000-sync", concurrency: 1, batch: 1000, group: 1000, sync: true},
	{name: "slow20-c16", concurrency: 16, batch: 100, sendDelay: 20 * time.Millisecond, slow: true,
		target: func(rate float64, _ refs) (string, bool) { return "≥ 720 msg/s", rate >= 720 }},
	{name: "slow20-c16-b160", concurrency: 16, batch: 160, sendDelay: 20 * time.Millisecond, slow: true},
}

var (
	rowsFlag     = flag.Int("rows", 20000, "rows per drain scenario, and the size of pgbench's table")
	slowRows     = flag.Int("slow-rows", 4000, "rows of the slow-destination scenario")
	historyRows  = flag.Int("history-rows", 2_000_000, "SENT rows of the large table of the history scenario")
	repeat       = flag.Int("repeat", 3, "runs of each measurement; the table shows the median")
	pgbenchTime  = flag.Duration("pgbench-time", 5*time.Second, "duration of each pgbench run")
	guardPasses  = flag.Int("guard-passes", 500, "passes of each kind timed by the guard and history scenarios")
	scenarioFlag = flag.String("scenarios", "all", "comma-separated scenarios to run (see the package doc), or all")
	cpuProfile   = flag.String("cpuprofile", "", "write a CPU profile of the drain scenarios (the relay's side) to this file")
)

func main() {
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "relaybench:", err)
		os.Exit(1)
	}
}

// want reports whether scenario name was asked for.
func want(name string) bool {
	for s := range strings.SplitSeq(*scenarioFlag, ",") {
		if s = strings.TrimSpace(s); s == "all" || s == name {
			return true
		}
	}
	return false
}

func run(ctx context.Context) error {
	for s := range strings.SplitSeq(*scenarioFlag, ",") {
		s = strings.TrimSpace(s)
		known := s == "all" || s == "guard" || s == "history" || s == "pgbench" || s == "latency" || s == "notify-cost" || s == "enqueue" || s == "enqueue-many" || s == "partitions" ||
			s == "isolation" || s == "inbox" ||
			slices.ContainsFunc(drainScenarios, func(d scenario) bool { return d.name == s })
		if !known {
			return fmt.Errorf("unknown scenario %q", s)
		}
	}
	begin := time.Now()
	sctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	srv, err := pgserver.StartWith(sctx, "DATABASE_URL", pgserver.Options{Durable: true})
	cancel()
	if err != nil {
		return err
	}
	defer srv.Stop()

	admin, err := benchkit.Pool(ctx, srv.URL, "relaybench", 4)
	if err != nil {
		return err
	}
	defer admin.Close()
	printMachine(ctx, admin, srv)

	var lines []line
	var drains []scenario
	for _, s := range drainScenarios {
		if want(s.name) {
			drains = append(drains, s)
		}
	}
	if len(drains) > 0 || want("pgbench") {
		if *cpuProfile != "" {
			f, err := os.Create(*cpuProfile)
			if err != nil {
				return err
			}
			defer f.Close()
			if err := pprof.StartCPUProfile(f); err != nil {
				return err
			}
			defer pprof.StopCPUProfile()
		}
		if lines, err = runRounds(ctx, srv, admin, drains); err != nil {
			return err
		}
		printTable(lines)
		printAsyncGains(lines)
	}
	if want("guard") {
		if err := runGuard(ctx, srv.URL, admin); err != nil {
			return fmt.Errorf("scenario guard: %w", err)
		}
	}
	if want("history") {
		if err := runHistory(ctx, srv.URL, admin); err != nil {
			return fmt.Errorf("scenario history: %w", err)
		}
	}
	if want("notify-cost") {
		if err := runNotifyCost(ctx, srv); err != nil {
			return fmt.Errorf("scenario notify-cost: %w", err)
		}
	}
	if want("enqueue") {
		if err := runEnqueue(ctx, srv.URL, admin); err != nil {
			return fmt.Errorf("scenario enqueue: %w", err)
		}
	}
	if want("enqueue-many") {
		if err := runEnqueueMany(ctx, srv.URL, admin); err != nil {
			return fmt.Errorf("scenario enqueue-many: %w", err)
		}
	}
	if want("inbox") {
		if err := runInbox(ctx, srv.URL, admin); err != nil {
			return fmt.Errorf("scenario inbox: %w", err)
		}
	}
	if want("partitions") {
		if err := runPartitions(ctx, srv.URL, admin); err != nil {
			return fmt.Errorf("scenario partitions: %w", err)
		}
	}
	if want("latency") {
		if err := runLatency(ctx, srv); err != nil {
			return fmt.Errorf("scenario latency: %w", err)
		}
	}
	if slices.Contains(strings.Split(*scenarioFlag, ","), "isolation") { // a minute a case: only when named
		if err := runIsolation(ctx, srv); err != nil {
			return fmt.Errorf("scenario isolation: %w", err)
		}
	}
	fmt.Printf("\ntotal %.0fs\n", time.Since(begin).Seconds())
	return ctx.Err()
}

// line is one row of the results table.
type line struct {
	name           string
	rows           int
	rate           float64 // median msg/s (tps for pgbench)
	runs           []float64
	ratioC1        float64
	ratioC1off     float64 // 0 = not shown
	ratioC8        float64 // 0 = not shown
	target, status string
}

func printTable(lines []line) {
	fmt.Println()
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "scenario\trows\tmsg/s (median)\truns\t× pgbench c1\t× c1 async\t× pgbench c8\ttarget\tverdict\t")
	for _, l := range lines {
		c1, c1off, c8 := "", "", ""
		if l.ratioC1 > 0 {
			c1 = fmt.Sprintf("%.2f", l.ratioC1)
		}
		if l.ratioC1off > 0 {
			c1off = fmt.Sprintf("%.2f", l.ratioC1off)
		}
		if l.ratioC8 > 0 {
			c8 = fmt.Sprintf("%.2f", l.ratioC8)
		}
		runs := make([]string, len(l.runs))
		for i, r := range l.runs {
			runs[i] = strconv.Itoa(int(r + 0.5))
		}
		rows := ""
		if l.rows > 0 {
			rows = strconv.Itoa(l.rows)
		}
		fmt.Fprintf(w, "%s\t%s\t%.0f\t%s\t%s\t%s\t%s\t%s\t%s\t\n", l.name, rows, l.rate, strings.Join(runs, " "), c1, c1off, c8, l.target, l.status)
	}
	w.Flush()
}

// printAsyncGains prints what AsyncCommit buys in each pair of scenarios run with and without it.
func printAsyncGains(lines []line) {
	rate := make(map[string]float64, len(lines))
	for _, l := range lines {
		rate[l.name] = l.rate
	}
	var gains []string
	for _, base := range []string{"default", "c8", "g100", "g1000"} {
		if ra, r := rate[base], rate[base+"-sync"]; r > 0 && ra > 0 {
			gains = append(gains, fmt.Sprintf("%s ×%.2f", base, ra/r))
		}
	}
	if len(gains) > 0 {
		fmt.Printf("AsyncCommit (async/sync, medians): %s\n", strings.Join(gains, ", "))
	}
}

// printMachine prints what the figures depend on.
func printMachine(ctx context.Context, db *pgxpool.Pool, srv *pgserver.Server) {
	var version, fsync, syncCommit, fpw, walSync, sharedBuffers string
	_ = db.QueryRow(ctx, `SELECT current_setting('server_version'), current_setting('fsync'),
		current_setting('synchronous_commit'), current_setting('full_page_writes'),
		current_setting('wal_sync_method'), current_setting('shared_buffers')`).
		Scan(&version, &fsync, &syncCommit, &fpw, &walSync, &sharedBuffers)
	mem := ""
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for l := range strings.Lines(string(b)) {
			if strings.HasPrefix(l, "MemTotal:") {
				f := strings.Fields(l)
				if kb, err := strconv.Atoi(f[1]); err == nil {
					mem = fmt.Sprintf("%.1f GiB", float64(kb)/(1<<20))
				}
			}
		}
	}
	cpu := ""
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				cpu = strings.TrimSpace(v)
				break
			}
		}
		f.Close()
	}
	fmt.Printf("machine: %d CPUs (%s), %s RAM, %s/%s, %s\n", runtime.NumCPU(), cpu, mem, runtime.GOOS, runtime.GOARCH, runtime.Version())
	fmt.Printf("server:  PostgreSQL %s (%s), fsync=%s synchronous_commit=%s full_page_writes=%s wal_sync_method=%s shared_buffers=%s\n",
		version, srv.Kind, fsync, syncCommit, fpw, walSync, sharedBuffers)
	if fsync != "on" || syncCommit != "on" {
		fmt.Println("WARNING: this server does not flush commits (fsync or synchronous_commit off): " +
			"a commit costs less than in production, and AsyncCommit's figures mean nothing")
	}
}

// ---- pgbench ----

const pgbenchTable = "relaybench_pgbench"

var tpsRE = regexp.MustCompile(`tps = ([0-9.]+) \(without initial connection time\)`)

// pgbench runs pgbench's single-row UPDATE script on the server.
type pgbench struct {
	bin, url, script, dir string
	db                    *pgxpool.Pool
}

func newPgbench(ctx context.Context, srv *pgserver.Server, db *pgxpool.Pool) (*pgbench, error) {
	bin, err := pgbenchPath(srv)
	if err != nil {
		return nil, err
	}
	n := *rowsFlag
	for _, q := range []string{
		`DROP TABLE IF EXISTS ` + pgbenchTable,
		`CREATE TABLE ` + pgbenchTable + ` (id int PRIMARY KEY, abalance int NOT NULL DEFAULT 0, filler text NOT NULL)`,
		`INSERT INTO ` + pgbenchTable + ` (id, filler) SELECT i, repeat('x', 84) FROM generate_series(1, ` + strconv.Itoa(n) + `) i`,
		`VACUUM ANALYZE ` + pgbenchTable,
	} {
		if _, err := db.Exec(ctx, q); err != nil {
			return nil, err
		}
	}
	dir, err := os.MkdirTemp("", "relaybench-")
	if err != nil {
		return nil, err
	}
	script := filepath.Join(dir, "update.sql")
	body := fmt.Sprintf("\\set id random(1, %d)\nUPDATE %s SET abalance = abalance + 1 WHERE id = :id;\n", n, pgbenchTable)
	if err := os.WriteFile(script, []byte(body), 0o644); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return &pgbench{bin: bin, url: srv.URL, script: script, dir: dir, db: db}, nil
}

func (p *pgbench) close() {
	os.RemoveAll(p.dir)
	_, _ = p.db.Exec(context.Background(), `DROP TABLE IF EXISTS `+pgbenchTable)
}

// run runs pgbench for -pgbench-time with clients and threads, after a
// checkpoint, and returns its tps. With async, its sessions run with
// synchronous_commit = off, as the relay's outcomes do with AsyncCommit.
func (p *pgbench) run(ctx context.Context, clients, threads int, async bool) (float64, error) {
	if _, err := p.db.Exec(ctx, "CHECKPOINT"); err != nil {
		return 0, err
	}
	secs := strconv.Itoa(max(int(pgbenchTime.Seconds()+0.5), 1))
	cmd := exec.CommandContext(ctx, p.bin, "-n", "-M", "prepared", "-f", p.script,
		"-c", strconv.Itoa(clients), "-j", strconv.Itoa(threads), "-T", secs, p.url)
	if async {
		cmd.Env = append(os.Environ(), "PGOPTIONS=-c synchronous_commit=off")
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("pgbench: %w\n%s", err, out)
	}
	m := tpsRE.FindSubmatch(out)
	if m == nil {
		return 0, fmt.Errorf("pgbench: no tps in its output:\n%s", out)
	}
	return strconv.ParseFloat(string(m[1]), 64)
}

// runRounds runs -repeat rounds, each of pgbench with 1 and 8 clients and then
// every drain scenario once, so that the noise of a shared machine falls on
// all of them alike. The table shows the medians.
func runRounds(ctx context.Context, srv *pgserver.Server, admin *pgxpool.Pool, drains []scenario) ([]line, error) {
	pb, err := newPgbench(ctx, srv, admin)
	if err != nil {
		return nil, err
	}
	defer pb.close()
	var c1, c1off, c8 []float64
	rates := make([][]float64, len(drains))
	for round := 1; round <= *repeat; round++ {
		t1, err := pb.run(ctx, 1, 1, false)
		if err != nil {
			return nil, err
		}
		t1off, err := pb.run(ctx, 1, 1, true)
		if err != nil {
			return nil, err
		}
		t8, err := pb.run(ctx, 8, 2, false)
		if err != nil {
			return nil, err
		}
		c1, c1off, c8 = append(c1, t1), append(c1off, t1off), append(c8, t8)
		progress := []string{fmt.Sprintf("pgbench c1 %.0f tps", t1), fmt.Sprintf("c1 async %.0f tps", t1off), fmt.Sprintf("c8 %.0f tps", t8)}
		for i, s := range drains {
			n := *rowsFlag
			if s.slow {
				n = *slowRows
			}
			rate, err := drainOnce(ctx, srv.URL, admin, s, n)
			if err != nil {
				return nil, fmt.Errorf("scenario %s: %w", s.name, err)
			}
			rates[i] = append(rates[i], rate)
			progress = append(progress, fmt.Sprintf("%s %.0f", s.name, rate))
		}
		fmt.Printf("round %d/%d: %s\n", round, *repeat, strings.Join(progress, ", "))
	}
	ref := refs{c1: benchkit.Median(c1), c1off: benchkit.Median(c1off), c8: benchkit.Median(c8)}
	lines := []line{
		{name: "pgbench -c 1 -j 1", rows: *rowsFlag, rate: ref.c1, runs: c1, ratioC1: 1, target: "reference"},
		{name: "pgbench -c 1, synchronous_commit=off", rows: *rowsFlag, rate: ref.c1off, runs: c1off, ratioC1: ref.c1off / ref.c1, target: "reference"},
		{name: "pgbench -c 8 -j 2", rows: *rowsFlag, rate: ref.c8, runs: c8, ratioC1: ref.c8 / ref.c1, ratioC8: 1, target: "reference"},
	}
	for i, s := range drains {
		lines = append(lines, drainLine(s, rates[i], ref))
	}
	return lines, nil
}

// pgbenchPath finds pgbench: next to the local server, in $PG_BIN, in the
// Debian layout (highest version first) or on PATH.
func pgbenchPath(srv *pgserver.Server) (string, error) {
	dirs := []string{srv.BinDir(), os.Getenv("PG_BIN")}
	debian, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Sort(sort.Reverse(sort.StringSlice(debian)))
	dirs = append(dirs, debian...)
	for _, d := range dirs {
		if d == "" {
			continue
		}
		if p := filepath.Join(d, "pgbench"); isExecutable(p) {
			return p, nil
		}
	}
	if p, err := exec.LookPath("pgbench"); err == nil {
		return p, nil
	}
	return "", errors.New("pgbench not found: install the PostgreSQL client (Debian: apt-get install -y postgresql) or set PG_BIN")
}

func isExecutable(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// ---- drain scenarios ----

const (
	benchTable = "relaybench_outbox"
	benchApp   = "relaybench"
	benchType  = "bench"
)

// sender does nothing, or waits delay as a destination answering in delay would.
type sender struct{ delay time.Duration }

func (s sender) Type() string { return benchType }

func (s sender) Send(ctx context.Context, _ relay.Message) error {
	if s.delay == 0 {
		return nil
	}
	t := time.NewTimer(s.delay)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// freshTable drops and recreates an outbox table and loads n rows into it with status.
func freshTable(ctx context.Context, db *pgxpool.Pool, table string, n int, status string) error {
	t := pgx.Identifier{table}.Sanitize()
	if _, err := db.Exec(ctx, `DROP TABLE IF EXISTS `+t); err != nil {
		return err
	}
	if err := relay.CreateTable(ctx, db, table); err != nil {
		return err
	}
	_, err := db.Exec(ctx, `INSERT INTO `+t+` (type, natural_key, payload, status, sent_at)
		SELECT $2, 'key-' || i, jsonb_build_object('n', i, 'text', repeat('x', 64)), $3,
		       CASE WHEN $3 = 'SENT' THEN now() END
		FROM generate_series(1, $1) i`, n, benchType, status)
	return err
}

func drainLine(s scenario, rates []float64, ref refs) line {
	n := *rowsFlag
	if s.slow {
		n = *slowRows
	}
	l := line{name: s.name, rows: n, rate: benchkit.Median(rates), runs: rates, target: "report"}
	if s.raw {
		l.target = "reference"
	}
	if ref.c1 > 0 {
		l.ratioC1 = l.rate / ref.c1
	}
	if ref.c1off > 0 && s.concurrency == 1 && s.sendDelay == 0 {
		l.ratioC1off = l.rate / ref.c1off
	}
	if s.concurrency > 1 && ref.c8 > 0 && s.sendDelay == 0 {
		l.ratioC8 = l.rate / ref.c8
	}
	if s.target != nil {
		var ok bool
		l.target, ok = s.target(l.rate, ref)
		l.status = "FAIL"
		if ok {
			l.status = "PASS"
		}
	}
	return l
}

func drainOnce(ctx context.Context, url string, admin *pgxpool.Pool, s scenario, n int) (float64, error) {
	var g grouped
	if s.rawGroup > 0 {
		var err error
		if g, err = captureGrouped(ctx, url, admin, s.rawGroup); err != nil {
			return 0, err
		}
	}
	if err := freshTable(ctx, admin, benchTable, n, "PENDING"); err != nil {
		return 0, err
	}
	if _, err := admin.Exec(ctx, "ANALYZE "+benchTable); err != nil {
		return 0, err
	}
	if _, err := admin.Exec(ctx, "CHECKPOINT"); err != nil {
		return 0, err
	}
	switch {
	case s.rawGroup > 0:
		return rawGrouped(ctx, url, g, n)
	case s.raw:
		return rawUpdates(ctx, url, s.concurrency, n, s.rawAsync)
	}
	// The clock starts at the relay's first statement.
	var firstAt atomic.Int64
	mark := func() { firstAt.CompareAndSwap(0, time.Now().UnixNano()) }
	first := &benchkit.Tracer{OnQuery: func(pgx.TraceQueryStartData) { mark() }, OnBatch: mark}
	pool, err := benchkit.Pool(ctx, url, "relaybench", int32(s.concurrency+2), benchkit.Traced(first))
	if err != nil {
		return 0, err
	}
	defer pool.Close()
	// Open the connections the drain will use before the clock starts.
	var conns []*pgxpool.Conn
	for range s.concurrency + 1 {
		c, err := pool.Acquire(ctx)
		if err != nil {
			return 0, err
		}
		conns = append(conns, c)
	}
	for _, c := range conns {
		c.Release()
	}
	firstAt.Store(0)

	obs := benchkit.NewDrainObserver(int64(n))
	cfg := relay.DefaultConfig()
	cfg.AppName = benchApp
	cfg.Table = benchTable
	cfg.Concurrency = s.concurrency
	cfg.BatchSize = s.batch
	cfg.GroupOutcomes = s.group
	cfg.AsyncCommit = !s.sync
	cfg.Logger = slog.New(slog.DiscardHandler)
	cfg.Observer = obs
	r, err := relay.New(pool, cfg, sender{delay: s.sendDelay})
	if err != nil {
		return 0, err
	}
	if err := benchkit.Drain(ctx, r, obs); err != nil {
		return 0, err
	}
	var sent int
	if err := admin.QueryRow(ctx, `SELECT count(*) FROM `+benchTable+` WHERE status = 'SENT'`).Scan(&sent); err != nil {
		return 0, err
	}
	if sent != n || obs.Failed.Load() != 0 {
		return 0, fmt.Errorf("%d rows SENT and %d failures, want %d and 0", sent, obs.Failed.Load(), n)
	}
	elapsed := time.Duration(obs.Last().UnixNano() - firstAt.Load())
	return float64(n) / elapsed.Seconds(), nil
}

// sentSQL is the statement the relay records a SENT outcome with, by default:
// one row by primary key, fenced on the status and attempts the pass read.
const sentSQL = `UPDATE ` + benchTable + ` SET status = 'SENT', sent_at = now(), updated_at = now()
WHERE id = $1 AND status = $2 AND attempts = $3`

// sentAsyncSQL is the statement the relay records a SENT outcome with under
// AsyncCommit (sql/outcomes.sql): synchronous_commit off for its own transaction.
const sentAsyncSQL = `UPDATE ` + benchTable + ` SET status = 'SENT', sent_at = now(), updated_at = now()
FROM (SELECT set_config('synchronous_commit', 'off', true)) AS async_commit
WHERE id = $1 AND status IS NOT DISTINCT FROM $2 AND attempts IS NOT DISTINCT FROM $3`

// rawUpdates marks rows 1..n SENT with the relay's own statement, one
// autocommit statement per row, from conns goroutines of plain pgx: the
// ceiling of a drain that records each outcome in its own transaction.
func rawUpdates(ctx context.Context, url string, conns, n int, async bool) (float64, error) {
	stmt := sentSQL
	if async {
		stmt = sentAsyncSQL
	}
	pool, err := benchkit.Pool(ctx, url, "relaybench", int32(conns))
	if err != nil {
		return 0, err
	}
	defer pool.Close()
	var minID int64
	if err := pool.QueryRow(ctx, `SELECT min(id) FROM `+benchTable).Scan(&minID); err != nil {
		return 0, err
	}
	for range 3 { // open the connections, prepare the statement
		if _, err := pool.Exec(ctx, stmt, 0, "PENDING", 0); err != nil {
			return 0, err
		}
	}
	var next atomic.Int64
	errs := make(chan error, conns)
	start := time.Now()
	var wg sync.WaitGroup
	for range conns {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(n) {
					return
				}
				tag, err := pool.Exec(ctx, stmt, minID+i, "PENDING", 0)
				if err == nil && tag.RowsAffected() != 1 {
					err = fmt.Errorf("row %d: %d rows updated", minID+i, tag.RowsAffected())
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	close(errs)
	if err := <-errs; err != nil {
		return 0, err
	}
	return float64(n) / elapsed.Seconds(), nil
}

// ---- guard: round trips and time of an empty pass ----

// tripCounter counts what the pool's connections send: statements (pgx's
// tracer: queries, batches, prepares) and, independently, the client's writes
// to the socket, each of which is one round trip's request (pgx writes a
// statement's messages, or a whole batch, in one write and then waits for the answer).
type tripCounter struct {
	benchkit.Tracer
	writes atomic.Int64
}

type counts struct{ queries, batches, prepares, writes int64 }

func (c *tripCounter) snapshot() counts {
	return counts{c.Queries.Load(), c.Batches.Load(), c.Prepares.Load(), c.writes.Load()}
}

func (a counts) minus(b counts) counts {
	return counts{a.queries - b.queries, a.batches - b.batches, a.prepares - b.prepares, a.writes - b.writes}
}

// countingConn counts the writes of one connection.
type countingConn struct {
	net.Conn
	c *tripCounter
}

func (cc countingConn) Write(p []byte) (int, error) {
	cc.c.writes.Add(1)
	return cc.Conn.Write(p)
}

// countingPool is a pool of 4 whose statements and socket writes tc counts.
func countingPool(ctx context.Context, url string, tc *tripCounter) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	pc.MaxConns = 4
	pc.ConnConfig.Tracer = tc
	dialer := &net.Dialer{KeepAlive: 5 * time.Minute}
	pc.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := dialer.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return countingConn{Conn: conn, c: tc}, nil
	}
	return pgxpool.NewWithConfig(ctx, pc)
}

func runGuard(ctx context.Context, url string, admin *pgxpool.Pool) error {
	const table = "relaybench_guard"
	if err := freshTable(ctx, admin, table, 0, "PENDING"); err != nil {
		return err
	}
	tc := &tripCounter{}
	pool, err := countingPool(ctx, url, tc)
	if err != nil {
		return err
	}
	defer pool.Close()
	cfg := relay.DefaultConfig()
	cfg.AppName = benchApp + "_guard"
	cfg.Table = table
	cfg.Logger = slog.New(slog.DiscardHandler)
	r, err := relay.New(pool, cfg, sender{})
	if err != nil {
		return err
	}

	direct := func() error { _, err := r.Run(ctx); return err }
	elected := func() error {
		ran, err := r.RunIfElected(ctx)
		if err == nil && !ran {
			err = errors.New("the elected pass coalesced")
		}
		return err
	}
	coalesced := func() error {
		ran, err := r.RunIfElected(ctx)
		if err == nil && ran {
			err = errors.New("the pass ran while another session held the lock")
		}
		return err
	}
	type result struct {
		name  string
		per   counts
		times []time.Duration
	}
	measure := func(name string, pass func() error) (result, error) {
		for range 20 { // warm up: connections open, statements prepared
			if err := pass(); err != nil {
				return result{}, err
			}
		}
		res := result{name: name, times: make([]time.Duration, 0, *guardPasses)}
		before := tc.snapshot()
		for range *guardPasses {
			start := time.Now()
			if err := pass(); err != nil {
				return result{}, err
			}
			res.times = append(res.times, time.Since(start))
		}
		d := tc.snapshot().minus(before)
		n := int64(*guardPasses)
		res.per = counts{d.queries / n, d.batches / n, d.prepares / n, d.writes / n}
		if d.queries%n != 0 || d.writes%n != 0 || d.batches%n != 0 || d.prepares%n != 0 {
			fmt.Printf("note: %s: counts not a multiple of the passes: %+v over %d passes\n", name, d, n)
		}
		return res, nil
	}
	var results []result
	for _, m := range []struct {
		name string
		pass func() error
	}{{"direct empty pass (Run)", direct}, {"elected empty pass (RunIfElected)", elected}} {
		res, err := measure(m.name, m.pass)
		if err != nil {
			return fmt.Errorf("%s: %w", m.name, err)
		}
		results = append(results, res)
	}
	// Another session holds the election, as another replica (or a JVM relay) would.
	holder, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer holder.Close(context.Background())
	var locked bool
	if err := holder.QueryRow(ctx, `SELECT pg_try_advisory_lock(hashtext($1))`, cfg.AppName+relay.LockKeySuffix).Scan(&locked); err != nil || !locked {
		return fmt.Errorf("hold the election from another session: locked=%v err=%v", locked, err)
	}
	res, err := measure("coalesced pass (RunIfElected, lock held elsewhere)", coalesced)
	if err != nil {
		return err
	}
	results = append(results, res)
	if _, err := holder.Exec(ctx, `SELECT pg_advisory_unlock(hashtext($1))`, cfg.AppName+relay.LockKeySuffix); err != nil {
		return err
	}

	fmt.Printf("\nguard: round trips and time of an empty pass (%d passes each, after 20 of warm-up)\n", *guardPasses)
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "pass\tround trips (socket writes)\tstatements\tbatches\tprepares\tmedian\tp90\t")
	for _, r := range results {
		med, p90 := benchkit.Quantile(r.times, 0.5), benchkit.Quantile(r.times, 0.9)
		fmt.Fprintf(w, "%s\t%d\t%d\t%d\t%d\t%s\t%s\t\n", r.name, r.per.writes, r.per.queries, r.per.batches, r.per.prepares,
			med.Round(time.Microsecond), p90.Round(time.Microsecond))
	}
	w.Flush()
	d, e, c := results[0], results[1], results[2]
	extra := e.per.writes - d.per.writes
	verdict := func(ok bool) string {
		if ok {
			return "PASS"
		}
		return "FAIL"
	}
	fmt.Printf("guard: elected − direct = %d round trips, %s (target ≤ 2: %s); coalesced = %d round trip(s), %s (target 1: %s)\n",
		extra, (benchkit.Quantile(e.times, 0.5) - benchkit.Quantile(d.times, 0.5)).Round(time.Microsecond), verdict(extra <= 2),
		c.per.writes, benchkit.Quantile(c.times, 0.5).Round(time.Microsecond), verdict(c.per.writes == 1))
	_, err = admin.Exec(ctx, `DROP TABLE IF EXISTS `+table)
	return err
}

// ---- history: an empty pass at 10,000 vs millions of SENT rows ----

// fetchCapture keeps the last statement that starts with SELECT and its arguments: the pass's fetch.
type fetchCapture struct {
	benchkit.Tracer
	mu   sync.Mutex
	sql  string
	args []any
}

// newFetchCapture returns a fetchCapture, tracing.
func newFetchCapture() *fetchCapture {
	f := &fetchCapture{}
	f.OnQuery = func(d pgx.TraceQueryStartData) {
		if strings.HasPrefix(strings.TrimSpace(d.SQL), "SELECT") {
			f.mu.Lock()
			f.sql, f.args = d.SQL, slices.Clone(d.Args)
			f.mu.Unlock()
		}
	}
	return f
}

func runHistory(ctx context.Context, url string, admin *pgxpool.Pool) error {
	small, large := 10_000, *historyRows
	tables := []struct {
		name string
		rows int
	}{{"relaybench_history_small", small}, {"relaybench_history_large", large}}
	fmt.Printf("\nhistory: loading %d and %d SENT rows…\n", small, large)
	for _, t := range tables {
		start := time.Now()
		if err := freshTable(ctx, admin, t.name, t.rows, "SENT"); err != nil {
			return err
		}
		if _, err := admin.Exec(ctx, "VACUUM ANALYZE "+t.name); err != nil {
			return err
		}
		var size string
		_ = admin.QueryRow(ctx, `SELECT pg_size_pretty(pg_total_relation_size($1::regclass))`, t.name).Scan(&size)
		fmt.Printf("history: %s: %d rows, %s with indexes, loaded and vacuumed in %.1fs\n", t.name, t.rows, size, time.Since(start).Seconds())
	}
	capture := newFetchCapture()
	type target struct {
		relay *relay.Relay
		times []time.Duration
	}
	var targets []*target
	for _, t := range tables {
		pool, err := benchkit.Pool(ctx, url, "relaybench", 4, benchkit.Traced(capture))
		if err != nil {
			return err
		}
		defer pool.Close()
		cfg := relay.DefaultConfig()
		cfg.AppName = benchApp + "_history"
		cfg.Table = t.name
		cfg.Logger = slog.New(slog.DiscardHandler)
		r, err := relay.New(pool, cfg, sender{})
		if err != nil {
			return err
		}
		targets = append(targets, &target{relay: r})
	}
	// Interleaved, so that the machine's noise falls on both alike.
	for i := range *guardPasses + 20 {
		for _, t := range targets {
			start := time.Now()
			n, err := t.relay.Run(ctx)
			if err != nil {
				return err
			}
			if n != 0 {
				return fmt.Errorf("an empty pass processed %d rows", n)
			}
			if i >= 20 {
				t.times = append(t.times, time.Since(start))
			}
		}
	}
	ms, ml := benchkit.Quantile(targets[0].times, 0.5), benchkit.Quantile(targets[1].times, 0.5)
	ratio := float64(ml) / float64(ms)
	verdict := "FAIL"
	if ratio <= 1.5 {
		verdict = "PASS"
	}
	fmt.Printf("history: empty pass (Run, default config), median of %d: %s at %d SENT rows, %s at %d SENT rows: ratio %.2f (target ≤ 1.5: %s)\n",
		*guardPasses, ms.Round(time.Microsecond), small, ml.Round(time.Microsecond), large, ratio, verdict)

	// The plan of the very statement the pass sent, with its arguments: the
	// custom plan the first executions use, and the generic plan a prepared
	// statement may switch to.
	capture.mu.Lock()
	sql, args := capture.sql, capture.args
	capture.mu.Unlock()
	largeSQL := sql // the last pass read the large table
	conn, err := admin.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	explain := func(label, q string, args ...any) error {
		rows, err := conn.Query(ctx, q, args...)
		if err != nil {
			return err
		}
		plan, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return err
		}
		fmt.Printf("history: plan of the fetch at %d SENT rows (%s):\n", large, label)
		for _, l := range plan {
			fmt.Println("    " + l)
		}
		return nil
	}
	if err := explain("custom plan, EXPLAIN ANALYZE with the pass's arguments",
		"EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) "+largeSQL, args...); err != nil {
		return err
	}
	placeholders := make([]string, len(args))
	for i := range args {
		placeholders[i] = fmt.Sprintf("$%d", i+1)
	}
	if _, err := conn.Exec(ctx, "PREPARE relaybench_fetch AS "+largeSQL, pgx.QueryExecModeSimpleProtocol); err != nil {
		return err
	}
	defer conn.Exec(context.Background(), "DEALLOCATE relaybench_fetch")
	if _, err := conn.Exec(ctx, "SET plan_cache_mode = force_generic_plan"); err != nil {
		return err
	}
	defer conn.Exec(context.Background(), "RESET plan_cache_mode")
	if err := explain("generic plan, EXPLAIN ANALYZE EXECUTE with plan_cache_mode = force_generic_plan",
		"EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) EXECUTE relaybench_fetch("+strings.Join(placeholders, ", ")+")",
		append([]any{pgx.QueryExecModeSimpleProtocol}, args...)...); err != nil {
		return err
	}
	if err := backlogFetch(ctx, admin, largeSQL, args, tables[0].name, tables[1].name); err != nil {
		return err
	}
	for _, t := range tables {
		if _, err := admin.Exec(ctx, "DROP TABLE IF EXISTS "+t.name); err != nil {
			return err
		}
	}
	return nil
}

// backlogFetchRows is the backlog backlogFetch adds to both history tables.
const backlogFetchRows = 20_000

// backlogFetch times the pass's fetch of a full batch once a backlog of
// PENDING rows sits on top of each history (informative, no target): the
// fetch should cost the same over both histories, whatever the backlog costs.
func backlogFetch(ctx context.Context, db *pgxpool.Pool, largeSQL string, args []any, small, large string) error {
	sqlOf := map[string]string{large: largeSQL, small: strings.ReplaceAll(largeSQL, large, small)}
	for _, t := range []string{small, large} {
		if _, err := db.Exec(ctx, `INSERT INTO `+t+` (type, natural_key, payload)
			SELECT $2, 'live-' || i, jsonb_build_object('n', i, 'text', repeat('x', 64)) FROM generate_series(1, $1) i`,
			backlogFetchRows, benchType); err != nil {
			return err
		}
		if _, err := db.Exec(ctx, "ANALYZE "+t); err != nil {
			return err
		}
	}
	times := map[string][]time.Duration{}
	for i := range 70 {
		for _, t := range []string{small, large} {
			start := time.Now()
			rows, err := db.Query(ctx, sqlOf[t], args...)
			if err != nil {
				return err
			}
			n := 0
			for rows.Next() {
				n++
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				return err
			}
			if want := args[2]; fmt.Sprint(n) != fmt.Sprint(want) {
				return fmt.Errorf("the fetch returned %d rows, want %v", n, want)
			}
			if i >= 20 {
				times[t] = append(times[t], time.Since(start))
			}
		}
	}
	ms, ml := benchkit.Quantile(times[small], 0.5), benchkit.Quantile(times[large], 0.5)
	fmt.Printf("history: fetch of a full batch with %d PENDING rows on top (informative), median of 50: %s over the small history, %s over the large one: ratio %.2f\n",
		backlogFetchRows, ms.Round(time.Microsecond), ml.Round(time.Microsecond), float64(ml)/float64(ms))
	rows, err := db.Query(ctx, "EXPLAIN (ANALYZE, COSTS OFF) "+largeSQL, args...)
	if err != nil {
		return err
	}
	plan, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return err
	}
	fmt.Println("history: its plan over the large history (scans, joins, time):")
	for _, l := range plan {
		if t := strings.TrimSpace(l); strings.Contains(t, "Scan") || strings.Contains(t, "Join") || strings.HasPrefix(t, "Execution") {
			fmt.Println("    " + l)
		}
	}
	return nil
}
