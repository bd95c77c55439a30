package relay

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestWakeWindow: without the token, a producer process notifies a type and
// table at most once per wakeUpWindow.
func TestWakeWindow(t *testing.T) {
	t.Parallel()
	ch := "relay:" + t.Name()
	ms := int64(time.Millisecond)
	wakes := newWakeWindows(wakeUpWindow)
	w := int64(wakes.window)
	require.True(t, wakes.dueAt(ch, "t", 1*ms), "the first is due")
	require.False(t, wakes.dueAt(ch, "t", 1*ms+w-1), "within the window")
	require.True(t, wakes.dueAt(ch, "u", 1*ms+1), "another type has its own window")
	require.True(t, wakes.dueAt(ch, "t", 1*ms+w), "the window has passed")
	require.False(t, wakes.dueAt(ch, "t", 1*ms+w+1))
}
