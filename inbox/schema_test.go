package inbox_test

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/xadm/relay/inbox"
	"github.com/xadm/relay/internal/testkit/pgserver"
)

// TestCreateTable: replicas creating the tables at once all succeed, in a
// schema of their own; long names get distinct derived names; a bad name is
// refused before anything runs.
func TestCreateTable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgserver.Pool(t, pgserver.Shared().URL, pgserver.Name(t), 8)
	schema := pgserver.Name(t)
	_, err := pool.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize())
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP SCHEMA "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	})

	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() { require.NoError(t, inbox.CreateTable(ctx, pool, schema+".inbox")) })
	}
	wg.Wait()
	// Two long names alike but for their end get distinct derived names.
	long := strings.Repeat("a", 63)
	require.NoError(t, inbox.CreateTable(ctx, pool, schema+"."+long))
	require.NoError(t, inbox.CreateTable(ctx, pool, schema+"."+long[:60]+"bcd"))
	rows, err := pool.Query(ctx, "SELECT relname FROM pg_class WHERE relnamespace = $1::regnamespace ORDER BY relname", schema)
	require.NoError(t, err)
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Len(t, names, 3*5, "per table: itself, its primary key, its BRIN index, the keys table and its primary key: %v", names)
	require.Contains(t, names, "inbox_keys")
	require.Contains(t, names, "inbox_received_at")

	ib, err := inbox.New(pool, inbox.Config{Table: schema + "." + long})
	require.NoError(t, err)
	got, err := ib.Receive(ctx, msg("k", 1), func(context.Context, pgx.Tx, inbox.Message) error { return nil })
	require.NoError(t, err)
	require.Equal(t, inbox.Applied, got)

	require.ErrorContains(t, inbox.CreateTable(ctx, pool, "x;y"), `inbox: table "x;y": "x;y" is not an identifier`)
	_, err = inbox.SchemaSQL("a.b.c")
	require.ErrorContains(t, err, `inbox: table "a.b.c": want name or schema.name`)
	ddl, err := inbox.SchemaSQL("receiver.Inbox")
	require.NoError(t, err)
	require.Contains(t, ddl, `CREATE TABLE IF NOT EXISTS "receiver"."Inbox" (`)
	require.Contains(t, ddl, `CREATE TABLE IF NOT EXISTS "receiver"."Inbox_keys" (`)
}
