package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/xadm/relay"
	"github.com/xadm/relay/internal/testkit/pgserver"
)

// TestMain gets a real PostgreSQL and checks that no goroutine is left behind.
func TestMain(m *testing.M) { os.Exit(pgserver.Run(m, "RELAY_TEST_DATABASE_URL")) }

// world is one test's app and table.
type world struct {
	pool  *pgxpool.Pool
	app   string
	table string
	cfg   relay.Config
}

const ceiling = 3 // the tests' MaxAttempts

func setup(t *testing.T) *world {
	t.Helper()
	name := pgserver.Name(t)
	w := &world{pool: pgserver.Pool(t, pgserver.Shared().URL, name, 4), app: name, table: name}
	require.NoError(t, relay.CreateTable(context.Background(), w.pool, name))
	t.Cleanup(func() {
		_, _ = w.pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+pgx.Identifier{name}.Sanitize()+", "+pgx.Identifier{name + "_types"}.Sanitize())
	})
	w.cfg = relay.DefaultConfig()
	w.cfg.AppName, w.cfg.Table, w.cfg.MaxAttempts = name, name, ceiling
	return w
}

// ctl runs relayctl cmd against w's app and table with more flags.
func (w *world) ctl(t *testing.T, ctx context.Context, cmd string, flags ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	args := append([]string{cmd, "--database-url", pgserver.Shared().URL, "--app", w.app, "--table", w.table,
		"--max-attempts", fmt.Sprint(ceiling)}, flags...)
	code = runWith(ctx, args, input{r: strings.NewReader("")}, &out, &errOut)
	return code, out.String(), errOut.String()
}

// exec runs sql with the table's quoted name for %s.
func (w *world) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	_, err := w.pool.Exec(context.Background(), fmt.Sprintf(sql, pgx.Identifier{w.table}.Sanitize()), args...)
	require.NoError(t, err)
}

// rows writes n outbound rows of typ in status, with attempts, created age ago.
func (w *world) rows(t *testing.T, typ string, n int, status string, attempts int, age time.Duration) {
	t.Helper()
	w.exec(t, `INSERT INTO %s (type, natural_key, payload, status, attempts, last_error, created_at, sent_at)
		SELECT $1, $1 || '-' || g, jsonb_build_object('n', g), $3, $4,
			CASE WHEN $3 = 'ERROR' THEN 'PUT http://dest/' || $1 || ': 422 Unprocessable Entity' END,
			now() - make_interval(secs => $5), CASE WHEN $3 = 'SENT' THEN now() - make_interval(secs => $5) END
		FROM generate_series(1, $2) g`, typ, n, status, attempts, age.Seconds())
}

func (w *world) count(t *testing.T, where string) int {
	t.Helper()
	var n int
	require.NoError(t, w.pool.QueryRow(context.Background(),
		fmt.Sprintf("SELECT count(*) FROM %s WHERE "+where, pgx.Identifier{w.table}.Sanitize())).Scan(&n))
	return n
}

// holdLikeJVM takes w's election from a session of its own, as a JVM relay
// does, and keeps it until the test ends.
func (w *world) holdLikeJVM(t *testing.T) (pid uint32) {
	t.Helper()
	ctx := context.Background()
	cc, err := pgx.ParseConfig(pgserver.Shared().URL)
	require.NoError(t, err)
	cc.RuntimeParams["application_name"] = "PostgreSQL JDBC Driver"
	conn, err := pgx.ConnectConfig(ctx, cc)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	var ok bool
	require.NoError(t, conn.QueryRow(ctx, "SELECT pg_try_advisory_lock(hashtext($1 || '_relay_m2m')), pg_backend_pid()", w.app).Scan(&ok, &pid))
	require.True(t, ok)
	return pid
}

// holdLikeGoRelay holds w's election as a Go relay's guard does, until the
// test ends: the marked lock statement, then the heartbeat that says since
// when; its session is named name.
func (w *world) holdLikeGoRelay(t *testing.T, name string) {
	t.Helper()
	ctx := context.Background()
	cc, err := pgx.ParseConfig(pgserver.Shared().URL)
	require.NoError(t, err)
	cc.RuntimeParams["application_name"] = name
	conn, err := pgx.ConnectConfig(ctx, cc)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	_, err = conn.Exec(ctx, "/* relay election */ SELECT pg_try_advisory_lock(hashtext($1 || '_relay_m2m'))", w.app)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "/* relay election since "+time.Now().UTC().Format(time.RFC3339)+" */ SELECT pg_backend_pid()")
	require.NoError(t, err)
}

func (w *world) admin(t *testing.T) *relay.Admin {
	t.Helper()
	a, err := relay.NewAdmin(w.pool, w.cfg)
	require.NoError(t, err)
	return a
}

