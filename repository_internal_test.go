package relay

import (
	"context"
	"log/slog"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/xadm/relay/internal/pgserver"
	"github.com/xadm/relay/internal/store"
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

// TestAsyncCommitIsLocalToTheOutcome shows that AsyncCommit's statements turn
// synchronous_commit off for their own transaction, whose commit then does not
// wait for its WAL flush, and leave the pooled session as they found it.
func TestAsyncCommitIsLocalToTheOutcome(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, table := internalTable(t)

	for _, async := range []bool{false, true} {
		repo, err := newRepository(table, 0, async)
		require.NoError(t, err)
		var id int64
		require.NoError(t, pool.QueryRow(ctx, "INSERT INTO "+table+" (type, natural_key, payload) VALUES ('t', 'k', '{}') RETURNING id").Scan(&id))
		pending, zero := pgtype.Text{String: store.StatusPending, Valid: true}, pgtype.Int8{Valid: true}
		m := store.Outcome{ID: id, Status: pending, ReadAttempts: zero, Sent: true}
		for _, ds := range [][]store.Outcome{
			{m}, // one outcome
			{m, {ID: -1, Status: pending, Sent: true}}, // a group
		} {
			var inside string
			require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				if _, err := repo.record(ctx, tx, ds); err != nil {
					return err
				}
				return tx.QueryRow(ctx, "SHOW synchronous_commit").Scan(&inside)
			}))
			want := "on"
			if async {
				want = "off"
			}
			require.Equal(t, want, inside, "async %v, %d outcome(s)", async, len(ds))
			_, err = pool.Exec(ctx, "UPDATE "+table+" SET status = 'PENDING' WHERE id = $1", id)
			require.NoError(t, err)
		}
		var after string
		require.NoError(t, pool.QueryRow(ctx, "SHOW synchronous_commit").Scan(&after))
		require.Equal(t, "on", after, "the session keeps its own setting")
	}
}

func TestIndexNamesOfLongTablesStayApart(t *testing.T) {
	t.Parallel()
	require.Equal(t, `"mensagem_m2m_outbox"`, indexName("mensagem_m2m", "_outbox"), "the brief's name, unchanged")
	long := strings.Repeat("a", 55)
	a, b := indexName(long+"_one", "_outbox_retry"), indexName(long+"_two", "_outbox_retry")
	require.NotEqual(t, a, b, "two long tables with one beginning")
	require.LessOrEqual(t, len(a)-2, 63, "quotes aside, within PostgreSQL's identifier length")
	require.LessOrEqual(t, len(b)-2, 63)
}

// TestSelectRunsOnItsGenericPlan: the select of a batch runs on the plan
// PostgreSQL makes once per connection (genericPlans), never on one made
// anew at each execution, and leaves the pooled session's plan_cache_mode as
// it found it. Planning was most of the select's work on the server, and
// what made the tail under CPU load (docs/performance.md).
func TestSelectRunsOnItsGenericPlan(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, table := internalTable(t)
	_, err := pool.Exec(ctx, "INSERT INTO "+table+" (type, natural_key, payload) SELECT 't', 'k' || g, '{}' FROM generate_series(1, 20) g")
	require.NoError(t, err)
	repo, err := newRepository(table, 2*time.Second, false)
	require.NoError(t, err)
	c, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer c.Release()
	for i := range 8 {
		f, err := repo.fetch(ctx, c, fetchArgs{maxAttempts: 10, types: []string{"t"}, limit: 5, maxBytes: 1 << 20,
			after: math.MinInt64, preflight: i == 0, headers: true, source: table})
		require.NoError(t, err)
		require.Len(t, f.Rows, 5)
	}
	var generic, custom int64
	require.NoError(t, c.QueryRow(ctx, `SELECT coalesce(sum(generic_plans), 0), coalesce(sum(custom_plans), 0)
		FROM pg_prepared_statements WHERE statement LIKE '%m.id = ANY(ARRAY(SELECT c.id%'`).Scan(&generic, &custom))
	require.GreaterOrEqual(t, generic, int64(8), "every select on its generic plan")
	require.Zero(t, custom, "no plan made for one execution")
	var mode string
	require.NoError(t, c.QueryRow(ctx, "SHOW plan_cache_mode").Scan(&mode))
	require.Equal(t, "auto", mode, "the session keeps its own setting")
}
