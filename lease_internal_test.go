package relay

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestLeaseClocks: the holder's lease runs out by whichever clock went
// further, so a wall clock stepped back (NTP, a VM resumed) never extends it,
// and one stepped forward can only end it early (a false loss, never a false
// hold).
func TestLeaseClocks(t *testing.T) {
	t.Parallel()
	now := time.Now()

	l := newLease(now)
	require.NoError(t, l.valid(now.Add(guardLeaseTrusted-time.Millisecond)))
	require.ErrorIs(t, l.valid(now.Add(guardLeaseTrusted)), ErrElectionLost)

	back := newLease(now)
	back.wall = back.wall.Add(time.Hour) // the wall clock has since been stepped back an hour
	require.NoError(t, back.valid(now.Add(time.Second)))
	require.ErrorIs(t, back.valid(now.Add(guardLeaseTrusted)), ErrElectionLost, "the monotonic clock still ends it")

	forward := newLease(now)
	forward.wall = forward.wall.Add(-time.Hour) // a pause the monotonic clock did not count
	require.ErrorIs(t, forward.valid(now.Add(time.Second)), ErrElectionLost, "the wall clock ends it")

	require.Less(t, guardLeaseTrusted+time.Second, guardLease, "the holder stops well before the server frees the lock")
	require.Less(t, guardHeartbeat+guardHeartbeatTimeout, guardLease)
	// An idle session's keepalive, late by its whole timeout, still comes
	// before the server ends the session; and it is longer than two of the
	// default Intervals, so that an idle member's passes, taking the two
	// sessions in turn, stand for both keepalives.
	require.Less(t, idleHeartbeat+guardHeartbeatTimeout, guardLease)
	require.Greater(t, idleHeartbeat, 2*intervalDefault+500*time.Millisecond)
}