func TestUsage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var out, errOut bytes.Buffer
	require.Equal(t, exitUsage, run(ctx, nil, &out, &errOut))
	require.Contains(t, errOut.String(), "Exit codes:")
	errOut.Reset()
	require.Equal(t, exitOK, run(ctx, []string{"-h"}, &out, &errOut))
	require.Contains(t, errOut.String(), "relayctl [flags of every command] <command> [flags]")
	errOut.Reset()
	require.Equal(t, exitUsage, run(ctx, []string{"stauts"}, &out, &errOut))
	require.Contains(t, errOut.String(), `unknown command "stauts"`)
	errOut.Reset()
	require.Equal(t, exitOK, run(ctx, []string{"purge", "-h"}, &out, &errOut))
	require.Contains(t, errOut.String(), "-older-than")
	errOut.Reset()
	require.Equal(t, statusUnknown, run(ctx, []string{"status", "--nope"}, &out, &errOut), "status's UNKNOWN, not CRITICAL")
	require.Contains(t, errOut.String(), "flag provided but not defined: -nope")
	errOut.Reset()
	require.Equal(t, exitUsage, run(ctx, []string{"dead", "extra"}, &out, &errOut))
	require.Contains(t, errOut.String(), `unexpected argument "extra"`)

	w := setup(t)
	for _, tc := range []struct {
		cmd   string
		flags []string
		want  string
	}{
		{"requeue", nil, "exactly one of --id, --type or --all"},
		{"requeue", []string{"--all", "--type", "x"}, "exactly one of --id, --type or --all"},
		{"requeue", []string{"--id", "abc"}, `"abc" is not a row id`},
		{"purge", nil, "--older-than is required"},
		{"purge", []string{"--older-than", "soon"}, `"soon" is not an age`},
		{"dead", []string{"--limit", "0"}, "--limit must be between 1 and"},
		{"pause", []string{"--for", "-1s"}, "--for must not be negative"},
		{"pause", []string{"--json"}, "flag provided but not defined: -json"},
	} {
		code, _, stderr := w.ctl(t, ctx, tc.cmd, tc.flags...)
		require.Equal(t, exitUsage, code, "%s %v: %s", tc.cmd, tc.flags, stderr)
		require.Contains(t, stderr, tc.want)
	}

	code, _, stderr := w.ctl(t, ctx, "who", "--table", "no.such.table")
	require.Equal(t, exitUsage, code, "a bad --table is the flag's fault")
	require.Contains(t, stderr, "Config.Table")
	code, _, _ = w.ctl(t, ctx, "who", "--table", "missing_table")
	require.Equal(t, exitOK, code, "who reads no table")
	code, _, stderr = w.ctl(t, ctx, "dead", "--table", "missing_table")
	require.Equal(t, exitError, code)
	require.Contains(t, stderr, `is "missing_table" the relays' table? Set RELAY_TABLE or --table`)
}

// TestEnvironment: DATABASE_URL and the relays' RELAY_* variables, as a
// service's relays read them.
func TestEnvironment(t *testing.T) {
	w := setup(t)
	w.rows(t, "orders", 2, "PENDING", 0, 0)
	t.Setenv("DATABASE_URL", pgserver.Shared().URL)
	t.Setenv("RELAY_APP_NAME", w.app)
	t.Setenv("RELAY_TABLE", w.table)
	t.Setenv("RELAY_MAX_ATTEMPTS", "7")
	var out, errOut bytes.Buffer
	code := run(context.Background(), []string{"status", "--sample", "0", "--json"}, &out, &errOut)
	require.Equal(t, statusCritical, code, "no relay runs: STALLED; %s", errOut.String())
	var s jsonStatus
	require.NoError(t, json.Unmarshal(out.Bytes(), &s))
	require.Equal(t, w.app, s.App)
	require.Equal(t, w.table, s.Table)
	require.Equal(t, 7, s.MaxAttempts)
	require.EqualValues(t, 2, s.Pending)

	t.Setenv("RELAY_MAX_ATTEMPTS", "many")
	errOut.Reset()
	require.Equal(t, exitError, run(context.Background(), []string{"who"}, &out, &errOut))
	require.Contains(t, errOut.String(), `RELAY_MAX_ATTEMPTS="many" is not an integer`)

	t.Setenv("RELAY_MAX_ATTEMPTS", "")
	t.Setenv("DATABASE_URL", "")
	errOut.Reset()
	require.Equal(t, exitUsage, run(context.Background(), []string{"who"}, &out, &errOut))
	require.Contains(t, errOut.String(), "set DATABASE_URL or pass --database-url")
}

