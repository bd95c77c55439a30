package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/xadm/relay"
	"github.com/xadm/relay/internal/tools/diagnose"
)

// sampleDefault is how long status waits between its two looks: long enough
// for a relay with the default Interval (1s) to run a pass.
const sampleDefault = 2 * time.Second

// timeoutDefault bounds a whole status call, both looks and the wait between
// them: a pager's check answers UNKNOWN within it, never hangs (a table
// locked by a migration, a server that accepts and never answers).
const timeoutDefault = 10 * time.Second

// The environment variables of status's thresholds and bound (the flags
// override them).
const (
	envWarning  = "RELAY_STATUS_WARNING"
	envCritical = "RELAY_STATUS_CRITICAL"
	envTimeout  = "RELAY_STATUS_TIMEOUT"
)

func statusFlags(fs *flag.FlagSet, o *opts) {
	fs.DurationVar(&o.sample, "sample", sampleDefault,
		"look twice, this far apart, to tell whether rows move and the lag grows; 0 looks once")
	fs.DurationVar(&o.stallAfter, "stall-after", diagnose.StallAfterDefault,
		"a row waiting longer than this, without moving, means delivery is stalled")
	for _, name := range []string{"w", "warning"} {
		fs.Var(&o.warning, name, fmt.Sprintf("WARNING when a type's oldest message not yet delivered is older than this: 5m, or TYPE=5m for "+
			"one type (repeatable, or comma-separated; default $%s, else %s)", envWarning, diagnose.Duration(diagnose.WarningDefault)))
	}
	for _, name := range []string{"c", "critical"} {
		fs.Var(&o.critical, name, fmt.Sprintf("CRITICAL when it is older than this: 15m, or TYPE=15m (default $%s, else %s)",
			envCritical, diagnose.Duration(diagnose.CriticalDefault)))
	}
	fs.DurationVar(&o.timeout, "timeout", 0, fmt.Sprintf("answer UNKNOWN (exit 3) if the database has not answered within this, "+
		"waits for locks included (default $%s, else %s)", envTimeout, timeoutDefault))
}

// thresholdFlag is -w or -c: a default ("5m") and per-type values
// ("order=1m"), repeatable and comma-separated.
type thresholdFlag struct {
	def     time.Duration
	perType map[string]time.Duration
	set     bool
}

func (f *thresholdFlag) String() string {
	if f == nil || !f.set {
		return ""
	}
	var parts []string
	if f.def > 0 {
		parts = append(parts, f.def.String())
	}
	for t, d := range f.perType {
		parts = append(parts, t+"="+d.String())
	}
	return strings.Join(parts, ",")
}

func (f *thresholdFlag) Set(v string) error {
	for _, part := range strings.Split(v, ",") {
		part = strings.TrimSpace(part)
		typ, age, typed := strings.Cut(part, "=")
		if !typed {
			age = typ
		}
		d, err := time.ParseDuration(strings.TrimSpace(age))
		if err != nil || d <= 0 {
			return fmt.Errorf("%q is not an age: use a positive duration (5m, 90s), or TYPE=5m for one type", part)
		}
		f.set = true
		if !typed {
			f.def = d
			continue
		}
		typ = strings.TrimSpace(typ)
		if msg := checkText(typ); msg != "" {
			return fmt.Errorf("%q: the type %s", part, msg)
		}
		if f.perType == nil {
			f.perType = map[string]time.Duration{}
		}
		f.perType[typ] = d
	}
	return nil
}

// thresholds are the flags' thresholds over the environment's.
func (e *env) thresholds() (diagnose.Thresholds, error) {
	var th diagnose.Thresholds
	th.PerType = map[string]diagnose.Threshold{}
	for _, x := range []struct {
		name string
		flag *thresholdFlag
		crit bool
	}{{envWarning, &e.o.warning, false}, {envCritical, &e.o.critical, true}} {
		var merged thresholdFlag
		if v := strings.TrimSpace(os.Getenv(x.name)); v != "" {
			if err := merged.Set(v); err != nil {
				return th, fmt.Errorf("%s: %w", x.name, err)
			}
		}
		if x.flag.set {
			if x.flag.def > 0 {
				merged.def = x.flag.def
			}
			for t, d := range x.flag.perType {
				if merged.perType == nil {
					merged.perType = map[string]time.Duration{}
				}
				merged.perType[t] = d
			}
		}
		if x.crit {
			th.Critical = merged.def
		} else {
			th.Warning = merged.def
		}
		for t, d := range merged.perType {
			o := th.PerType[t]
			if x.crit {
				o.Critical = d
			} else {
				o.Warning = d
			}
			th.PerType[t] = o
		}
	}
	if w, c := th.For(""); w > c {
		return th, fmt.Errorf("the warning threshold (%s) is above the critical one (%s)", w, c)
	}
	for t := range th.PerType {
		if w, c := th.For(t); w > c {
			return th, fmt.Errorf("type %q: the warning threshold (%s) is above the critical one (%s)", t, w, c)
		}
	}
	return th, nil
}

