package relay

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xadm/relay/internal/pgserver"
)

// TestNewWriterAfterAFailureHoldsNothing: a worker that starts after another
// worker's outcome could not be recorded (a read-only cutover) gets no writer,
// and keeps no connection either. Before, its writer's connection was taken
// and never given back, and the pool's Close waited for it for ever
// (internal/faultstest's TestReadOnlyCutover, 1 run in ~5 under -race).
func TestNewWriterAfterAFailureHoldsNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	table := pgserver.Name(t)
	pool := pgserver.Pool(t, pgserver.Shared().URL, table, 4)
	require.NoError(t, CreateTable(ctx, pool, table))
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP TABLE "+table) })
	failed := errors.New("cannot execute UPDATE in a read-only transaction")
	for _, group := range []int{0, 1} { // adaptive, each: the strategies whose writers hold a connection
		cfg := DefaultConfig()
		cfg.AppName, cfg.Table, cfg.GroupOutcomes = table, table, group
		r, err := New(pool, cfg, SenderFunc("t", func(context.Context, Message) error { return nil }))
		require.NoError(t, err)
		rc := r.newRecorder(ctx, &passResult{})
		rc.keep(failed) // another worker's outcome could not be written
		w, err := rc.newWriter(ctx)
		require.ErrorIs(t, err, failed, "GroupOutcomes %d", group)
		require.Nil(t, w)
		require.Zero(t, pool.Stat().AcquiredConns(), "GroupOutcomes %d: the writer that was not started holds no connection", group)
	}
}