func TestStatus(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	status := func(t *testing.T, w *world, flags ...string) (int, jsonStatus, string) {
		t.Helper()
		code, stdout, stderr := w.ctl(t, ctx, "status", append([]string{"--json"}, flags...)...)
		require.Contains(t, []int{statusOK, statusCritical, statusWarning}, code, stderr)
		var s jsonStatus
		require.NoError(t, json.Unmarshal([]byte(stdout), &s), stdout)
		return code, s, stderr
	}

	t.Run("Idle", func(t *testing.T) {
		t.Parallel()
		w := setup(t)
		w.rows(t, "orders", 3, "SENT", 0, time.Hour)
		code, stdout, _ := w.ctl(t, ctx, "status", "--sample", "0")
		require.Equal(t, exitOK, code)
		require.True(t, strings.HasPrefix(stdout, "OK: nothing waits to be delivered\n"), stdout)
		require.Contains(t, stdout, "OK: Nothing waits to be delivered")
		require.Regexp(t, `orders\s+OK\s+0\s+0\s+0\s+0\s+3\s+-\s+-`, stdout, "the counts the table holds")
		require.Contains(t, stdout, "is free: nobody holds it right now")
	})

	t.Run("CountsAndDelivering", func(t *testing.T) {
		t.Parallel()
		w := setup(t)
		w.rows(t, "orders", 5, "PENDING", 0, 2*time.Second)
		w.rows(t, "orders", 2, "ERROR", 1, time.Second)
		w.rows(t, "orders", 4, "SENT", 0, time.Hour)
		w.rows(t, "refunds", 1, "PENDING", 0, time.Second)
		w.holdLikeGoRelay(t, "orders-replica-2")
		code, s, _ := status(t, w, "--sample", "0")
		require.Equal(t, exitOK, code, s.Summary)
		require.Equal(t, "ok", s.Verdict)
		require.Equal(t, "delivering", s.Cause)
		require.EqualValues(t, 6, s.Pending)
		require.EqualValues(t, 2, s.Retrying)
		require.EqualValues(t, 4, s.Sent)
		require.False(t, s.SentEstimated)
		require.Len(t, s.Types, 2)
		require.Equal(t, "orders", s.Types[0].Type)
		require.EqualValues(t, 5, s.Types[0].Pending)
		require.EqualValues(t, 4, *s.Types[0].Sent)
		require.InDelta(t, 2, s.Types[0].LagSeconds, 1.5)
		require.NotNil(t, s.Types[0].Next)
		require.NotNil(t, s.Types[0].Oldest)
		require.Equal(t, "ok", s.Verdict)
		require.Equal(t, "OK", s.State)
		require.Zero(t, s.ExitCode)
	})

	t.Run("OnlyDeadRows", func(t *testing.T) {
		t.Parallel()
		w := setup(t)
		w.rows(t, "invoices", 2, "ERROR", ceiling, time.Minute)
		code, s, _ := status(t, w, "--sample", "0")
		require.Equal(t, statusWarning, code)
		require.Equal(t, "dead", s.Verdict)
		require.EqualValues(t, 2, s.Dead)
		require.Contains(t, s.Summary, "422 Unprocessable Entity")
	})

	t.Run("NoRelay", func(t *testing.T) {
		t.Parallel()
		w := setup(t)
		w.rows(t, "orders", 3, "PENDING", 0, 10*time.Minute)
		code, stdout, _ := w.ctl(t, ctx, "status", "--sample", "0")
		require.Equal(t, statusCritical, code)
		require.Contains(t, stdout, "STALLED: Nothing is delivered because no relay of app")
		require.Contains(t, stdout, "RELAY_APP_NAME="+w.app)
	})

	// The hidden scenario: a JVM relay holds the lock and delivers nothing.
	// With the two looks, fresh rows are enough to tell.
	t.Run("JVMHoldsTheLock", func(t *testing.T) {
		t.Parallel()
		w := setup(t)
		w.rows(t, "orders", 3, "PENDING", 0, 0)
		pid := w.holdLikeJVM(t)
		code, s, _ := status(t, w, "--sample", "300ms")
		require.Equal(t, statusCritical, code, s.Summary)
		require.Equal(t, "held-by-other", s.Cause)
		require.Contains(t, s.Summary, "another client")
		require.Contains(t, s.Summary, `"PostgreSQL JDBC Driver"`)
		require.Contains(t, s.Summary, fmt.Sprintf("pg_terminate_backend(%d)", pid))
		require.Len(t, s.Election, 1)
		require.Equal(t, "other", s.Election[0].Kind)
		require.EqualValues(t, pid, s.Election[0].PID)
		require.Equal(t, "127.0.0.1", s.Election[0].ClientAddr)

		// With one look and old rows, the lag alone says it.
		w.exec(t, "UPDATE %s SET created_at = now() - interval '5 minutes'")
		code, stdout, _ := w.ctl(t, ctx, "status", "--sample", "0")
		require.Equal(t, statusCritical, code)
		require.Contains(t, stdout, "STALLED: Nothing is delivered because another client")
		require.Contains(t, stdout, "held by another client")
	})

	t.Run("GoRelayDelivering", func(t *testing.T) {
		t.Parallel()
		w := setup(t)
		w.rows(t, "orders", 1, "PENDING", 0, 0)
		w.holdLikeGoRelay(t, "orders-replica-2")
		code, s, _ := status(t, w, "--sample", "0")
		require.Equal(t, exitOK, code, s.Summary)
		require.Contains(t, s.Summary, `Delivering: a Go relay (application_name "orders-replica-2")`)
		require.Equal(t, "relay", s.Election[0].Kind)
		require.Equal(t, "orders-replica-2", s.Election[0].Replica)
	})
}

