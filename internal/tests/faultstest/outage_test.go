package faultstest_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/bits"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/xadm/relay"
	"github.com/xadm/relay/internal/testkit/pgserver"
	"github.com/xadm/relay/internal/testkit/testlog"
)

// TestMain starts a server of this package's own: never the one named by an
// environment variable, which the tests could not halt, and never one shared
// with another package. After the tests it checks no goroutine was left behind.
func TestMain(m *testing.M) { os.Exit(pgserver.Run(m, "")) }

// server is this package's own PostgreSQL, which its tests halt and resume.
func server() *pgserver.Server { return pgserver.Shared() }

// requireLocal skips a test that halts the server when pgserver gave a
// container (a Docker engine answered): only a local cluster can be halted.
func requireLocal(t *testing.T) {
	t.Helper()
	if !server().Local() {
		t.Skipf("halting the server needs a local PostgreSQL cluster; pgserver started a %q one "+
			"(a Docker engine answered): run without Docker to exercise the outage", server().Kind)
	}
}

// ignoreServer are the goroutines of the server's own process, which Halt
// ends and Resume starts anew.
var ignoreServer = []goleak.Option{
	goleak.IgnoreAnyFunction("github.com/xadm/relay/internal/testkit/pgserver.(*child).wait"),
	goleak.IgnoreAnyFunction("os/exec.(*Cmd).watchCtx"),
}

// world is one test's table and pools.
type world struct {
	name  string        // table, app and application_name of the relay's pool
	pool  *pgxpool.Pool // the relay's
	check *pgxpool.Pool // the test's own, to write and look
}

func newWorld(t *testing.T) *world {
	t.Helper()
	name := pgserver.Name(t)
	w := &world{name: name, pool: newPool(t, name, 4), check: newPool(t, name+"_check", 2)}
	require.NoError(t, relay.CreateTable(context.Background(), w.check, name))
	t.Cleanup(func() {
		_, _ = w.check.Exec(context.Background(), "DROP TABLE IF EXISTS "+w.table())
	})
	return w
}

func newPool(t *testing.T, app string, maxConns int32) *pgxpool.Pool {
	t.Helper()
	return pgserver.Pool(t, server().URL, app, maxConns)
}

func (w *world) table() string { return pgx.Identifier{w.name}.Sanitize() }

func (w *world) config(logger *slog.Logger) relay.Config {
	cfg := relay.DefaultConfig()
	cfg.AppName = w.name
	cfg.Table = w.name
	cfg.Interval = 20 * time.Millisecond
	cfg.RetryBackoff = 0
	cfg.SendTimeout = 5 * time.Second
	cfg.Logger = logger
	// Halt is a crash of the server: with AsyncCommit (the default) it forgets
	// the outcomes of the last ~600ms, which are then delivered again. The tests
	// that count duplicates exactly turn it off; TestOutageAsyncCommit keeps it.
	cfg.AsyncCommit = false
	return cfg
}

// insert writes one row per key and returns their ids.
func (w *world) insert(t *testing.T, keys ...string) []int64 {
	t.Helper()
	ids := make([]int64, len(keys))
	for i, k := range keys {
		require.NoError(t, w.check.QueryRow(context.Background(),
			"INSERT INTO "+w.table()+" (type, natural_key, payload) VALUES ('t', $1, '{}') RETURNING id", k).Scan(&ids[i]))
	}
	return ids
}

type rowState struct {
	Status   string
	Attempts int
}

func (w *world) states(t *testing.T) map[int64]rowState {
	t.Helper()
	rows, err := w.check.Query(context.Background(), "SELECT id, status, attempts FROM "+w.table())
	require.NoError(t, err)
	out := map[int64]rowState{}
	for rows.Next() {
		var id int64
		var s rowState
		require.NoError(t, rows.Scan(&id, &s.Status, &s.Attempts))
		out[id] = s
	}
	require.NoError(t, rows.Err())
	return out
}

func (w *world) countNot(t *testing.T, status string) int {
	t.Helper()
	var n int
	require.NoError(t, w.check.QueryRow(context.Background(),
		"SELECT count(*) FROM "+w.table()+" WHERE status <> $1", status).Scan(&n))
	return n
}

// destination is a Sender that counts the deliveries it accepted per row.
type destination struct {
	delay  time.Duration
	before func(ctx context.Context, m relay.Message) error // runs before accepting, if set; an error refuses m

	mu       sync.Mutex
	accepted map[int64]int
}

func newDestination(delay time.Duration) *destination {
	return &destination{delay: delay, accepted: map[int64]int{}}
}