// statusTimeout is --timeout, else $RELAY_STATUS_TIMEOUT, else the default.
func (e *env) statusTimeout() (time.Duration, error) {
	if e.o.timeout != 0 {
		return e.o.timeout, nil
	}
	if v := strings.TrimSpace(os.Getenv(envTimeout)); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			return 0, fmt.Errorf("%s=%q is not a positive duration (10s)", envTimeout, v)
		}
		return d, nil
	}
	return timeoutDefault, nil
}

// lookStep names what a look waits on, for an UNKNOWN that says it.
type lookStep struct {
	what string
	err  error
}

func (s *lookStep) Error() string { return s.what + ": " + s.err.Error() }
func (s *lookStep) Unwrap() error { return s.err }

// look reads the table and the election once.
func look(ctx context.Context, a *relay.Admin) (diagnose.Look, error) {
	step := func(what string, err error) error { return &lookStep{what: what, err: err} }
	o, err := a.Overview(ctx)
	if err != nil {
		return diagnose.Look{}, step("reading the rows of "+a.Table(), err)
	}
	h, err := a.Election(ctx)
	if err != nil {
		return diagnose.Look{}, step("reading who holds the election", err)
	}
	reps, err := a.Replicas(ctx)
	if err != nil {
		return diagnose.Look{}, step("reading the live relays", err)
	}
	var types []string
	for _, t := range append(o.Types, o.OtherApps...) {
		types = append(types, t.Type)
	}
	others, err := a.OtherReplicas(ctx, types...)
	if err != nil {
		return diagnose.Look{}, step("reading the other apps' relays", err)
	}
	return diagnose.Look{Overview: o, Holders: h, Replicas: reps, PresenceKnown: true, Others: others}, nil
}