func TestDead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := setup(t)
	w.rows(t, "invoices", 5, "ERROR", ceiling, time.Minute)
	w.rows(t, "orders", 2, "ERROR", ceiling+1, time.Minute)
	w.rows(t, "orders", 2, "ERROR", ceiling-1, time.Minute) // still retried: not dead
	w.rows(t, "orders", 2, "PENDING", 0, 0)

	type page struct {
		Rows      []jsonDead `json:"rows"`
		NextAfter *int64     `json:"next_after"`
	}
	read := func(flags ...string) page {
		t.Helper()
		code, stdout, stderr := w.ctl(t, ctx, "dead", append([]string{"--json"}, flags...)...)
		require.Equal(t, exitOK, code, stderr)
		var p page
		require.NoError(t, json.Unmarshal([]byte(stdout), &p))
		return p
	}
	p := read("--limit", "4")
	require.Len(t, p.Rows, 4)
	require.NotNil(t, p.NextAfter)
	require.Equal(t, p.Rows[3].ID, *p.NextAfter)
	require.Equal(t, "invoices", p.Rows[0].Type)
	require.Equal(t, ceiling, p.Rows[0].Attempts)
	require.Contains(t, p.Rows[0].LastError, "422")
	require.Equal(t, `{"n": 1}`, p.Rows[0].Payload)
	p2 := read("--limit", "4", "--after", fmt.Sprint(*p.NextAfter))
	require.Len(t, p2.Rows, 3, "7 dead rows in all")
	require.Nil(t, p2.NextAfter, "the last page")
	require.Greater(t, p2.Rows[0].ID, p.Rows[3].ID)

	p = read("--type", "orders")
	require.Len(t, p.Rows, 2)
	require.Equal(t, ceiling+1, p.Rows[0].Attempts)

	code, stdout, _ := w.ctl(t, ctx, "dead", "--limit", "2")
	require.Equal(t, exitOK, code)
	require.Contains(t, stdout, "invoices-1")
	require.Contains(t, stdout, "422 Unprocessable Entity")
	require.Contains(t, stdout, "next page: relayctl dead --after")
	code, stdout, _ = w.ctl(t, ctx, "dead", "--type", "nope")
	require.Equal(t, exitOK, code)
	require.Contains(t, stdout, `no dead rows of type "nope"`)
}

func TestRequeue(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := setup(t)
	w.rows(t, "invoices", 3, "ERROR", ceiling, time.Minute)
	w.rows(t, "orders", 2, "ERROR", ceiling, time.Minute)
	w.rows(t, "orders", 1, "ERROR", ceiling-1, time.Minute)
	dead := func(typ string) int {
		return w.count(t, fmt.Sprintf("type = '%s' AND status = 'ERROR' AND attempts >= %d", typ, ceiling))
	}

	var first int64
	require.NoError(t, w.pool.QueryRow(ctx, fmt.Sprintf("SELECT min(id) FROM %s", pgx.Identifier{w.table}.Sanitize())).Scan(&first))
	// No relay runs: nothing tells this app's types, so the tool writes
	// nothing until they are named, and says how.
	for _, flags := range [][]string{{"--id", fmt.Sprint(first)}, {"--type", "invoices"}, {"--all"}} {
		code, _, stderr := w.ctl(t, ctx, "requeue", append(flags, "--yes")...)
		require.Equal(t, exitUsage, code, stderr)
		require.Contains(t, stderr, "nothing done: relay: no live relay of the app to learn its types from")
		require.Contains(t, stderr, "relayctl --types a,b")
		require.Contains(t, stderr, "relayctl --all-types")
	}
	require.Equal(t, 3, dead("invoices"))

	code, stdout, stderr := w.ctl(t, ctx, "requeue", "--id", fmt.Sprintf("%d,%d", first, first+5), "--json", "--all-types", "--yes")
	require.Equal(t, exitOK, code, stderr)
	require.JSONEq(t, `{"requeued": 1, "types": null, "all_types": true, "excluded": null}`, stdout, "the retrying row given is not dead: left alone")
	require.Equal(t, 2, dead("invoices"))
	require.Equal(t, 1, w.count(t, "status = 'ERROR' AND attempts = "+fmt.Sprint(ceiling-1)))

	code, stdout, stderr = w.ctl(t, ctx, "requeue", "--type", "orders", "--types", "orders", "--yes")
	require.Equal(t, exitOK, code)
	require.Contains(t, stdout, `re-queued 2 dead row(s) of type "orders"`)
	require.Contains(t, stderr, `acting on types "orders" (explicit)`)
	require.Zero(t, dead("orders"))

	code, stdout, _ = w.ctl(t, ctx, "requeue", "--all", "--all-types", "--yes")
	require.Equal(t, exitOK, code)
	require.Contains(t, stdout, "re-queued 2 dead row(s)")
	code, stdout, _ = w.ctl(t, ctx, "requeue", "--all", "--all-types")
	require.Equal(t, exitOK, code, "nothing to re-queue: nothing to confirm")
	require.Contains(t, stdout, "nothing re-queued")
	require.Equal(t, 5, w.count(t, "status = 'ERROR' AND attempts = 0"), "re-queued: failed rows with 0 attempts, due at once")
	require.Equal(t, 5, w.count(t, "status = 'ERROR' AND requeued_at IS NOT NULL"), "a re-queue says when")
}

