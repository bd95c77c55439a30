package election_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/xadm/relay"
	"github.com/xadm/relay/internal/testkit/harness"
	"github.com/xadm/relay/internal/testkit/pgserver"
)

// TestZombieLeader cuts the elected replica off in the middle of a pass: a
// proxy between it and the server stops forwarding in both directions and
// keeps every socket open, as a host cut off without a FIN, or a sidecar proxy
// whose kernel answers the server's keepalives, looks to the server. The
// server ends the leader's lock session once its lease runs out (no heartbeat
// for 10s), and the other replica, connected directly, takes over within
// harness.TakeoverBound. The cut-off leader starts no new send once its lease is past,
// and only the messages it had in flight (sent, their outcomes not yet
// written) are delivered twice.
func TestZombieLeader(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := harness.Setup(t)
	proxy, viaProxy, err := pgserver.ProxyURL(harness.Server().URL)
	require.NoError(t, err)
	t.Cleanup(func() { proxy.Close() })

	var (
		mu     sync.Mutex
		sends  = map[string][]time.Time{} // replica → when each send started
		byID   = map[int64]int{}          // accepted deliveries per row
		frozen atomic.Int64               // when the proxy froze, unix nanos
	)
	sender := func(replica string, freezeAt int) relay.Sender {
		var calls atomic.Int32
		return relay.SenderFunc("t", func(ctx context.Context, m relay.Message) error {
			mu.Lock()
			sends[replica] = append(sends[replica], time.Now())
			byID[m.ID]++
			mu.Unlock()
			if freezeAt > 0 && int(calls.Add(1)) == freezeAt {
				// The leader is cut off right after the destination accepted
				// this message, before its outcome reaches the database.
				frozen.Store(time.Now().UnixNano())
				proxy.Freeze()
			}
			return nil
		})
	}
	cfg := b.Config
	cfg.Interval = 100 * time.Millisecond
	cfg.GroupOutcomes = 1 // one transaction per outcome: at most 8 wait per worker (the bounds below)
	leader, err := relay.New(pgserver.Pool(t, viaProxy, b.Table+"_a", 4), cfg, sender("a", 5))
	require.NoError(t, err)
	standby, err := relay.New(pgserver.Pool(t, harness.Server().URL, b.Table+"_b", 4), cfg, sender("b", 0))
	require.NoError(t, err)

	// The leader delivers alone until it is cut off.
	b.Insert(t, "t", harness.DistinctKeys("before", 20)...)
	require.NoError(t, leader.Start(ctx))
	require.Eventually(t, func() bool { return frozen.Load() != 0 }, 10*time.Second, 5*time.Millisecond)
	require.NoError(t, standby.Start(ctx))

	// Rows keep coming; the standby must take them over.
	b.Insert(t, "t", harness.DistinctKeys("after", 20)...)
	cut := time.Unix(0, frozen.Load())
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(sends["b"]) > 0
	}, harness.TakeoverBound+5*time.Second, 10*time.Millisecond, "the standby takes over")
	mu.Lock()
	takeover := sends["b"][0].Sub(cut)
	var leaderAfter int
	for _, at := range sends["a"] {
		if at.After(cut) {
			leaderAfter++
		}
	}
	mu.Unlock()
	t.Logf("the standby delivered %s after the leader was cut off (bound %s)", takeover.Round(time.Millisecond), harness.TakeoverBound)
	require.Less(t, takeover, harness.TakeoverBound)
	require.LessOrEqual(t, leaderAfter, 8, "the cut-off leader sends at most what its writer's pipeline holds, then nothing")

	// The standby delivers everything; the leader comes back and stays out.
	require.Eventually(t, func() bool { return b.CountStatus(t, "SENT") == 40 }, 20*time.Second, 10*time.Millisecond)
	proxy.Thaw()
	stopCtx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	require.NoError(t, standby.Stop(stopCtx))
	_ = leader.Stop(stopCtx) // its last pass may end in a lost election
	require.NoError(t, leader.Stop(stopCtx), "a second Stop waits for whatever the first left")

	mu.Lock()
	defer mu.Unlock()
	dups := 0
	for id, n := range byID {
		require.LessOrEqual(t, n, 2, "row %d", id)
		dups += n - 1
	}
	// What was in flight at the cut: the message being sent, and the sent
	// ones whose outcomes waited for the writer (outcomes.go, outcomePipeline: 8, with GroupOutcomes 1).
	require.LessOrEqual(t, dups, 1+8, "only the messages in flight at the cut are delivered twice")
	require.Len(t, byID, 40)
	require.True(t, harness.LockFree(t, b.Config.AppName))
	t.Logf("leader sent %d, standby sent %d, %d delivered twice", len(sends["a"]), len(sends["b"]), dups)
}