func runStatus(ctx context.Context, e *env) int {
	if e.o.sample < 0 || e.o.sample > time.Minute {
		return e.usageErr("--sample must be between 0 and 1m, got %s", e.o.sample)
	}
	if e.o.stallAfter <= 0 {
		return e.usageErr("--stall-after must be positive, got %s", e.o.stallAfter)
	}
	th, err := e.thresholds()
	if err != nil {
		return e.usageErr("status: %v", err)
	}
	timeout, err := e.statusTimeout()
	if err != nil {
		return e.usageErr("status: %v", err)
	}
	if e.o.sample >= timeout {
		return e.usageErr("status: --sample (%s) must be shorter than --timeout (%s)", e.o.sample, timeout)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	in := diagnose.Input{StallAfter: e.o.stallAfter, Thresholds: th}
	first, err := look(ctx, e.admin)
	if err != nil {
		return e.unknown(ctx, timeout, err)
	}
	in.Now = first
	if e.o.sample > 0 {
		select {
		case <-time.After(e.o.sample):
		case <-ctx.Done():
			return e.unknown(ctx, timeout, &lookStep{what: "waiting between the two looks", err: context.Cause(ctx)})
		}
		second, err := look(ctx, e.admin)
		if err != nil {
			return e.unknown(ctx, timeout, err)
		}
		in.Before, in.Now = &first, second
	}
	d := diagnose.Diagnose(in)

	if e.o.json {
		if err := writeJSON(e.stdout, statusJSON(in.Now, d, th)); err != nil {
			return e.fail(err)
		}
	} else {
		printStatus(e, in.Now, d, th)
	}
	e.judged = true
	return stateCode(d.State)
}

// unknown says, as a pager's first line, that status could not look and
// what it waited on, with the details on stderr, and returns UNKNOWN.
func (e *env) unknown(ctx context.Context, timeout time.Duration, err error) int {
	what := "reading the database"
	var st *lookStep
	if errors.As(err, &st) {
		what = st.what
	}
	line := "UNKNOWN: " + what + ": " + oneLine(err.Error(), 200)
	var pgErr *pgconn.PgError
	var connErr *pgconn.ConnectError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == "55P03": // lock_not_available
		line = fmt.Sprintf("UNKNOWN: %s is locked: waited %s for it while %s", e.cfg.Table, lockTimeout(timeout), what)
		if holders := e.lockHolders(); holders != "" {
			line = fmt.Sprintf("UNKNOWN: %s is locked: waited %s for it; %s", e.cfg.Table, lockTimeout(timeout), holders)
		}
	case errors.As(err, &pgErr) && pgErr.Code == "57014": // query_canceled: statement_timeout
		line = fmt.Sprintf("UNKNOWN: the server did not answer within %s while %s", timeout, what)
	case errors.As(err, &connErr) && (errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil):
		line = fmt.Sprintf("UNKNOWN: no answer within %s while connecting to the database", timeout)
	case errors.As(err, &connErr):
		line = "UNKNOWN: cannot connect to the database: " + oneLine(connErr.Unwrap().Error(), 200)
	case ctx.Err() != nil || errors.Is(err, context.DeadlineExceeded):
		line = fmt.Sprintf("UNKNOWN: no answer within %s while %s", timeout, what)
	case errors.As(err, &pgErr) && pgErr.Code == "42P01": // undefined_table
		line = fmt.Sprintf("UNKNOWN: table %s does not exist (RELAY_TABLE, --table; schema.table off the search_path)", e.cfg.Table)
	}
	line = diagnose.Cut(line, diagnose.FirstLineMax-1)
	if e.o.json {
		_ = writeJSON(e.stdout, map[string]any{"state": diagnose.StateUnknown, "exit_code": statusUnknown, "first_line": line,
			"waited_on": what, "error": err.Error()})
	} else {
		fprintf(e.stdout, "%s\n", strings.ReplaceAll(line, "|", "/"))
	}
	fprintf(e.stderr, "relayctl status: %s: %v\n", what, err)
	return statusUnknown
}

// lockHolders names, in a few words, the sessions that hold or wait for an
// ACCESS EXCLUSIVE lock on the table, read under a short deadline of its own.
func (e *env) lockHolders() string {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	locks, err := e.admin.TableLocks(ctx)
	if err != nil || len(locks) == 0 {
		return ""
	}
	l := locks[0]
	verb := "held by"
	if !l.Granted {
		verb = "queued behind"
	}
	who := fmt.Sprintf("pid %d", l.PID)
	if l.ApplicationName != "" {
		who += fmt.Sprintf(" (%s)", l.ApplicationName)
	}
	if !l.XactStart.IsZero() {
		who += " for " + diagnose.Duration(l.At.Sub(l.XactStart))
	}
	return fmt.Sprintf("ACCESS EXCLUSIVE %s %s", verb, who)
}

// lockTimeout is how long a statement of status waits for a lock: a third
// of its whole bound, at most 3s.
func lockTimeout(timeout time.Duration) time.Duration { return min(3*time.Second, timeout/3) }

// stateCode is the exit code of a pager's state, as Nagios reads it.
func stateCode(state string) int {
	switch state {
	case diagnose.StateOK:
		return statusOK
	case diagnose.StateWarning:
		return statusWarning
	case diagnose.StateCritical:
		return statusCritical
	}
	return statusUnknown
}