func TestPurge(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := setup(t)
	w.rows(t, "orders", 2*relay.PurgeChunk+5, "SENT", 0, 40*24*time.Hour)
	w.rows(t, "orders", 3, "SENT", 0, time.Hour)
	w.rows(t, "orders", 1, "PENDING", 0, 40*24*time.Hour)

	code, stdout, stderr := w.ctl(t, ctx, "purge", "--older-than", "30d", "--dry-run", "--all-types")
	require.Equal(t, exitOK, code, stderr)
	require.Contains(t, stdout, "would delete 2,005 SENT row(s)")
	require.Contains(t, stdout, "(counted)")
	require.Contains(t, stdout, "  2,005  orders\n")
	code, stdout, _ = w.ctl(t, ctx, "purge", "--older-than", "30d", "--dry-run", "--json", "--all-types")
	require.Equal(t, exitOK, code)
	require.Contains(t, stdout, `"types": {`)
	require.Contains(t, stdout, `"orders": 2005`)
	require.Equal(t, 2008, w.count(t, "status = 'SENT'"), "a dry run deletes nothing")

	code, stdout, stderr = w.ctl(t, ctx, "purge", "--older-than", "30d", "--all-types", "--yes")
	require.Equal(t, exitOK, code, stderr)
	require.Contains(t, stdout, "purged 2,005 SENT row(s)")
	require.Contains(t, stderr, "purge: about 2,005 SENT row(s) to delete, in chunks of 1,000\n", "the total before the first chunk")
	require.NotContains(t, stderr, "\r")
	require.Equal(t, 3, w.count(t, "status = 'SENT'"))
	require.Equal(t, 1, w.count(t, "status = 'PENDING'"))

	code, stdout, stderr = w.ctl(t, ctx, "purge", "--older-than", "0", "--json", "--types", "orders", "--yes")
	require.Equal(t, exitOK, code)
	require.JSONEq(t, `{"purged": 3, "types": ["orders"], "all_types": false, "excluded": null}`, stdout)
	require.Empty(t, stderr, "no progress with --json")
}

func TestWho(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := setup(t)
	code, stdout, _ := w.ctl(t, ctx, "who")
	require.Equal(t, exitOK, code)
	require.Contains(t, stdout, "is free: nobody holds it right now")

	pid := w.holdLikeJVM(t)
	code, stdout, _ = w.ctl(t, ctx, "who")
	require.Equal(t, exitOK, code)
	require.Contains(t, stdout, fmt.Sprintf(`held by another client (a JVM relay or SQL; application_name "PostgreSQL JDBC Driver") [pid %d`, pid))
	code, stdout, _ = w.ctl(t, ctx, "who", "--json")
	require.Equal(t, exitOK, code)
	var who struct {
		Key      string       `json:"key"`
		Election []jsonHolder `json:"election"`
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &who))
	require.Equal(t, w.app+"_relay_m2m", who.Key)
	require.Len(t, who.Election, 1)
	require.EqualValues(t, pid, who.Election[0].PID)
	require.Equal(t, "exclusive", who.Election[0].Mode)
}

// pausing runs relayctl pause for w in the background; wait returns its exit
// code and output once it ends.
func (w *world) pausing(t *testing.T, ctx context.Context, flags ...string) (wait func() (int, string, string)) {
	t.Helper()
	type result struct {
		code           int
		stdout, stderr string
	}
	done := make(chan result, 1)
	go func() {
		code, stdout, stderr := w.ctl(t, ctx, "pause", flags...)
		done <- result{code, stdout, stderr}
	}()
	var once sync.Once
	var r result
	wait = func() (int, string, string) {
		once.Do(func() {
			select {
			case r = <-done:
			case <-time.After(time.Minute):
				t.Fatal("relayctl pause did not end")
			}
		})
		return r.code, r.stdout, r.stderr
	}
	t.Cleanup(func() { wait() })
	return wait
}

// waitPaused waits until w's election is held by a pause.
func (w *world) waitPaused(t *testing.T) relay.LockHolder {
	t.Helper()
	a := w.admin(t)
	var h relay.LockHolder
	require.Eventually(t, func() bool {
		hs, err := a.Election(context.Background())
		if err != nil || len(hs) != 1 || hs[0].Kind != relay.HolderPause {
			return false
		}
		h = hs[0]
		return true
	}, 30*time.Second, 20*time.Millisecond)
	return h
}

type nopSender struct{ typ string }

func (s nopSender) Type() string                              { return s.typ }
func (s nopSender) Send(context.Context, relay.Message) error { return nil }

