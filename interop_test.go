package relay_test

import (
	"context"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/xadm/relay"
	"github.com/xadm/relay/internal/testkit/pgserver"
)

// TestRowsWrittenByOthers loads testdata/jvm_rows.sql, rows as the JVM service
// and relay leave them, into a table created by the library, and checks the Go
// relay delivers exactly the rows the brief's predicate selects.
func TestRowsWrittenByOthers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPool(t, 4)
	schema := pgserver.Name(t)
	_, err := pool.Exec(ctx, "CREATE SCHEMA "+schema)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE") })
	table := schema + ".mensagem_m2m"
	require.NoError(t, relay.CreateTable(ctx, pool, table))

	rows, err := os.ReadFile("testdata/jvm_rows.sql")
	require.NoError(t, err)
	require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET LOCAL search_path TO "+schema); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, string(rows))
		return err
	}))

	cfg := relay.DefaultConfig()
	cfg.AppName = "billing"
	cfg.Table = table
	cfg.Logger = testLogger(t)
	orders, invoices := newRecorder("order", nil), newRecorder("invoice", nil)
	r, err := relay.New(pool, cfg, orders, invoices)
	require.NoError(t, err)
	n, err := r.Run(ctx)
	require.NoError(t, err)

	var keys []string
	for _, rec := range []*recorder{orders, invoices} {
		for _, m := range rec.Sent {
			keys = append(keys, m.Key)
		}
	}
	slices.Sort(keys)
	require.Equal(t, []string{"deliver-error-below", "deliver-pending", "deliver-pending-retried"}, keys)
	require.Equal(t, 3, n)
	for _, k := range keys {
		require.True(t, strings.HasPrefix(k, "deliver-"))
	}
	var unsent int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+table+
		" WHERE natural_key LIKE 'deliver-%' AND status <> 'SENT'").Scan(&unsent))
	require.Zero(t, unsent)
	var touched int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+table+
		" WHERE natural_key LIKE 'skip-%' AND updated_at > now() - interval '1 minute'").Scan(&touched))
	require.Zero(t, touched, "rows the relay must skip are left exactly as they were")
}