type jsonStatus struct {
	App             string          `json:"app"`
	Table           string          `json:"table"`
	MaxAttempts     int             `json:"max_attempts"`
	At              time.Time       `json:"at"`
	FirstLine       string          `json:"first_line"`
	Verdict         string          `json:"verdict"`
	State           string          `json:"state"`
	ExitCode        int             `json:"exit_code"`
	Cause           string          `json:"cause"`
	Summary         string          `json:"summary"`
	Trend           string          `json:"trend,omitempty"`
	Waiting         int64           `json:"waiting"`
	Pending         int64           `json:"pending"`
	Retrying        int64           `json:"retrying"`
	Backoff         int64           `json:"backoff"`
	Dead            int64           `json:"dead"`
	Sent            int64           `json:"sent"`
	SentEstimated   bool            `json:"sent_estimated"`
	LagSeconds      float64         `json:"lag_seconds"`
	AgeSeconds      float64         `json:"age_seconds"` // the oldest message not yet delivered, whatever it waits for
	Thresholds      jsonThresholds  `json:"thresholds"`
	InRecovery      bool            `json:"in_recovery"`
	DefaultReadOnly bool            `json:"default_read_only"`
	Types           []jsonType      `json:"types"`
	OtherAppTypes   []jsonOtherType `json:"other_app_types"`
	Election        []jsonHolder    `json:"election"`
	Replicas        []jsonReplica   `json:"replicas"`
	OtherApps       []jsonReplica   `json:"other_apps"`
	MissingIndexes  []jsonIndex     `json:"missing_indexes"`
	Perfdata        []string        `json:"perfdata"`
}

type jsonThresholds struct {
	WarningSeconds  float64                  `json:"warning_seconds"`
	CriticalSeconds float64                  `json:"critical_seconds"`
	PerType         map[string]jsonThreshold `json:"per_type,omitempty"`
}

type jsonThreshold struct {
	WarningSeconds  float64 `json:"warning_seconds"`
	CriticalSeconds float64 `json:"critical_seconds"`
}

// jsonOtherType is another app's type, not counted.
type jsonOtherType struct {
	Type    string `json:"type"`
	App     string `json:"app"`
	Waiting int64  `json:"waiting"`
	Dead    int64  `json:"dead"`
}

type jsonIndex struct {
	Name      string `json:"name"`
	Statement string `json:"statement"`
}

func statusJSON(l diagnose.Look, d diagnose.Diagnosis, th diagnose.Thresholds) jsonStatus {
	o := l.Overview
	s := jsonStatus{App: o.AppName, Table: o.Table, MaxAttempts: o.MaxAttempts, At: o.At.UTC(), FirstLine: d.FirstLine(),
		Verdict: string(d.Verdict), State: d.State, ExitCode: stateCode(d.State), Cause: d.Cause, Summary: d.Summary, Trend: d.Trend,
		Waiting: d.Waiting, Pending: o.Pending, Retrying: o.Retrying, Backoff: o.Backoff, Dead: o.Dead,
		Sent: o.Sent, SentEstimated: o.SentEstimated, LagSeconds: d.Lag.Seconds(), AgeSeconds: d.Age.Seconds(),
		InRecovery: o.InRecovery, DefaultReadOnly: o.DefaultReadOnly,
		Types: make([]jsonType, 0, len(o.Types)), OtherAppTypes: []jsonOtherType{}, Election: holdersJSON(l.Holders),
		Replicas: replicasJSON(l.Replicas), OtherApps: replicasJSON(l.Others), MissingIndexes: []jsonIndex{}, Perfdata: d.Perfdata()}
	w, c := th.For("")
	s.Thresholds = jsonThresholds{WarningSeconds: w.Seconds(), CriticalSeconds: c.Seconds()}
	for t := range th.PerType {
		if s.Thresholds.PerType == nil {
			s.Thresholds.PerType = map[string]jsonThreshold{}
		}
		w, c := th.For(t)
		s.Thresholds.PerType[t] = jsonThreshold{w.Seconds(), c.Seconds()}
	}
	for _, m := range o.MissingIndexes {
		s.MissingIndexes = append(s.MissingIndexes, jsonIndex{m.Name, m.Statement})
	}
	states := map[string]diagnose.TypeState{}
	for _, ts := range d.Types {
		states[ts.Type] = ts
	}
	for _, t := range o.Types {
		ts, ok := states[t.Type]
		if !ok {
			continue // another app's, by the other apps' live relays
		}
		jt := jsonType{Type: t.Type, App: t.App, State: ts.State, Cause: ts.Cause, Pending: t.Pending, Retrying: t.Retrying, Backoff: t.Backoff,
			NextRetry: timePtr(t.NextRetry), Dead: t.Dead, LagSeconds: t.Lag.Seconds(), AgeSeconds: ts.Age.Seconds(),
			WarningSeconds: ts.Warning.Seconds(), CriticalSeconds: ts.Critical.Seconds(), Paused: ts.Paused, Stuck: ts.Stuck,
			Next: headJSON(t.Next), Oldest: headJSON(t.Oldest), Undelivered: headJSON(t.Undelivered), FirstDead: headJSON(t.FirstDead)}
		if !o.SentEstimated {
			sent := t.Sent
			jt.Sent = &sent
		}
		s.Types = append(s.Types, jt)
	}
	for _, t := range otherTypes(l, d) {
		s.OtherAppTypes = append(s.OtherAppTypes, jsonOtherType{Type: t.Type, App: t.App, Waiting: t.Pending + t.Retrying, Dead: t.Dead})
	}
	return s
}