func (d *destination) Type() string { return "t" }

func (d *destination) Send(ctx context.Context, m relay.Message) error {
	select {
	case <-time.After(d.delay):
	case <-ctx.Done():
		return context.Cause(ctx)
	}
	if d.before != nil {
		if err := d.before(ctx, m); err != nil {
			return err
		}
	}
	d.mu.Lock()
	d.accepted[m.ID]++
	d.mu.Unlock()
	return nil
}

func (d *destination) counts() map[int64]int {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make(map[int64]int, len(d.accepted))
	for id, n := range d.accepted {
		out[id] = n
	}
	return out
}

// logLines captures a relay's log as JSON lines.
type logLines struct{ testlog.Buffer }

func (l *logLines) logger() *slog.Logger {
	return slog.New(slog.NewJSONHandler(l, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// records returns the log's records, each a decoded JSON object.
func (l *logLines) records(t *testing.T) []map[string]any {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(l.String()))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var rec map[string]any
		require.NoError(t, json.Unmarshal(sc.Bytes(), &rec), sc.Text())
		out = append(out, rec)
	}
	return out
}

// count counts the records with msg, at level ("" for any level).
func (l *logLines) count(t *testing.T, msg, level string) int {
	n := 0
	for _, rec := range l.records(t) {
		if rec["msg"] == msg && (level == "" || rec["level"] == level) {
			n++
		}
	}
	return n
}

// TestOutage halts PostgreSQL under a running ticker while a producer writes
// and rows are pending, until at least 20 passes and one of the producer's
// writes have failed: the passes fail and are logged at a backoff (Error for
// the 1st, 2nd, 4th, 8th… failure of the streak, Debug for the rest, Info once
// when they succeed again), nothing crashes or leaks, and delivery resumes by
// itself, every row at least once.
//
// Every step waits on what it needs, never on a duration, so that the test
// holds on a loaded machine: the outage lasts until its failures are seen, and
// the rows pending at the halt are held back by the destination until then.
func TestOutage(t *testing.T) { testOutage(t, false) }

// atRisk is how many messages a database that stops answering can leave sent
// but not recorded, with Concurrency 1 and the default adaptive outcomes: the
// worker sends on while up to 64 of its outcomes wait to be written
// (adaptivePipeline, outcomes.go; docs/decisions/0037-adaptive-outcomes.md),
// so the message in flight and those 64.
const atRisk = 1 + 64

// TestOutageAsyncCommit is TestOutage with AsyncCommit on, the default: the
// halt, a crash of the server, also forgets the outcomes committed in its last
// ~600ms, and those messages are delivered again. Nothing is lost: every row
// still ends SENT and delivered.
func TestOutageAsyncCommit(t *testing.T) { testOutage(t, true) }

func testOutage(t *testing.T, asyncCommit bool) {
	requireLocal(t)
	ctx := context.Background()
	leaks := append([]goleak.Option{goleak.IgnoreCurrent()}, ignoreServer...)
	w := newWorld(t)
	var logs logLines
	dest := newDestination(2 * time.Millisecond)
	// The burst's rows wait at the destination until the server is halted, so
	// that they are certainly pending when it goes, however slowly this test
	// gets from the burst to the halt. The one in flight then is interrupted
	// (its context ends with the election) and delivered after the outage.
	halted := make(chan struct{})
	dest.before = func(ctx context.Context, m relay.Message) error {
		if !strings.HasPrefix(m.Key, "burst") {
			return nil
		}
		select {
		case <-halted:
			return nil
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
	cfg := w.config(logs.logger())
	cfg.AsyncCommit = asyncCommit
	r, err := relay.New(w.pool, cfg, dest)
	require.NoError(t, err)
	require.NoError(t, r.Start(ctx))

	// A producer writing a row every 5ms; while the database is down its
	// writes fail, as the service's own transactions would.
	var stopWriting atomic.Bool
	var writes, writeFailures atomic.Int64
	writerDone := make(chan struct{})
	go func() {
		defer close(writerDone)
		for i := 0; !stopWriting.Load(); i++ {
			wctx, cancel := context.WithTimeout(ctx, time.Second)
			_, err := w.check.Exec(wctx, "INSERT INTO "+w.table()+" (type, natural_key, payload) VALUES ('t', $1, '{}')",
				fmt.Sprintf("w%d", i%50))
			cancel()
			if err != nil {
				writeFailures.Add(1)
			} else {
				writes.Add(1)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	require.Eventually(t, func() bool { return len(dest.counts()) >= 20 }, time.Minute, 5*time.Millisecond,
		"the relay delivers before the outage")

	// A burst, so that rows are pending when the database goes.
	_, err = w.check.Exec(ctx, "INSERT INTO "+w.table()+" (type, natural_key, payload) "+
		"SELECT 't', 'burst' || g, '{}' FROM generate_series(1, 100) g")
	require.NoError(t, err)
	var pendingAtHalt int
	require.NoError(t, w.check.QueryRow(ctx, "SELECT count(*) FROM "+w.table()+" WHERE status = 'PENDING'").Scan(&pendingAtHalt))
	require.NoError(t, server().Halt())
	close(halted)
	// The outage lasts until the relay has failed 6 passes (Interval is 20ms,
	// doubling with each failure: about 1.3s) and the producer one write,
	// whatever time that takes on this machine.
	require.Eventually(t, func() bool {
		return logs.count(t, "relay: pass failed", "") >= 6 && writeFailures.Load() > 0
	}, time.Minute, 20*time.Millisecond, "passes and writes fail during the outage")
	failedDuringOutage := logs.count(t, "relay: pass failed", "")
	require.NoError(t, server().Resume(ctx))
	w.check.Reset() // the test's own sessions died with the server; the relay's pool must cope by itself

	// The producer writes after the outage too before it stops.
	writesAtResume := writes.Load()
	require.Eventually(t, func() bool { return writes.Load() > writesAtResume+10 }, time.Minute, 5*time.Millisecond,
		"the producer writes again after the outage")
	stopWriting.Store(true)
	<-writerDone
	require.Eventually(t, func() bool { return w.countNot(t, "SENT") == 0 }, time.Minute, 10*time.Millisecond,
		"delivery resumes by itself")
	stopCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	require.NoError(t, r.Stop(stopCtx))
	require.NoError(t, r.Stats().LastPassErr)

	// Every row written, before, during (none) and after the outage, delivered.
	states, accepted := w.states(t), dest.counts()
	dups := 0
	for id, s := range states {
		require.Equal(t, "SENT", s.Status, "row %d", id)
		require.GreaterOrEqual(t, accepted[id], 1, "row %d", id)
		dups += accepted[id] - 1
	}
	require.Len(t, accepted, len(states), "nothing delivered that is not in the table")
	if asyncCommit {
		t.Logf("%d messages delivered twice: their outcomes were committed asynchronously and lost with the crash", dups)
	} else {
		require.LessOrEqual(t, dups, atRisk, "at most the message in flight when the database went, and the outcomes waiting behind it, are delivered twice")
	}
	require.Positive(t, pendingAtHalt, "rows were pending at the halt")
	require.Positive(t, writeFailures.Load(), "the producer saw the outage too")

	// The log: one streak of failures, logged at a backoff, and one recovery.
	failed := logs.count(t, "relay: pass failed", "")
	errorLines := logs.count(t, "relay: pass failed", "ERROR")
	require.GreaterOrEqual(t, failedDuringOutage, 6, "the outage failed passes")
	// Failed passes back off: Interval (20ms) doubles with each failure in a
	// row, so the sixth comes at least 20ms×2^4 = 320ms after the fifth.
	var failedAt []time.Time
	var failures []string // the log from the first failure up to the seventh, for the message
	for _, rec := range logs.records(t) {
		if rec["msg"] == "relay: pass failed" {
			at, err := time.Parse(time.RFC3339Nano, rec["time"].(string))
			require.NoError(t, err)
			failedAt = append(failedAt, at)
		}
		if len(failedAt) > 0 && len(failedAt) <= 6 {
			failures = append(failures, fmt.Sprint(rec))
		}
	}
	require.GreaterOrEqual(t, failedAt[5].Sub(failedAt[4]), 300*time.Millisecond, "failed passes back off:\n%s",
		strings.Join(failures, "\n"))
	require.Equal(t, 1, logs.count(t, "relay: passes succeed again", "INFO"), "one recovery line")
	require.Equal(t, bits.Len(uint(failed)), errorLines,
		"Error lines for the 1st, 2nd, 4th, 8th… failure only (%d failed passes)", failed)
	var otherErrors []string
	for _, rec := range logs.records(t) {
		if rec["level"] == "ERROR" && rec["msg"] != "relay: pass failed" {
			otherErrors = append(otherErrors, fmt.Sprint(rec["msg"]))
		}
	}
	require.LessOrEqual(t, len(otherErrors), atRisk, "besides the streak, at most the lost outcomes of the send in flight and those waiting behind it: %q", otherErrors)
	for _, rec := range logs.records(t) {
		switch {
		case rec["msg"] == "relay: passes succeed again":
			require.EqualValues(t, failed, rec["after_failures"])
			t.Logf("recovery: %v", rec)
		case rec["level"] == "ERROR":
			t.Logf("error line: %v", rec)
		}
	}
	t.Logf("outage: %d failed passes, %d Error lines (+%d other), %d producer writes failed, %d rows pending at the halt, %d rows, %d delivered twice",
		failed, errorLines, len(otherErrors), writeFailures.Load(), pendingAtHalt, len(states), dups)

	w.pool.Close()
	w.check.Close()
	goleak.VerifyNone(t, leaks...)
}

// TestOutcomeLostToAnOutage halts PostgreSQL right after the destination
// accepted a message, so that its outcome cannot be recorded: a later pass
// delivers it again and every row ends SENT, without the fault counting as an
// attempt. A row's outcome was either recorded (then it is never delivered
// again) or not (then it is delivered again): nothing is lost, nothing is
// duplicated that need not be.
//
// The destination halts the server inside Send and returns only once the halt
// is complete, so the outcome is written to a server that is gone, however long
// the halt takes. The faulted pass is therefore a direct one ([relay.Relay.Run]):
// under the election, the lock's session dying at the halt's first moment would
// cancel the pass, and the relay would abandon the send 100ms later, before
// the destination had accepted it, whenever the halt took longer than that (a
// loaded machine). The passes after the outage run under the election.
func TestOutcomeLostToAnOutage(t *testing.T) {
	requireLocal(t)
	for _, tc := range []struct {
		name          string
		groupOutcomes int
		concurrency   int
	}{
		{"OneOutcomePerTransaction", 0, 1},
		{"GroupedOutcomes", 8, 1},
		{"Concurrency4", 0, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			w := newWorld(t)
			ids := w.insert(t, "a", "b", "c", "d", "e", "f")
			dest := newDestination(time.Millisecond)
			var halted atomic.Bool
			var faulted atomic.Int64
			dest.before = func(ctx context.Context, m relay.Message) error {
				if m.Key == "d" && halted.CompareAndSwap(false, true) {
					faulted.Store(m.ID)
					start := time.Now()
					if err := server().Halt(); err != nil {
						t.Errorf("halt: %v", err)
					}
					t.Logf("the halt took %s", time.Since(start).Round(time.Millisecond))
				}
				return nil
			}
			var logs logLines
			cfg := w.config(logs.logger())
			cfg.GroupOutcomes = tc.groupOutcomes
			cfg.Concurrency = tc.concurrency
			// The halt inside Send ignores ctx and takes what it takes (pgserver
			// bounds it at about 10s): the relay must wait for it, not time it out.
			cfg.SendTimeout = time.Minute
			r, err := relay.New(w.pool, cfg, dest)
			require.NoError(t, err)

			_, err = r.Run(ctx)
			require.Error(t, err, "the pass reports the outcome it could not record")
			require.NotZero(t, faulted.Load(), "the destination halted the server")
			firstPass := dest.counts()
			require.NoError(t, server().Resume(ctx))
			w.check.Reset() // the test's own sessions died with the server; the relay's pool must cope by itself

			after := w.states(t)
			require.Equal(t, "PENDING", after[faulted.Load()].Status, "the faulted row's outcome was lost")
			for id, s := range after {
				if s.Status != "SENT" {
					require.Equal(t, "PENDING", s.Status, "row %d", id)
					require.Zero(t, s.Attempts, "row %d: a lost outcome is not an attempt", id)
				}
			}

			deadline := time.Now().Add(time.Minute)
			for w.countNot(t, "SENT") > 0 {
				require.True(t, time.Now().Before(deadline), "rows still undelivered")
				if _, err := r.RunIfElected(ctx); err != nil {
					t.Logf("a pass after the outage failed (retried): %v", err)
				}
			}
			accepted := dest.counts()
			for _, id := range ids {
				want := 1
				if firstPass[id] == 1 && after[id].Status != "SENT" {
					want = 2 // accepted, outcome lost: delivered again
				}
				require.Equal(t, want, accepted[id], "row %d (first pass: accepted %d, then %s)", id, firstPass[id], after[id].Status)
			}
			require.Equal(t, 2, accepted[faulted.Load()])
			for id, s := range w.states(t) {
				require.Equal(t, rowState{Status: "SENT"}, s, "row %d", id)
			}
			require.Positive(t, logs.count(t, "relay: outcome not recorded; the message is not sent again before its backoff step", "ERROR"),
				"the log names the messages that will be delivered again")
		})
	}
}
