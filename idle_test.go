package relay_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/xadm/relay"
	"github.com/xadm/relay/internal/testkit/pgserver"
	"github.com/xadm/relay/internal/tools/benchkit"
)

// passCounter is an Observer that counts passes.
type passCounter struct{ n atomic.Int64 }

func (c *passCounter) PassDone(relay.PassReport)       { c.n.Add(1) }
func (c *passCounter) MessageDone(relay.MessageReport) {}

// idleRoundTrips starts a relay of cfg (its Interval 1.1 s: past pgxpool's
// 1s, so that a pooled statement would be pinged first) behind a proxy that
// counts round trips to the server, and returns how many it made over n
// idle passes past its start.
func idleRoundTrips(t *testing.T, cfg relay.Config, n int64) (trips, idle int64) {
	t.Helper()
	proxy, via, err := pgserver.ProxyURL(server().URL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = proxy.Close() })
	var passes passCounter
	cfg.Interval = 1100 * time.Millisecond
	cfg.Observer = &passes
	r, err := relay.New(pgserver.Pool(t, via, pgserver.Name(t), 4), cfg, newRecorder("t", nil))
	require.NoError(t, err)
	startRelay(t, r)
	// Past the start: the listener's LISTEN and probe, presence, the first
	// pass, and the first of each idle statement, which pgx prepares (its
	// own round trip, once per session).
	require.Eventually(t, func() bool { return passes.n.Load() >= 4 }, 30*time.Second, 10*time.Millisecond)
	trips0, passes0 := proxy.RoundTrips(), passes.n.Load()
	require.Eventually(t, func() bool { return passes.n.Load() >= passes0+n }, 60*time.Second, 10*time.Millisecond)
	return proxy.RoundTrips() - trips0, passes.n.Load() - passes0
}

// TestIdleReplicaOneRoundTripPerInterval counts, with a proxy in front of the
// server, the round trips of an idle started relay: one per Interval, its
// idle poll on its own session — no ping of pgxpool's before it (the pool
// pings a connection idle over a second before it hands it out) and no
// presence keepalive beside it.
func TestIdleReplicaOneRoundTripPerInterval(t *testing.T) {
	t.Parallel()
	trips, idle := idleRoundTrips(t, setup(t).cfg, 4)
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
	cfg := setup(t).cfg
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
	b := setup(t)
	var trips benchkit.Tracer
	pool := pgserver.Pool(t, server().URL, pgserver.Name(t), 6, func(pc *pgxpool.Config) { pc.ConnConfig.Tracer = &trips })
	var passes passCounter
	cfg := b.cfg
	cfg.Observer = &passes
	rec := newRecorder("t", nil)
	r, err := relay.New(pool, cfg, rec)
	require.NoError(t, err)
	startRelay(t, r)
	require.Eventually(t, func() bool { return passes.n.Load() >= 2 }, 30*time.Second, 10*time.Millisecond, "idle passes")

	before := trips.Connects.Load()
	_, err = relay.Enqueue(ctx, b.pool, b.table, relay.Outgoing{Type: "t", Key: "k", Payload: []byte(`{"n": 1}`)})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return rec.count() == 1 }, 30*time.Second, 10*time.Millisecond)
	require.Equal(t, before, trips.Connects.Load(), "the first message's pass opened no connection")
}
