package relay_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/xadm/relay"
	"github.com/xadm/relay/internal/testkit/pgserver"
)

// The kept election (internal/election, elections.go): the loop keeps the election it won between
// its passes while work keeps arriving, and lets go of it when nothing comes,
// on Stop, and when its session is lost.

// TestKeptElectionTrickle counts, with a proxy in front of the server, the
// round trips of a started relay fed one message at a time: its woken passes
// run on the election kept since the first, so a message costs its select,
// its outcome and, when it comes first, the follow-up's select — not a lock
// and an unlock for each pass besides. Once nothing comes,
// the relay lets go of it within keptIdle, though its Interval is an hour.
func TestKeptElectionTrickle(t *testing.T) {
	t.Parallel()
	b := setup(t)
	proxy, via, err := pgserver.ProxyURL(server().URL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = proxy.Close() })
	var passes passCounter
	cfg := b.cfg
	cfg.Interval = time.Hour
	cfg.Observer = &passes
	rec := newRecorder("t", nil)
	r, err := relay.New(pgserver.Pool(t, via, pgserver.Name(t), 4), cfg, rec)
	require.NoError(t, err)
	startRelay(t, r)
	require.Eventually(t, func() bool { return passes.n.Load() >= 1 }, 30*time.Second, time.Millisecond)
	b.trickle(t, rec, 0, 1) // the election won, and kept

	const n = 20
	trips0 := proxy.RoundTrips()
	b.trickle(t, rec, 1, n)
	trips := proxy.RoundTrips() - trips0
	t.Logf("%d round trips for %d messages written one at a time: %.1f each", trips, n, float64(trips)/n)
	// 2 a message here (3 when the follow-up comes before the next message),
	// and the heartbeats and presence beats of a slow machine; 4.2 when each
	// pass took and released the lock.
	require.LessOrEqual(t, float64(trips)/n, 3.6, "round trips per message")
	require.Equal(t, n+1, rec.count(), "each message once")

	require.Eventually(t, func() bool { return lockFree(t, cfg.AppName) }, 30*time.Second, 10*time.Millisecond,
		"the election is let go of once nothing comes, not an Interval later")
}

// TestKeptElectionLostBetweenPasses: the kept election's session is ended
// between two messages (a failover, pg_terminate_backend): the next messages
// are delivered and recorded, under an election won again. (A pass that starts before the watch has seen the session end
// fails and is followed at once; one that coalesced on the dying session's
// lock polls within the Interval.)
func TestKeptElectionLostBetweenPasses(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.cfg
	cfg.Interval = time.Second // a replica that coalesced on its own dying session polls again within it
	rec := newRecorder("t", nil)
	r := b.newRelay(t, cfg, rec)
	startRelay(t, r)
	admin, err := relay.NewAdmin(b.pool, cfg)
	require.NoError(t, err)
	var old int
	for n := 0; old == 0; n++ { // kept after a delivery, until a quiet second
		b.trickle(t, rec, n, 1)
		hs, err := admin.Election(context.Background())
		require.NoError(t, err)
		if len(hs) == 1 {
			old = hs[0].PID
		}
	}
	sent := rec.count()
	var ended bool
	require.NoError(t, b.pool.QueryRow(context.Background(), "SELECT pg_terminate_backend($1)", old).Scan(&ended))
	require.True(t, ended)

	ids := b.trickle(t, rec, sent, 2)
	for _, id := range ids { // sent, then recorded
		require.Eventually(t, func() bool { return b.state(t, id).Status == "SENT" }, 30*time.Second, time.Millisecond, "message %d", id)
	}
	require.Equal(t, sent+2, b.countStatus(t, "SENT"), "each recorded once")
}