// otherTypes are the types of l that are another app's: the Overview's
// OtherApps, and those the diagnosis left out (another app's live relays
// deliver them).
func otherTypes(l diagnose.Look, d diagnose.Diagnosis) []relay.TypeOverview {
	out := slices.Clone(l.Overview.OtherApps)
	counted := map[string]bool{}
	for _, ts := range d.Types {
		counted[ts.Type] = true
	}
	for _, t := range l.Overview.Types {
		if !counted[t.Type] {
			for _, r := range l.Others {
				if r.Delivers(t.Type) {
					t.App = r.App
				}
			}
			out = append(out, t)
		}
	}
	return out
}

func printStatus(e *env, l diagnose.Look, d diagnose.Diagnosis, th diagnose.Thresholds) {
	o := l.Overview
	w := e.stdout
	fprintf(w, "%s\n", d.FirstLine())
	warn, crit := th.For("")
	fprintf(w, "app %s, table %s, MaxAttempts %d, database clock %s; WARNING past %s undelivered, CRITICAL past %s%s\n\n",
		o.AppName, o.Table, o.MaxAttempts, stamp(o.At), diagnose.Duration(warn), diagnose.Duration(crit), perTypeText(th))

	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fprintf(tw, "type\tstate\tpending\tretrying\tof which in backoff\tdead\tsent\tundelivered for\tbehind\tcause\n")
	sent := func(n int64) string {
		if o.SentEstimated {
			return "-"
		}
		return num(n)
	}
	states := map[string]diagnose.TypeState{}
	for _, ts := range d.Types {
		states[ts.Type] = ts
	}
	for _, t := range o.Types {
		ts, ok := states[t.Type]
		if !ok {
			continue
		}
		age, lag, cause := "-", "-", ts.Cause
		if t.Undelivered != nil {
			age = diagnose.Duration(ts.Age)
		}
		if t.Oldest != nil {
			lag = diagnose.Duration(t.Lag)
		}
		if cause == "" {
			cause = "-"
		}
		fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", t.Type, ts.State, num(t.Pending), num(t.Retrying), num(t.Backoff),
			num(t.Dead), sent(t.Sent), age, lag, cause)
	}
	total := num(o.Sent)
	if o.SentEstimated {
		total = "~" + total
	}
	age, lag := "-", "-"
	if d.Waiting > 0 {
		age, lag = diagnose.Duration(d.Age), diagnose.Duration(d.Lag)
	}
	fprintf(tw, "all types\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", d.State, num(o.Pending), num(o.Retrying), num(o.Backoff), num(o.Dead), total, age, lag)
	_ = tw.Flush()
	if o.SentEstimated {
		fprintf(w, "(~: the SENT rows are the planner's estimate on a table this large, every app's; they are not counted)\n")
	}
	fprintf(w, "(retrying: failed rows still retried, \"of which in backoff\" those not due yet; undelivered for: the oldest message "+
		"not yet delivered, whatever it waits for, since it was written or re-queued; behind: how long the relays have kept one "+
		"waiting, rows in a backoff or a paused type aside)\n")
	for _, t := range otherTypes(l, d) {
		app := t.App
		if app == "" {
			app = "?"
		}
		fprintf(w, "not counted: %q, app %q's: %s waiting, %s dead\n", t.Type, app, num(t.Pending+t.Retrying), num(t.Dead))
	}
	fprintf(w, "\n%s: %s\n", strings.ToUpper(string(d.Verdict)), oneLine(d.Lead, 100000))
	for _, n := range d.Notes {
		fprintf(w, "  %s\n", oneLine(n, 100000))
	}
	for _, t := range o.Types {
		if h := t.FirstDead; h != nil && states[t.Type].Type != "" {
			fprintf(w, "dead:     %s: %s row(s), the first (id %d) %s\n", t.Type, num(t.Dead), h.ID, diagnose.Died(*h, o.MaxAttempts))
		}
	}
	fprintf(w, "\n")

	printElection(e, o.AppName, l.Holders)
	printReplicas(e, o.AppName, l.Replicas)
	for _, r := range l.Others {
		fprintf(w, "other app: %s serves %s here: %s\n", appName(r), quoted(r.Types), diagnose.Replica(r))
	}
	server := "accepts writes"
	switch {
	case o.InRecovery:
		server = "READ-ONLY: a standby in recovery"
	case o.DefaultReadOnly:
		server = "READ-ONLY for this role: default_transaction_read_only is on"
	}
	fprintf(w, "server:   %s\n", server)
	var last *relay.RetentionRun
	var by string
	for _, r := range l.Replicas {
		if x := r.Retention; x != nil && (last == nil || x.At.After(last.At)) {
			last, by = x, r.ID
		}
	}
	switch {
	case last == nil:
		fprintf(w, "retention: no live relay of the app has run the retention job (Config.Retention, RELAY_RETENTION: off by default)\n")
	case last.Err != "":
		fprintf(w, "retention: the last run (%s, replica %s) FAILED: %s\n", stamp(last.At), by, last.Err)
	default:
		fprintf(w, "retention: the last run (%s, replica %s) deleted %s SENT row(s) delivered over %s ago in %s; %s by that replica since it started\n",
			stamp(last.At), by, num(last.Deleted), diagnose.Duration(last.Age), diagnose.Duration(last.Took), num(last.Total))
	}
	if len(o.MissingIndexes) == 0 {
		fprintf(w, "indexes:  the relay's indexes are all there\n")
	} else {
		fprintf(w, "indexes:  MISSING %d of the relay's indexes; add them with:\n", len(o.MissingIndexes))
		for _, m := range o.MissingIndexes {
			fprintf(w, "  %s\n", m.Statement)
		}
	}
	if d.Trend != "" {
		fprintf(w, "trend:    the relays' lag is %s\n", d.Trend)
	}
	if p := d.Perfdata(); len(p) > 0 {
		fprintf(w, "| %s\n", strings.Join(p, " "))
	}
}

