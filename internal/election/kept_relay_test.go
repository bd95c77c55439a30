package election_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/xadm/relay"
	"github.com/xadm/relay/internal/testkit/harness"
	"github.com/xadm/relay/internal/testkit/pgserver"
)

// The kept election (elections.go), proven from a whole Relay: the loop
// keeps the election it won between its passes while work keeps arriving,
// and lets go of it when nothing comes, on Stop (the root's
// TestKeptElectionLetGoOfAtStop), and when its session is lost.

// TestKeptElectionTrickle counts, with a proxy in front of the server, the
// round trips of a started relay fed one message at a time: its woken passes
// run on the election kept since the first, so a message costs its select,
// its outcome and, when it comes first, the follow-up's select — not a lock
// and an unlock for each pass besides. Once nothing comes,
// the relay lets go of it within keptIdle, though its Interval is an hour.
func TestKeptElectionTrickle(t *testing.T) {
	t.Parallel()
	b := harness.Setup(t)
	proxy, via, err := pgserver.ProxyURL(harness.Server().URL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = proxy.Close() })
	var passes harness.PassCounter
	cfg := b.Config
	cfg.Interval = time.Hour
	cfg.Observer = &passes
	rec := harness.NewRecorder("t", nil)
	r, err := relay.New(pgserver.Pool(t, via, pgserver.Name(t), 4), cfg, rec)
	require.NoError(t, err)
	harness.StartRelay(t, r)
	require.Eventually(t, func() bool { return passes.N.Load() >= 1 }, 30*time.Second, time.Millisecond)
	b.Trickle(t, rec, 0, 1) // the election won, and kept

	const n = 20
	trips0 := proxy.RoundTrips()
	b.Trickle(t, rec, 1, n)
	trips := proxy.RoundTrips() - trips0
	t.Logf("%d round trips for %d messages written one at a time: %.1f each", trips, n, float64(trips)/n)
	// 2 a message here (3 when the follow-up comes before the next message),
	// and the heartbeats and presence beats of a slow machine; 4.2 when each
	// pass took and released the lock.
	require.LessOrEqual(t, float64(trips)/n, 3.6, "round trips per message")
	require.Equal(t, n+1, rec.Count(), "each message once")

	require.Eventually(t, func() bool { return harness.LockFree(t, cfg.AppName) }, 30*time.Second, 10*time.Millisecond,
		"the election is let go of once nothing comes, not an Interval later")
}

// TestKeptElectionLostBetweenPasses: the kept election's session is ended
// between two messages (a failover, pg_terminate_backend): the next messages
// are delivered and recorded, under an election won again. (A pass that starts before the watch has seen the session end
// fails and is followed at once; one that coalesced on the dying session's
// lock polls within the Interval.)
func TestKeptElectionLostBetweenPasses(t *testing.T) {
	t.Parallel()
	b := harness.Setup(t)
	cfg := b.Config
	cfg.Interval = time.Second // a replica that coalesced on its own dying session polls again within it
	rec := harness.NewRecorder("t", nil)
	r := b.NewRelay(t, cfg, rec)
	harness.StartRelay(t, r)
	admin, err := relay.NewAdmin(b.Pool, cfg)
	require.NoError(t, err)
	var old int
	for n := 0; old == 0; n++ { // kept after a delivery, until a quiet second
		b.Trickle(t, rec, n, 1)
		hs, err := admin.Election(context.Background())
		require.NoError(t, err)
		if len(hs) == 1 {
			old = hs[0].PID
		}
	}
	sent := rec.Count()
	var ended bool
	require.NoError(t, b.Pool.QueryRow(context.Background(), "SELECT pg_terminate_backend($1)", old).Scan(&ended))
	require.True(t, ended)

	ids := b.Trickle(t, rec, sent, 2)
	for _, id := range ids { // sent, then recorded
		require.Eventually(t, func() bool { return b.State(t, id).Status == "SENT" }, 30*time.Second, time.Millisecond, "message %d", id)
	}
	require.Equal(t, sent+2, b.CountStatus(t, "SENT"), "each recorded once")
}
