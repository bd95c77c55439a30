package relay

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/xadm/relay/internal/lease"
)

// TestIntervalAndIdleKeepalive: an idle session's keepalive (internal/lease)
// is longer than two of the default Intervals, so that an idle member's
// passes, taking its two sessions in turn, stand for both keepalives.
func TestIntervalAndIdleKeepalive(t *testing.T) {
	t.Parallel()
	require.Greater(t, lease.IdleHeartbeat, 2*intervalDefault+500*time.Millisecond)
}