func TestPauseResume(t *testing.T) {
	t.Parallel()

	t.Run("StopsDeliveryUntilResumed", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		w := setup(t)
		w.rows(t, "orders", 2, "PENDING", 0, 0)
		r, err := relay.New(w.pool, w.cfg, nopSender{"orders"})
		require.NoError(t, err)

		wait := w.pausing(t, ctx)
		h := w.waitPaused(t)
		require.Equal(t, pauseName(w.app), h.ApplicationName)

		ran, err := r.RunIfElected(ctx)
		require.NoError(t, err)
		require.False(t, ran, "a relay coalesces while paused: nothing is delivered")
		require.Equal(t, 2, w.count(t, "status = 'PENDING'"))

		code, stdout, _ := w.ctl(t, ctx, "status", "--sample", "0")
		require.Equal(t, statusCritical, code)
		require.Contains(t, stdout, "PAUSED: Nothing is delivered because delivery of app")

		code, _, stderr := w.ctl(t, ctx, "pause", "--wait", "100ms")
		require.Equal(t, exitHeld, code, "a second pause cannot take it")
		require.Contains(t, stderr, "It is already paused.")

		code, stdout, stderr = w.ctl(t, ctx, "resume")
		require.Equal(t, exitOK, code, stderr)
		require.Contains(t, stdout, "resumed: ended the pause relayctl pause [pid")
		code, stdout, _ = wait()
		require.Equal(t, exitOK, code)
		require.Contains(t, stdout, "paused: this session")
		require.Contains(t, stdout, "resumed: the pause's session was ended from elsewhere")

		ran, err = r.RunIfElected(ctx)
		require.NoError(t, err)
		require.True(t, ran, "delivery resumes at the next pass")
		require.Equal(t, 2, w.count(t, "status = 'SENT'"))
	})

	t.Run("ForElapses", func(t *testing.T) {
		t.Parallel()
		w := setup(t)
		wait := w.pausing(t, context.Background(), "--for", "300ms")
		code, stdout, _ := wait()
		require.Equal(t, exitOK, code)
		require.Contains(t, stdout, "resumed: --for 300ms elapsed; released the election")
		hs, err := w.admin(t).Election(context.Background())
		require.NoError(t, err)
		require.Empty(t, hs)
	})

	t.Run("Interrupted", func(t *testing.T) {
		t.Parallel()
		w := setup(t)
		ctx, cancel := context.WithCancel(context.Background())
		wait := w.pausing(t, ctx)
		w.waitPaused(t)
		cancel() // Ctrl-C
		code, stdout, _ := wait()
		require.Equal(t, exitOK, code)
		require.Contains(t, stdout, "resumed: interrupted; released the election")
		hs, err := w.admin(t).Election(context.Background())
		require.NoError(t, err)
		require.Empty(t, hs)
	})

	t.Run("HeldByJVM", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		w := setup(t)
		pid := w.holdLikeJVM(t)
		code, _, stderr := w.ctl(t, ctx, "pause", "--wait", "200ms")
		require.Equal(t, exitHeld, code)
		require.Contains(t, stderr, "not paused: the election of app")
		require.Contains(t, stderr, fmt.Sprintf(`another client (a JVM relay or SQL; application_name "PostgreSQL JDBC Driver") [pid %d`, pid))

		code, stdout, _ := w.ctl(t, ctx, "resume")
		require.Equal(t, exitHeld, code, "resume ends only pauses")
		require.Contains(t, stdout, "not paused by relayctl")
		require.Contains(t, stdout, fmt.Sprintf("pg_terminate_backend(%d)", pid))
	})

	t.Run("PartitionedReplicasStepAside", func(t *testing.T) {
		// Partitioned replicas hold the app's key (shared) for as long as they
		// run: the pause waits in line, and they leave when they see it.
		t.Parallel()
		ctx := context.Background()
		w := setup(t)
		cfg := w.cfg
		cfg.Partitions = 4
		cfg.Interval = 20 * time.Millisecond
		r, err := relay.New(w.pool, cfg, nopSender{"orders"})
		require.NoError(t, err)
		require.NoError(t, r.Start(ctx))
		t.Cleanup(func() { _ = r.Stop(context.Background()) })
		require.Eventually(t, func() bool { return len(r.Stats().Partitions) == 4 }, 30*time.Second, 10*time.Millisecond)

		wait := w.pausing(t, ctx)
		w.waitPaused(t)
		require.Nil(t, r.Stats().Partitions, "the replica left the election to the pause")
		w.rows(t, "orders", 2, "PENDING", 0, 0)
		coalesced := r.Stats().PassesCoalesced
		require.Eventually(t, func() bool { return r.Stats().PassesCoalesced >= coalesced+3 }, 30*time.Second, 10*time.Millisecond)
		require.Equal(t, 2, w.count(t, "status = 'PENDING'"), "nothing is delivered while paused")

		code, _, stderr := w.ctl(t, ctx, "resume")
		require.Equal(t, exitOK, code, stderr)
		code, _, _ = wait()
		require.Equal(t, exitOK, code)
		require.Eventually(t, func() bool { return w.count(t, "status = 'SENT'") == 2 }, 30*time.Second, 10*time.Millisecond,
			"the replica rejoins and delivers")
	})

	t.Run("ResumeWithoutPause", func(t *testing.T) {
		t.Parallel()
		w := setup(t)
		code, stdout, _ := w.ctl(t, context.Background(), "resume")
		require.Equal(t, exitOK, code)
		require.Contains(t, stdout, "not paused: nobody holds the election")
	})
}

