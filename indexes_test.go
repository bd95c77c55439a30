package relay_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/xadm/relay"
)

// TestMissingIndexesSaidOutLoud: on a table the JVM's migration made (no
// indexes), the relay logs once, at WARN, before its first pass, which of its
// indexes are missing and SchemaSQL's statements that add them; Admin's
// Overview lists them; once added (the statements run as given), none is
// missing. An equivalent index under another name counts as present.
func TestMissingIndexesSaidOutLoud(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPool(t, 6)
	table := jvmTableOf(t, pool)
	_, err := pool.Exec(ctx, "CREATE INDEX jvm_key ON "+table+" (natural_key, id) WHERE status IN ('PENDING', 'ERROR')")
	require.NoError(t, err)

	var logs logBuffer
	cfg := relay.DefaultConfig()
	cfg.AppName, cfg.Table, cfg.Logger = table, table, logs.Logger()
	r, err := relay.New(pool, cfg, newRecorder("t", nil))
	require.NoError(t, err)
	for range 3 {
		_, err = r.Run(ctx)
		require.NoError(t, err)
	}
	warned := logs.Lines("level=WARN", "the table lacks indexes the pass relies on")
	require.Len(t, warned, 1, "once, however many passes")
	for _, suffix := range []string{"_outbox", "_outbox_pending", "_outbox_error"} {
		require.Contains(t, warned[0], table+suffix)
	}
	require.NotContains(t, warned[0], table+"_outbox_key ", "jvm_key is the same index under another name")
	require.Contains(t, warned[0], "CREATE INDEX IF NOT EXISTS")

	admin, err := relay.NewAdmin(pool, cfg)
	require.NoError(t, err)
	o, err := admin.Overview(ctx)
	require.NoError(t, err)
	require.Len(t, o.MissingIndexes, 3)
	for _, m := range o.MissingIndexes {
		require.True(t, strings.HasPrefix(m.Statement, "CREATE INDEX IF NOT EXISTS "+pgx.Identifier{m.Name}.Sanitize()+" ON "), m.Statement)
		_, err := pool.Exec(ctx, m.Statement)
		require.NoError(t, err, "the statement given adds the index")
	}
	o, err = admin.Overview(ctx)
	require.NoError(t, err)
	require.Empty(t, o.MissingIndexes)

	// A table of SchemaSQL lacks nothing, and its relay says nothing.
	b := setup(t)
	var quiet logBuffer
	cfg2 := b.cfg
	cfg2.Logger = quiet.Logger()
	_, err = b.newRelay(t, cfg2, newRecorder("t", nil)).Run(ctx)
	require.NoError(t, err)
	require.Empty(t, quiet.Lines("lacks indexes"))
}

// TestFailedRowsIndexIsNoKeyIndex: the failed rows' index of the releases
// before (natural_key, id WHERE status = 'ERROR') cannot find a paused type's
// waiting rows by key: the key index is reported missing beside it.
func TestFailedRowsIndexIsNoKeyIndex(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPool(t, 4)
	table := jvmTableOf(t, pool)
	_, err := pool.Exec(ctx, "CREATE INDEX old_retry ON "+table+" (natural_key, id) WHERE direction = 'OUT' AND status = 'ERROR'")
	require.NoError(t, err)
	cfg := relay.DefaultConfig()
	cfg.AppName, cfg.Table = table, table
	admin, err := relay.NewAdmin(pool, cfg)
	require.NoError(t, err)
	o, err := admin.Overview(ctx)
	require.NoError(t, err)
	var names []string
	for _, m := range o.MissingIndexes {
		names = append(names, m.Name)
	}
	require.Contains(t, names, table+"_outbox_key")
}

// TestCachedIDsSaidOutLoud: a table whose id sequence hands each session a
// block of ids (CACHE > 1) cannot keep each key's order by id, since a
// session's cached ids may be lower than ids already committed (decision
// 0041): the relay says so, once, and names the fix.
func TestCachedIDsSaidOutLoud(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	var seq string
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT pg_get_serial_sequence($1, 'id')", b.table).Scan(&seq))
	_, err := b.pool.Exec(ctx, "ALTER SEQUENCE "+seq+" CACHE 20")
	require.NoError(t, err)
	var logs logBuffer
	cfg := b.cfg
	cfg.Logger = logs.Logger()
	r := b.newRelay(t, cfg, newRecorder("t", nil))
	for range 2 {
		_, err = r.Run(ctx)
		require.NoError(t, err)
	}
	warned := logs.Lines("level=WARN", "the sequence of the table's id caches ids")
	require.Len(t, warned, 1, "once")
	require.Contains(t, warned[0], "cache=20")
	require.Contains(t, warned[0], "CACHE 1")

	// With CACHE 1, the default of bigserial, nothing is said.
	_, err = b.pool.Exec(ctx, "ALTER SEQUENCE "+seq+" CACHE 1")
	require.NoError(t, err)
	var quiet logBuffer
	cfg.Logger = quiet.Logger()
	_, err = b.newRelay(t, cfg, newRecorder("t", nil)).Run(ctx)
	require.NoError(t, err)
	require.Empty(t, quiet.Lines("the sequence of the table's id caches ids"))
}
