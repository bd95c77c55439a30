package wake_test

import (
	"context"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/xadm/relay"
	"github.com/xadm/relay/internal/testkit/harness"
	"github.com/xadm/relay/internal/testkit/pgserver"
	"github.com/xadm/relay/internal/testkit/testlog"
)

// The wake-up on commit, proven from a whole Relay: producers' NOTIFY (the
// Enqueue's and the trigger's, one transaction at a time), the listener that
// wakes the loop, and its failures: a transaction-pooling proxy, a late probe.

// TestMain gets a real PostgreSQL (RELAY_TEST_DATABASE_URL, a container, or
// the local binaries) and, after the tests, checks that no goroutine was left
// behind.
func TestMain(m *testing.M) { os.Exit(pgserver.Run(m, "RELAY_TEST_DATABASE_URL")) }

// TestWakeOnCommit: with an Interval of an hour, only the wake-up can deliver
// what producers commit after the first pass.
func TestWakeOnCommit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	started := func(t *testing.T, b *harness.Bundle, rec *harness.Recorder) *relay.Relay {
		t.Helper()
		cfg := b.Config
		cfg.Interval = time.Hour
		r := b.NewRelay(t, cfg, rec)
		require.NoError(t, r.Start(ctx))
		t.Cleanup(func() { require.NoError(t, r.Stop(ctx)) })
		// The first pass runs at once; after it, nothing but a wake-up passes.
		require.Eventually(t, func() bool { return r.Stats().PassesElected+r.Stats().PassesCoalesced >= 1 },
			10*time.Second, 5*time.Millisecond)
		waitListening(t, b)
		return r
	}

	t.Run("EnqueueWakesTheRelay", func(t *testing.T) {
		t.Parallel()
		b := harness.Setup(t)
		rec := harness.NewRecorder("t", nil)
		started(t, b, rec)
		for i := range 3 {
			require.NoError(t, pgx.BeginFunc(ctx, b.Pool, func(tx pgx.Tx) error {
				_, err := relay.Enqueue(ctx, tx, b.Table, relay.Outgoing{Type: "t", Key: "k", Payload: []byte(`{}`)})
				return err
			}))
			require.Eventually(t, func() bool { return rec.Count() == i+1 }, 10*time.Second, time.Millisecond,
				"message %d is delivered on its commit, not at the next Interval", i)
		}
	})

	t.Run("TheTriggerWakesItForPlainSQL", func(t *testing.T) {
		t.Parallel()
		b := harness.Setup(t)
		require.NoError(t, relay.CreateWakeTrigger(ctx, b.Pool, b.Table))
		require.NoError(t, relay.CreateWakeTrigger(ctx, b.Pool, b.Table), "idempotent")
		rec := harness.NewRecorder("t", nil)
		started(t, b, rec)
		b.Insert(t, "t", "a") // plain SQL, as the JVM writes
		require.Eventually(t, func() bool { return rec.Count() == 1 }, 10*time.Second, time.Millisecond)
	})
}

// waitListening waits until a session of the bundle's app LISTENs: its last
// statement is the LISTEN, or the presence it takes once the LISTEN's probe
// came back (internal/session/presence.go).
func waitListening(t *testing.T, b *harness.Bundle) {
	t.Helper()
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, b.Pool.QueryRow(context.Background(),
			`SELECT count(*) FROM pg_stat_activity WHERE application_name = $1
			  AND (query LIKE 'LISTEN %' OR query LIKE '/* relay presence %')`,
			harness.AppNameOf(b.Pool)).Scan(&n))
		return n > 0
	}, 10*time.Second, 5*time.Millisecond, "the relay listens")
}

// TestEnqueueNotifies: Enqueue's NOTIFY, and none WithoutWakeUp. (That one
// transaction at a time carries it is internal/store's
// TestEnqueueWakeTokenOneNotifierAtATime; one per window of a process's dense
// Enqueues, TestEnqueueOneWakeUpPerWindow.)
func TestEnqueueNotifies(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := harness.Setup(t)
	listener := harness.ListenOn(t, "relay:"+b.Table)

	_, err := relay.Enqueue(ctx, b.Pool, b.Table, relay.Outgoing{Type: "quiet", Key: "k", Payload: []byte(`{}`)}, relay.WithoutWakeUp())
	require.NoError(t, err)
	_, err = relay.Enqueue(ctx, b.Pool, b.Table, relay.Outgoing{Type: "loud", Key: "k", Payload: []byte(`{}`)})
	require.NoError(t, err)
	n, err := listener.WaitForNotification(ctx)
	require.NoError(t, err)
	require.Equal(t, "loud", n.Payload, "notifications arrive in commit order: the quiet one sent none")
}