// perTypeText says the per-type thresholds, "" when there are none.
func perTypeText(th diagnose.Thresholds) string {
	var parts []string
	for t := range th.PerType {
		w, c := th.For(t)
		parts = append(parts, fmt.Sprintf("%s %s/%s", t, diagnose.Duration(w), diagnose.Duration(c)))
	}
	if len(parts) == 0 {
		return ""
	}
	slices.Sort(parts)
	return " (" + strings.Join(parts, ", ") + ")"
}

// printElection writes who holds the election, one line each.
func printElection(e *env, app string, hs []relay.LockHolder) {
	key := app + relay.LockKeySuffix
	if len(hs) == 0 {
		fprintf(e.stdout, "election: %s is free: nobody holds it right now (normal between passes)\n", key)
		return
	}
	for _, h := range hs {
		verb := "held by"
		if !h.Granted {
			verb = "waited for by"
		}
		fprintf(e.stdout, "election: %s %s %s %s\n", h.Key, h.Mode, verb, diagnose.Holder(h))
	}
}

// printReplicas writes the app's live relays, one line each.
func printReplicas(e *env, app string, reps []relay.Replica) {
	if len(reps) == 0 {
		fprintf(e.stdout, "replicas: no relay of app %q is running (none holds its presence)\n", app)
		return
	}
	fprintf(e.stdout, "replicas: %d relay(s) of app %q running:\n", len(reps), app)
	for _, r := range reps {
		fprintf(e.stdout, "  %s\n", diagnose.Replica(r))
	}
}

// appName names a relay's app, "app ?" when its session cannot be read.
func appName(r relay.Replica) string {
	if r.App == "" {
		return "app ? (grant pg_read_all_stats to read it)"
	}
	return fmt.Sprintf("app %q", r.App)
}

func quoted(ss []string) string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = fmt.Sprintf("%q", s)
	}
	if len(q) == 0 {
		return "types it does not name"
	}
	return strings.Join(q, ", ")
}
