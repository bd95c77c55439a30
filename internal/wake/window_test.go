package wake

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestWakeWindow: a producer process whose Enqueues of a type and table come
// densely tries to wake the relays at most once per UpWindow, a sparse one
// on every Enqueue, and an attempt notifies without the token when the process
// has not notified for ForceAfter.
func TestWakeWindow(t *testing.T) {
	t.Parallel()
	ch := "relay:" + t.Name()
	ms := int64(time.Millisecond)
	wakes := NewWindows(UpWindow, DenseGap, ForceAfter)
	w, gap, force := wakes.window, wakes.denseGap, wakes.forceAfter
	require.Less(t, gap, w)
	attempt := func(typ string, now int64) (bool, bool) {
		st, f := wakes.AttemptAt(ch, typ, now)
		return st != nil, f
	}
	a, f := attempt("t", 1*ms)
	require.True(t, a, "the first tries")
	require.True(t, f, "and notifies, token or not: nothing was notified yet")
	a, _ = attempt("t", 1*ms+gap-1)
	require.False(t, a, "dense, within the window")
	a, _ = attempt("u", 1*ms+1)
	require.True(t, a, "another type has its own window")
	a, _ = attempt("t", 1*ms+2*gap)
	require.True(t, a, "sparse: tries, window or not")

	st, _ := wakes.AttemptAt(ch, "v", 1*ms)
	st.notified.Store(1 * ms)
	now := 1 * ms
	for now+gap/2 < 1*ms+w { // dense Enqueues through the window
		now += gap / 2
		a, _ = attempt("v", now)
		require.False(t, a, "dense, within the window")
	}
	a, f = attempt("v", now+gap/2)
	require.True(t, a, "dense, the window has passed")
	require.False(t, f, "notified within ForceAfter: only with the token")
	a, f = attempt("v", 1*ms+force+gap)
	require.True(t, a)
	require.True(t, f, "no NOTIFY for ForceAfter: notifies without the token")
}