// TestWakeTriggerOneNotifierAtATime: of two transactions inserting at once,
// only the first carries the trigger's NOTIFY, so the producers' commits are
// not serialised on it.
func TestWakeTriggerOneNotifierAtATime(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := harness.Setup(t)
	require.NoError(t, relay.CreateWakeTrigger(ctx, b.Pool, b.Table))
	listener := harness.ListenOn(t, "relay:"+b.Table)
	insert := "INSERT INTO " + pgx.Identifier{b.Table}.Sanitize() + " (type, natural_key, payload) VALUES ($1, 'k', '{}')"

	first, err := b.Pool.Begin(ctx)
	require.NoError(t, err)
	_, err = first.Exec(ctx, insert, "first")
	require.NoError(t, err)
	_, err = b.Pool.Exec(ctx, insert, "second") // commits at once, while first holds the token
	require.NoError(t, err)
	require.NoError(t, first.Commit(ctx))
	_, err = b.Pool.Exec(ctx, "SELECT pg_notify($1, 'sentinel')", "relay:"+b.Table)
	require.NoError(t, err)
	var got []string
	for {
		n, err := listener.WaitForNotification(ctx)
		require.NoError(t, err)
		if n.Payload == "sentinel" {
			break
		}
		got = append(got, n.Payload)
	}
	require.Equal(t, []string{"first"}, got)
}

// TestWakeUpsBehindATransactionPooler: LISTEN cannot work through a
// transaction-pooling proxy; the relay finds out, says so once, and polls.
func TestWakeUpsBehindATransactionPooler(t *testing.T) {
	t.Parallel()
	pgserver.RequirePgBouncer(t)
	ctx := context.Background()
	b := harness.Setup(t)
	bouncer := harness.StartBouncer(t, "transaction")
	pool := harness.BouncerPool(t, bouncer.URL, 4, pgx.QueryExecModeExec)
	var logs testlog.Buffer
	cfg := b.Config
	cfg.ClusterLock = false // the election needs session pooling; the wake-up is what this test is about
	cfg.Interval = 50 * time.Millisecond
	cfg.Logger = logs.Logger()
	rec := harness.NewRecorder("t", nil)
	r, err := relay.New(pool, cfg, rec)
	require.NoError(t, err)
	require.NoError(t, r.Start(ctx))
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "wake-ups on commit are off") },
		20*time.Second, 10*time.Millisecond)
	b.Insert(t, "t", "a", "b")
	require.Eventually(t, func() bool { return rec.Count() == 2 }, 10*time.Second, 5*time.Millisecond, "polling delivers")
	require.NoError(t, r.Stop(ctx))
	require.Equal(t, 1, strings.Count(logs.String(), "wake-ups on commit are off"), "said once")
}

// lateProbe is a tracer that holds the answer to the first wake-up probe
// (the listener's own test notification, sent on a pooled connection) until
// the probe's deadline has passed: a server too loaded to answer the LISTEN,
// the probe and its notification within the listener's two seconds.
type lateProbe struct{ held atomic.Bool }

type lateProbeKey struct{}

func (p *lateProbe) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if strings.Contains(data.SQL, "pg_notify(") && p.held.CompareAndSwap(false, true) {
		return context.WithValue(ctx, lateProbeKey{}, true)
	}
	return ctx
}

func (p *lateProbe) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	if ctx.Value(lateProbeKey{}) != nil {
		<-ctx.Done()
	}
}

// TestListenerProbeLate: on a pool that keeps its sessions, the listener's
// own test notification comes back after its deadline (a loaded server). The
// relay connects again, as after any failure, and then listens: the replica
// is listed, and a commit wakes it. Before, it took a late probe for a
// transaction-pooling proxy and, for the rest of its life, polled with
// neither wake-ups nor presence (relayctl who and the console did not list it).
func TestListenerProbeLate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := harness.Setup(t)
	probe := &lateProbe{}
	pool := pgserver.Pool(t, harness.Server().URL, pgserver.Name(t), 4, func(pc *pgxpool.Config) { pc.ConnConfig.Tracer = probe })
	var logs testlog.Buffer
	cfg := b.Config
	cfg.Interval = time.Hour // past its first pass, only a wake-up makes it pass
	cfg.Logger = logs.Logger()
	rec := harness.NewRecorder("t", nil)
	r, err := relay.New(pool, cfg, rec)
	require.NoError(t, err)
	harness.StartRelay(t, r)

	admin, err := relay.NewAdmin(b.Pool, b.Config)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return len(harness.Replicas(t, admin)) == 1 }, 30*time.Second, 10*time.Millisecond,
		"the replica is listed once its listener is back")
	require.True(t, probe.held.Load(), "the first probe came back late")
	require.Contains(t, logs.String(), "did not come back", "the late probe is logged")
	require.NotContains(t, logs.String(), "wake-ups on commit are off")

	_, err = relay.Enqueue(ctx, b.Pool, b.Table, relay.Outgoing{Type: "t", Key: "k", Payload: []byte(`{"n": 1}`)})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return rec.Count() == 1 }, 30*time.Second, 10*time.Millisecond, "a commit wakes it")
}
