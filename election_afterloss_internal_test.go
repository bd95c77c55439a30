package relay

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xadm/relay/internal/election"
	"github.com/xadm/relay/internal/loop"
)

// TestAPassAfterALossFailsRatherThanCoalesces: right after the loop's pass
// lost its election, the election found taken (here by another session, as
// the lost session's backend holds it until it exits, and a server going
// down may still say so) fails the pass with ErrElectionLost, so that the
// replica backs off and elects again instead of becoming a standby; any
// other pass coalesces as before. TestOutage met it under load: the poll
// after the loss coalesced while the server went down, and the streak of
// failures restarted in the middle of the outage.
func TestAPassAfterALossFailsRatherThanCoalesces(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, cfg := internalConfig(t)
	r, err := New(pool, cfg, SenderFunc("t", func(context.Context, Message) error { return nil }))
	require.NoError(t, err)
	holder, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer holder.Release()
	_, err = holder.Exec(ctx, `SELECT pg_advisory_lock(hashtext($1))`, cfg.lockKey())
	require.NoError(t, err)
	defer func() { _, _ = holder.Exec(ctx, `SELECT pg_advisory_unlock(hashtext($1))`, cfg.lockKey()) }()

	for _, kind := range []loop.Kind{loop.Timed, loop.Elected} {
		res := r.passes.Pass(ctx, kind, loop.Opts{})
		require.NoError(t, res.Err, "kind %v", kind)
		require.True(t, res.Coalesced(), "kind %v: another holds the election", kind)

		res = r.passes.Pass(ctx, kind, loop.Opts{Election: election.Opts{AfterLoss: true}})
		require.ErrorIs(t, res.Err, ErrElectionLost, "kind %v", kind)
		require.False(t, res.Ran, "kind %v", kind)
	}
}