// TestProgressBar replays, on a fake clock, the bar of a purge of 1,000,000
// rows that deletes a chunk of 1,000 every 10 ms: the total is the estimate
// known before the first chunk, the bar moves from empty to full, and the rate
// and the time left are the clock's.
func TestProgressBar(t *testing.T) {
	t.Parallel()
	var b bytes.Buffer
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	p := newProgress(&b, false)
	p.terminal = true
	p.now = func() time.Time { return now }
	const total, chunk = 1_000_000, relay.PurgeChunk
	p.update(0, total)
	for deleted := int64(chunk); deleted <= total; deleted += chunk {
		now = now.Add(10 * time.Millisecond)
		p.update(deleted, total)
	}
	p.done()
	head, bar, ok := strings.Cut(b.String(), "\r")
	require.True(t, ok)
	require.Equal(t, "purge: about 1,000,000 SENT row(s) to delete, in chunks of 1,000\n", head)
	frames := strings.Split(strings.TrimSuffix(bar, "\n"), "\r")
	require.Len(t, frames, total/chunk)
	require.Equal(t, "[..............................]   0%  1,000 of ~1,000,000 rows  0s ", frames[0], "no rate from 10 ms")
	require.True(t, strings.HasPrefix(frames[9], "[..............................]   1%  10,000 of ~1,000,000 rows  100,000 rows/s  10s left"), frames[9])
	require.True(t, strings.HasPrefix(frames[99], "[###...........................]  10%  100,000 of ~1,000,000 rows  100,000 rows/s  9s left"), frames[99])
	require.True(t, strings.HasPrefix(frames[499], "[###############...............]  50%  500,000 of ~1,000,000 rows  100,000 rows/s  5s left"), frames[499])
	require.True(t, strings.HasPrefix(frames[999], "[##############################] 100%  1,000,000 of ~1,000,000 rows  100,000 rows/s  10s"), frames[999])
	// The bar moves: each of its 30 cells fills in turn, never back.
	bars, last := 0, -1
	for _, f := range frames {
		filled := strings.Count(f[:32], "#")
		require.GreaterOrEqual(t, filled, last)
		if filled > last {
			bars++
		}
		last = filled
	}
	require.Equal(t, 31, bars)
	require.True(t, strings.HasSuffix(b.String(), "\n"))
	require.Equal(t, 2, strings.Count(b.String(), "\n"), "the estimate's line and one bar, redrawn")

	// An estimate the purge overtakes says so rather than follow the count.
	b.Reset()
	p = newProgress(&b, false)
	p.terminal = true
	p.now = func() time.Time { return now }
	p.update(0, 4000)
	now = now.Add(time.Second)
	p.update(4100, 4000)
	require.Contains(t, b.String(), "\r[##############################] 100%  4,100 rows, more than the ~4,000 estimated  4,100 rows/s  1s")

	// Off a terminal: a line every 2s, with the rate and the time left.
	b.Reset()
	p = newProgress(&b, false)
	p.now = func() time.Time { return now }
	p.update(0, 10_000)
	for deleted := int64(1000); deleted <= 10_000; deleted += 1000 {
		now = now.Add(time.Second)
		p.update(deleted, 10_000)
	}
	require.Equal(t, "purge: about 10,000 SENT row(s) to delete, in chunks of 1,000\n"+
		"purge: 2,000 of ~10,000 rows  1,000 rows/s  8s left\n"+
		"purge: 4,000 of ~10,000 rows  1,000 rows/s  6s left\n"+
		"purge: 6,000 of ~10,000 rows  1,000 rows/s  4s left\n"+
		"purge: 8,000 of ~10,000 rows  1,000 rows/s  2s left\n"+
		"purge: 10,000 of ~10,000 rows  1,000 rows/s  10s\n", b.String())

	b.Reset()
	quiet := newProgress(&b, true)
	quiet.update(0, 2)
	quiet.update(1, 2)
	quiet.done()
	require.Empty(t, b.String())
}

// The flags of every command may come before the command as well as after it
// (relayctl --database-url X status); a command's own flags only after it.
func TestFlagsBeforeOrAfterTheCommand(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := setup(t)
	w.rows(t, "orders", 2, "ERROR", ceiling, time.Minute)
	common := []string{"--database-url", pgserver.Shared().URL, "--app=" + w.app, "--table", w.table,
		"--max-attempts", fmt.Sprint(ceiling), "--json"}

	var afterOut, afterErr bytes.Buffer
	after := run(ctx, append([]string{"dead"}, common...), &afterOut, &afterErr)
	require.Equal(t, exitOK, after, afterErr.String())
	require.Contains(t, afterOut.String(), "orders-1")

	var beforeOut, beforeErr bytes.Buffer
	before := run(ctx, append(append([]string{}, common...), "dead", "--type", "orders"), &beforeOut, &beforeErr)
	require.Equal(t, exitOK, before, beforeErr.String())
	require.JSONEq(t, afterOut.String(), beforeOut.String())

	// status exits 1 (WARNING: dead rows wait) either way; an error would be 3.
	var out, errOut bytes.Buffer
	require.Equal(t, statusWarning, run(ctx, append(append([]string{}, common...), "status"), &out, &errOut), errOut.String())

	errOut.Reset()
	require.Equal(t, exitUsage, run(ctx, []string{"--type", "orders", "dead"}, &out, &errOut))
	require.Contains(t, errOut.String(), "flag --type before the command")
	errOut.Reset()
	require.Equal(t, exitUsage, run(ctx, []string{"--database-url", "x"}, &out, &errOut))
	require.Contains(t, errOut.String(), "no command after the flags")
}

func TestClock(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]string{0: "0s", 9400 * time.Millisecond: "9s", 245 * time.Second: "4m05s", 3723 * time.Second: "1h02m03s"} {
		require.Equal(t, want, clock(d))
	}
}

