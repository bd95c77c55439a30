package relay

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestWakeWindow: a producer process tries to wake a type and table at most
// once per wakeUpWindow, and notifies without the token when it has not
// notified for wakeForceAfter.
func TestWakeWindow(t *testing.T) {
	t.Parallel()
	ch := "relay:" + t.Name()
	ms := int64(time.Millisecond)
	w, force := wakeUpWindow.Load(), wakeForceAfter.Load()
	attempt := func(typ string, now int64) (bool, bool) {
		st, f := wakeAttemptAt(ch, typ, now)
		return st != nil, f
	}
	a, f := attempt("t", 1*ms)
	require.True(t, a, "the first tries")
	require.True(t, f, "and notifies, token or not: nothing was notified yet")
	st, _ := wakeAttemptAt(ch, "v", 1*ms)
	st.notified.Store(1 * ms)
	a, _ = attempt("t", 1*ms+w-1)
	require.False(t, a, "within the window")
	a, _ = attempt("u", 1*ms+1)
	require.True(t, a, "another type has its own window")
	a, f = attempt("v", 1*ms+w)
	require.True(t, a, "the window has passed")
	require.False(t, f, "notified within wakeForceAfter: only with the token")
	a, _ = attempt("v", 1*ms+w+1)
	require.False(t, a)
	a, f = attempt("v", 1*ms+force)
	require.True(t, a)
	require.True(t, f, "no NOTIFY for wakeForceAfter: notifies without the token")
}
