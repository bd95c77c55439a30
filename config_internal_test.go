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

// TestDefaultRetriesOutlastAnOutage: with the default MaxAttempts and
// RetryBackoff, under retryBackoffMax, a message dies only after 1022s of
// failures (2 + 4 + ... + 512), so a destination down for 15 minutes loses
// nothing (lived at a hundredth of the scale: TestDefaultsSurviveAnOutage).
func TestDefaultRetriesOutlastAnOutage(t *testing.T) {
	t.Parallel()
	cfg := DefaultConfig()
	var survives time.Duration
	for a := 1; a < cfg.MaxAttempts; a++ { // the wait after the a-th failure
		survives += min(cfg.RetryBackoff*time.Duration(1<<(a-1)), retryBackoffMax)
	}
	require.Equal(t, 1022*time.Second, survives)
	require.Greater(t, survives, 15*time.Minute)
}
