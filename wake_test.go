package relay_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/xadm/relay"
	"github.com/xadm/relay/internal/testkit/pgserver"
)

// TestWakeOnCommit: with an Interval of an hour, only the wake-up can deliver
// what producers commit after the first pass.
func TestWakeOnCommit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	started := func(t *testing.T, b *bundle, rec *recorder) *relay.Relay {
		t.Helper()
		cfg := b.cfg
		cfg.Interval = time.Hour
		r := b.newRelay(t, cfg, rec)
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
		b := setup(t)
		rec := newRecorder("t", nil)
		started(t, b, rec)
		for i := range 3 {
			require.NoError(t, pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
				_, err := relay.Enqueue(ctx, tx, b.table, relay.Outgoing{Type: "t", Key: "k", Payload: []byte(`{}`)})
				return err
			}))
			require.Eventually(t, func() bool { return rec.count() == i+1 }, 10*time.Second, time.Millisecond,
				"message %d is delivered on its commit, not at the next Interval", i)
		}
	})

	t.Run("TheTriggerWakesItForPlainSQL", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		require.NoError(t, relay.CreateWakeTrigger(ctx, b.pool, b.table))
		require.NoError(t, relay.CreateWakeTrigger(ctx, b.pool, b.table), "idempotent")
		rec := newRecorder("t", nil)
		started(t, b, rec)
		b.insert(t, "t", "a") // plain SQL, as the JVM writes
		require.Eventually(t, func() bool { return rec.count() == 1 }, 10*time.Second, time.Millisecond)
	})
}

// waitListening waits until a session of the bundle's app LISTENs: its last
// statement is the LISTEN, or the presence it takes once the LISTEN's probe
// came back (internal/election/presence.go).
func waitListening(t *testing.T, b *bundle) {
	t.Helper()
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, b.pool.QueryRow(context.Background(),
			`SELECT count(*) FROM pg_stat_activity WHERE application_name = $1
			  AND (query LIKE 'LISTEN %' OR query LIKE '/* relay presence %')`,
			appNameOf(b.pool)).Scan(&n))
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
	b := setup(t)
	listener := listenOn(t, "relay:"+b.table)

	_, err := relay.Enqueue(ctx, b.pool, b.table, relay.Outgoing{Type: "quiet", Key: "k", Payload: []byte(`{}`)}, relay.WithoutWakeUp())
	require.NoError(t, err)
	_, err = relay.Enqueue(ctx, b.pool, b.table, relay.Outgoing{Type: "loud", Key: "k", Payload: []byte(`{}`)})
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
	b := setup(t)
	require.NoError(t, relay.CreateWakeTrigger(ctx, b.pool, b.table))
	listener := listenOn(t, "relay:"+b.table)
	insert := "INSERT INTO " + pgx.Identifier{b.table}.Sanitize() + " (type, natural_key, payload) VALUES ($1, 'k', '{}')"

	first, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	_, err = first.Exec(ctx, insert, "first")
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, insert, "second") // commits at once, while first holds the token
	require.NoError(t, err)
	require.NoError(t, first.Commit(ctx))
	_, err = b.pool.Exec(ctx, "SELECT pg_notify($1, 'sentinel')", "relay:"+b.table)
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
	b := setup(t)
	bouncer := startBouncer(t, "transaction")
	pool := bouncerPool(t, bouncer.URL, 4, pgx.QueryExecModeExec)
	var logs logBuffer
	cfg := b.cfg
	cfg.ClusterLock = false // the election needs session pooling; the wake-up is what this test is about
	cfg.Interval = 50 * time.Millisecond
	cfg.Logger = logs.Logger()
	rec := newRecorder("t", nil)
	r, err := relay.New(pool, cfg, rec)
	require.NoError(t, err)
	require.NoError(t, r.Start(ctx))
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "wake-ups on commit are off") },
		20*time.Second, 10*time.Millisecond)
	b.insert(t, "t", "a", "b")
	require.Eventually(t, func() bool { return rec.count() == 2 }, 10*time.Second, 5*time.Millisecond, "polling delivers")
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
	b := setup(t)
	probe := &lateProbe{}
	pool := pgserver.Pool(t, server().URL, pgserver.Name(t), 4, func(pc *pgxpool.Config) { pc.ConnConfig.Tracer = probe })
	var logs logBuffer
	cfg := b.cfg
	cfg.Interval = time.Hour // past its first pass, only a wake-up makes it pass
	cfg.Logger = logs.Logger()
	rec := newRecorder("t", nil)
	r, err := relay.New(pool, cfg, rec)
	require.NoError(t, err)
	startRelay(t, r)

	admin, err := relay.NewAdmin(b.pool, b.cfg)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return len(replicasOf(t, admin)) == 1 }, 30*time.Second, 10*time.Millisecond,
		"the replica is listed once its listener is back")
	require.True(t, probe.held.Load(), "the first probe came back late")
	require.Contains(t, logs.String(), "did not come back", "the late probe is logged")
	require.NotContains(t, logs.String(), "wake-ups on commit are off")

	_, err = relay.Enqueue(ctx, b.pool, b.table, relay.Outgoing{Type: "t", Key: "k", Payload: []byte(`{"n": 1}`)})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return rec.count() == 1 }, 30*time.Second, 10*time.Millisecond, "a commit wakes it")
}