// TestInputValidation: every value a flag can carry that makes no sense is a
// usage error (exit 2; status's UNKNOWN, 3) naming the flag, before any statement runs: ages that
// are not finite, negative or beyond a Duration; text PostgreSQL cannot hold
// or that names nothing; ids and limits that are not numbers or out of range.
func TestInputValidation(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := setup(t)
	w.rows(t, "orders", 2, "ERROR", ceiling, time.Hour)
	w.rows(t, "orders", 2, "SENT", 0, 40*24*time.Hour)
	for _, tc := range []struct {
		name  string
		cmd   string
		flags []string
		want  string
	}{
		{"AgeNaN", "purge", []string{"--older-than", "NaNd"}, `"NaNd" is not a number of days`},
		{"AgeInf", "purge", []string{"--older-than", "Infd"}, `"Infd" is too long an age`},
		{"AgeMinusInf", "purge", []string{"--older-than", "-Infd"}, "must not be negative"},
		{"Age1e308", "purge", []string{"--older-than", "1e308d"}, "too long an age: at most 106751 days"},
		{"Age1e400", "purge", []string{"--older-than", "1e400d"}, "too long an age"},
		{"AgeNegativeDays", "purge", []string{"--older-than", "-1d"}, "must not be negative"},
		{"AgeNegative", "purge", []string{"--older-than", "-5m"}, "must not be negative"},
		{"AgeHuge", "purge", []string{"--older-than", "9999999999h"}, "is not an age"},
		{"AgeBlank", "purge", []string{"--older-than", " "}, "is not an age"},
		{"AgeNoUnit", "purge", []string{"--older-than", "30"}, "is not an age"},
		{"DeadTypeBlank", "dead", []string{"--type", "  "}, `--type "  " is blank`},
		{"DeadTypeEmpty", "dead", []string{"--type", ""}, `--type "" is blank`},
		{"DeadTypeNUL", "dead", []string{"--type", "ord\x00ers"}, "contains a NUL byte"},
		{"DeadTypeUTF8", "dead", []string{"--type", "ord\xffers"}, "is not valid UTF-8"},
		{"RequeueTypeBlank", "requeue", []string{"--type", "\t"}, "is blank"},
		{"RequeueTypeNUL", "requeue", []string{"--type", "\x00"}, "contains a NUL byte"},
		{"RequeueTypeUTF8", "requeue", []string{"--type", "\xc3\x28"}, "is not valid UTF-8"},
		{"TypesBlank", "purge", []string{"--older-than", "1d", "--types", "orders,,invoices"}, `the type "" is blank`},
		{"TypesNUL", "requeue", []string{"--all", "--types", "a\x00"}, "contains a NUL byte"},
		{"TypesUTF8", "purge", []string{"--older-than", "1d", "--types", "\xff"}, "is not valid UTF-8"},
		{"AppNUL", "status", []string{"--app", "a\x00"}, `--app "a\x00" contains a NUL byte`},
		{"TableUTF8", "who", []string{"--table", "\xff"}, "is not valid UTF-8"},
		{"MaxAttemptsNegative", "dead", []string{"--max-attempts", "-1"}, "--max-attempts must be at least 1"},
		{"MaxAttemptsText", "dead", []string{"--max-attempts", "ten"}, `invalid value "ten" for flag -max-attempts`},
		{"LimitText", "dead", []string{"--limit", "abc"}, `invalid value "abc" for flag -limit`},
		{"LimitFloat", "dead", []string{"--limit", "1e3"}, `invalid value "1e3" for flag -limit`},
		{"LimitZero", "dead", []string{"--limit", "0"}, "--limit must be between 1 and"},
		{"LimitHuge", "dead", []string{"--limit", "99999999999999999999"}, "invalid value"},
		{"AfterText", "dead", []string{"--after", "x"}, `invalid value "x" for flag -after`},
		{"AfterNegative", "dead", []string{"--after", "-1"}, "--after must not be negative"},
		{"IDText", "requeue", []string{"--id", "abc"}, `"abc" is not a row id`},
		{"IDZero", "requeue", []string{"--id", "0"}, `"0" is not a row id`},
		{"IDEmptyInList", "requeue", []string{"--id", "1,,2"}, `"" is not a row id`},
		{"IDHuge", "requeue", []string{"--id", "99999999999999999999"}, "is not a row id"},
		{"IDNaN", "requeue", []string{"--id", "NaN"}, `"NaN" is not a row id`},
		{"SampleNegative", "status", []string{"--sample", "-1s"}, "--sample must be between 0 and 1m"},
		{"SampleText", "status", []string{"--sample", "NaN"}, `invalid value "NaN" for flag -sample`},
		{"StallAfterZero", "status", []string{"--stall-after", "0"}, "--stall-after must be positive"},
		{"ForHuge", "pause", []string{"--for", "9999999999h"}, "invalid value"},
		{"TableBad", "status", []string{"--table", "no.such.table"}, "Config.Table"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := w.ctl(t, ctx, tc.cmd, tc.flags...)
			want := exitUsage
			if tc.cmd == "status" {
				want = statusUnknown // a pager's state: no verdict
			}
			require.Equal(t, want, code, "stdout %q stderr %q", stdout, stderr)
			require.Contains(t, stderr, tc.want)
		})
	}
	require.Equal(t, 2, w.count(t, "status = 'ERROR'"), "nothing was re-queued")
	require.Equal(t, 2, w.count(t, "status = 'SENT'"), "nothing was purged")
}
