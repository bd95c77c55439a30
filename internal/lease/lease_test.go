package lease

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestClocks: the holder's lease runs out by whichever clock went further, so
// a wall clock stepped back (NTP, a VM resumed) never extends it, and one
// stepped forward can only end it early (a false loss, never a false hold).
func TestClocks(t *testing.T) {
	t.Parallel()
	now := time.Now()

	l := New(now)
	require.NoError(t, l.Valid(now.Add(Trusted-time.Millisecond)))
	require.ErrorIs(t, l.Valid(now.Add(Trusted)), ErrLost)

	back := New(now)
	back.stepWall(time.Hour) // the wall clock has since been stepped back an hour
	require.NoError(t, back.Valid(now.Add(time.Second)))
	require.ErrorIs(t, back.Valid(now.Add(Trusted)), ErrLost, "the monotonic clock still ends it")

	forward := New(now)
	forward.stepWall(-time.Hour) // a pause the monotonic clock did not count
	require.ErrorIs(t, forward.Valid(now.Add(time.Second)), ErrLost, "the wall clock ends it")

	require.Less(t, Trusted+time.Second, Server, "the holder stops well before the server frees the lock")
	require.Less(t, Heartbeat+HeartbeatTimeout, Server)
	// An idle session's keepalive, late by its whole timeout, still comes
	// before the server ends the session.
	require.Less(t, IdleHeartbeat+HeartbeatTimeout, Server)
}

// TestContext: a job's context carries its election's lease; a job without
// one is always valid.
func TestContext(t *testing.T) {
	t.Parallel()
	require.NoError(t, Valid(context.Background()))
	l := New(time.Now().Add(-Trusted))
	require.ErrorIs(t, Valid(With(context.Background(), l)), ErrLost)
	l.Renew(time.Now())
	require.NoError(t, Valid(With(context.Background(), l)))
}
