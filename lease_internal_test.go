package relay

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestLeaseAndInterval: an idle session's keepalive (internal/lease) is
// longer than two of the default Intervals, so that an idle member's passes,
// taking its two sessions in turn, stand for both keepalives; and the
// guard's heartbeat, late by its whole timeout, comes before the server ends
// the session. (internal/lease tests the lease's clocks.)
func TestLeaseAndInterval(t *testing.T) {
	t.Parallel()
	require.Greater(t, idleHeartbeat, 2*intervalDefault+500*time.Millisecond)
	require.Less(t, guardHeartbeat+guardHeartbeatTimeout, guardLease)
}
