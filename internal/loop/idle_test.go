package loop_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/xadm/relay"
	"github.com/xadm/relay/internal/testkit/harness"
	"github.com/xadm/relay/internal/testkit/pgserver"
	"github.com/xadm/relay/internal/testkit/pgtrace"
)

// The loop's idle passes, proven from a whole Relay: an idle replica costs
// the server one statement, one round trip, per Interval, and opens before
// its first pass the connections its first message will take.

// TestMain gets a real PostgreSQL (RELAY_TEST_DATABASE_URL, a container, or
// the local binaries) and, after the tests, checks that no goroutine was left
// behind.
func TestMain(m *testing.M) { os.Exit(pgserver.Run(m, "RELAY_TEST_DATABASE_URL")) }

// idleRoundTrips starts a relay of cfg (its Interval 1.1 s: past pgxpool's
// 1s, so that a pooled statement would be pinged first) behind a proxy that
// counts round trips to the server, and returns how many it made over n
// idle passes past its start.
func idleRoundTrips(t *testing.T, cfg relay.Config, n int64) (trips, idle int64) {
	t.Helper()
	proxy, via, err := pgserver.ProxyURL(harness.Server().URL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = proxy.Close() })
	var passes harness.PassCounter
	cfg.Interval = 1100 * time.Millisecond
	cfg.Observer = &passes
	r, err := relay.New(pgserver.Pool(t, via, pgserver.Name(t), 4), cfg, harness.NewRecorder("t", nil))
	require.NoError(t, err)
	harness.StartRelay(t, r)
	// Past the start: the listener's LISTEN and probe, presence, the first
	// pass, and the first of each idle statement, which pgx prepares (its
	// own round trip, once per session).
	require.Eventually(t, func() bool { return passes.N.Load() >= 4 }, 30*time.Second, 10*time.Millisecond)
	trips0, passes0 := proxy.RoundTrips(), passes.N.Load()
	require.Eventually(t, func() bool { return passes.N.Load() >= passes0+n }, 60*time.Second, 10*time.Millisecond)
	return proxy.RoundTrips() - trips0, passes.N.Load() - passes0
}

// TestIdleReplicaOneRoundTripPerInterval counts, with a proxy in front of the
// server, the round trips of an idle started relay: one per Interval, its
// idle poll on its own session — no ping of pgxpool's before it (the pool
// pings a connection idle over a second before it hands it out) and no
// presence keepalive beside it.
func TestIdleReplicaOneRoundTripPerInterval(t *testing.T) {
	t.Parallel()
	trips, idle := idleRoundTrips(t, harness.Setup(t).Config, 4)
	t.Logf("%d round trips over %d idle passes", trips, idle)
	// The count may catch one poll of the next pass already on its way.
	require.LessOrEqual(t, trips, idle+1, "one round trip per idle pass")
}

// TestIdlePartitionedMemberOneRoundTripPerPass: an idle member of the
// partitioned election (Partitions 16, the only member, so every partition is
// its) makes one round trip to the server per pass, its two sessions in turn:
// its rebalance on the membership's session, which asks in the same round
// trip whether its partitions have anything to deliver, then that question
// alone on the relay's own session (presence), and so on. Each stands for its
// session's keepalive, and there is no select, nor the ping pgxpool makes of
// a connection idle over a second. Before: 14 round trips over 4 idle passes;
// then 6 (the rebalance every pass, and the presence keepalive every 2 s).
func TestIdlePartitionedMemberOneRoundTripPerPass(t *testing.T) {
	t.Parallel()
	cfg := harness.Setup(t).Config
	cfg.Partitions = 16
	// Eight passes: long enough for a keepalive of either session (every
	// lease.IdleHeartbeat, 3 s) to be counted if a pass did not stand for it.
	trips, idle := idleRoundTrips(t, cfg, 8)
	t.Logf("%d round trips over %d idle passes", trips, idle)
	// The count may catch one round trip of the next pass already on its way.
	require.LessOrEqual(t, trips, idle+1, "one round trip per idle pass")
}

// TestFirstMessageOpensNoConnection: a started relay opens the pooled
// connections its first message's path takes (the election's, the select's,
// a writer's) before its first pass, so that the first message after an idle
// start waits for no new server backend. Before, its idle polls ran on its own
// session and opened none, and the first message's pass opened them: on a
// quiet machine it reached its Sender 37 ms after its commit instead of 19
// (medians, docs/performance.md).
func TestFirstMessageOpensNoConnection(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := harness.Setup(t)
	var trips pgtrace.Tracer
	pool := pgserver.Pool(t, harness.Server().URL, pgserver.Name(t), 6, func(pc *pgxpool.Config) { pc.ConnConfig.Tracer = &trips })
	var passes harness.PassCounter
	cfg := b.Config
	cfg.Observer = &passes
	rec := harness.NewRecorder("t", nil)
	r, err := relay.New(pool, cfg, rec)
	require.NoError(t, err)
	harness.StartRelay(t, r)
	require.Eventually(t, func() bool { return passes.N.Load() >= 2 }, 30*time.Second, 10*time.Millisecond, "idle passes")

	before := trips.Connects.Load()
	_, err = relay.Enqueue(ctx, b.Pool, b.Table, relay.Outgoing{Type: "t", Key: "k", Payload: []byte(`{"n": 1}`)})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return rec.Count() == 1 }, 30*time.Second, 10*time.Millisecond)
	require.Equal(t, before, trips.Connects.Load(), "the first message's pass opened no connection")
}

// TestIdleCost: three idle replicas, one statement per pass each (the idle
// poll), whoever holds the election, counted by a tracer on their pools.
func TestIdleCost(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := harness.Setup(t)
	cfg := b.Config
	cfg.Interval = 50 * time.Millisecond
	type replica struct {
		r     *relay.Relay
		trips *pgtrace.Tracer
	}
	var replicas []replica
	for range 3 {
		trips := &pgtrace.Tracer{}
		pool := pgserver.Pool(t, harness.Server().URL, pgserver.Name(t), 4, func(pc *pgxpool.Config) { pc.ConnConfig.Tracer = trips })
		r, err := relay.New(pool, cfg, harness.NewRecorder("t", nil))
		require.NoError(t, err)
		require.NoError(t, r.Start(ctx))
		t.Cleanup(func() { _ = r.Stop(ctx) })
		replicas = append(replicas, replica{r, trips})
	}
	passes := func(r *relay.Relay) int64 {
		s := r.Stats()
		return s.PassesElected + s.PassesCoalesced + s.PassesFailed
	}
	for _, rep := range replicas { // past start-up: the table learned, the listener's LISTEN
		require.Eventually(t, func() bool { return passes(rep.r) >= 3 }, 10*time.Second, 5*time.Millisecond)
	}
	type mark struct{ passes, statements int64 }
	before := make([]mark, len(replicas))
	for i, rep := range replicas {
		before[i] = mark{passes(rep.r), rep.trips.Statements()}
	}
	for _, rep := range replicas {
		require.Eventually(t, func() bool { return passes(rep.r) >= before[0].passes+20 }, 30*time.Second, 5*time.Millisecond)
	}
	for i, rep := range replicas {
		p, s := passes(rep.r)-before[i].passes, rep.trips.Statements()-before[i].statements
		t.Logf("replica %d: %d statements in %d idle passes", i, s, p)
		require.LessOrEqual(t, s, p+1, "replica %d: at most one statement per idle pass", i) // +1: a pass may straddle the marks
		require.Zero(t, rep.r.Stats().Sent)
	}
}
