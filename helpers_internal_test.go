package relay

import (
	"context"
	"log/slog"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/xadm/relay/internal/testkit/pgserver"
)

// internalTable is a pool on the shared server and a table of the test's
// name on it, dropped at its end.
func internalTable(t *testing.T) (*pgxpool.Pool, string) {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), pgserver.Shared().URL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	table := pgserver.Name(t)
	require.NoError(t, CreateTable(context.Background(), pool, table))
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP TABLE "+table) })
	return pool, table
}

// internalConfig is internalTable's pool, and a relay configuration for its
// table, with the test's name as app and a logger that drops everything.
func internalConfig(t *testing.T) (*pgxpool.Pool, Config) {
	t.Helper()
	pool, table := internalTable(t)
	cfg := DefaultConfig()
	cfg.AppName, cfg.Table = pgserver.Name(t), table
	cfg.Logger = slog.New(slog.DiscardHandler)
	return pool, cfg
}
