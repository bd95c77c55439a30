package election

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestKeptElectionUntilEnd: while the loop keeps the Polled election
// between its passes (Opts.Keep), every pass runs under the same election
// (one holder, one session, one start), a standby's pass (RunIfElected's)
// coalesces on it, and End, the loop's end at Stop, lets go of it before it
// returns. (The loop's side, that a started relay's Stop lets go of the
// election it kept, is the root's TestKeptElectionLetGoOfAtStop.)
func TestKeptElectionUntilEnd(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	app := newTestApp(t)
	e := polled(app.replica(t, "a", 1, 0))
	standby := polled(app.replica(t, "b", 1, 0))

	passes := 0
	pass := func() {
		t.Helper()
		ran, err := e.Run(ctx, Opts{Keep: func() bool { return true }}, func(context.Context, Term) error {
			passes++
			return nil
		})
		require.NoError(t, err)
		require.True(t, ran)
	}
	holder := func() *Held {
		t.Helper()
		kept, _ := e.Keeps()
		require.True(t, kept, "kept between passes")
		pids := holders(t, app.key)
		require.Len(t, pids, 1, "one holder between passes: the kept election")
		e.mu.Lock()
		defer e.mu.Unlock()
		require.Equal(t, int32(e.kept.sess.pid), pids[0], "held on the kept election's session")
		return e.kept
	}
	pass()
	first := holder()
	for range 5 {
		pass()
		h := holder()
		require.Same(t, first, h, "the same election: its session, and its start")
		ran, err := standby.Run(ctx, Opts{}, func(context.Context, Term) error {
			t.Error("the standby ran a pass under the kept election")
			return nil
		})
		require.NoError(t, err)
		require.False(t, ran, "a standby coalesces on the kept election")
	}
	e.End(ctx)
	require.Empty(t, holders(t, app.key), "End lets go of the kept election before it returns")
	require.Equal(t, 6, passes)
}
