package election

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestPartitionsIdleCheckTakesFreed: an idle member's timer passes rebalance
// every other pass, and look for work on the relay's own session in between
// (idleCheck); that look sees the election too, so partitions a member let
// go of are taken at the very next pass, as when every pass rebalanced. Here
// the next pass is such a look when the other member leaves. (The whole
// relay's side, the first pass after another replica's Stop holding its
// partitions, is TestPartitionsFreedTakenAtTheNextPass, partitions_relay_test.go.)
func TestPartitionsIdleCheckTakesFreed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	app := newTestApp(t)
	ra := app.replica(t, "a", 4, time.Hour)
	a, other := NewMember(ra).(*memberElection), NewMember(app.replica(t, "b", 4, time.Hour)).(*memberElection)
	own := serveOwn(t, ra)
	for _, e := range []*memberElection{a, other} { // the loops begin
		e.Begin()
		t.Cleanup(func() { e.End(context.Background()) })
	}
	job := func(context.Context, Term) error { return nil }
	// timerPass is the loop's timer pass (internal/loop: Timed): the poll,
	// then the election when the poll finds work; it reports whether it
	// went on to the election.
	timerPass := func(e *memberElection, o Opts) bool {
		t.Helper()
		ran, work, err := e.Poll(ctx, o)
		require.NoError(t, err)
		if !work {
			require.True(t, ran)
			return false
		}
		_, err = e.Run(ctx, o, job)
		require.NoError(t, err)
		return true
	}
	require.Eventually(t, func() bool {
		timerPass(a, Opts{Own: own})
		timerPass(other, Opts{})
		return len(a.Partitions()) == 2 && len(other.Partitions()) == 2
	}, 30*time.Second, 10*time.Millisecond, "two members share the four partitions")
	// An idle pass that rebalanced: the next timer pass looks on the relay's
	// own session, and is over there while nothing changed.
	require.Eventually(t, func() bool {
		if idleCheckNext(a) {
			return true
		}
		require.True(t, timerPass(a, Opts{Own: own}), "a pass that rebalances")
		return false
	}, 30*time.Second, time.Millisecond, "an idle pass that rebalanced")
	require.False(t, timerPass(a, Opts{Own: own}), "the look finds nothing changed: the pass is over")
	require.True(t, timerPass(a, Opts{Own: own}), "the pass after the look rebalances")
	require.True(t, idleCheckNext(a), "a's next timer pass looks instead of rebalancing")

	other.End(ctx)
	require.True(t, timerPass(a, Opts{Own: own}), "the look sees the member that left")
	require.Len(t, a.Partitions(), 4, "the first pass after the other left took the partitions it let go of")
}

// idleCheckNext reports whether e's next timer pass looks for work on the
// relay's own session (idleCheck) instead of rebalancing.
func idleCheckNext(e *memberElection) bool {
	e.m.turn.Lock()
	defer e.m.turn.Unlock()
	return e.m.idle
}
