package store

import (
	"context"
	"math"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/xadm/relay/internal/testkit/pgserver"
)

// TestMain gets a real PostgreSQL (RELAY_TEST_DATABASE_URL, or the local
// binaries) for the tests of the statements' effects and plans.
func TestMain(m *testing.M) { os.Exit(pgserver.Run(m, "RELAY_TEST_DATABASE_URL")) }

// table is a pool on the shared server and a table of the test's name on
// it, dropped at its end.
func table(t *testing.T) (*pgxpool.Pool, string) {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), pgserver.Shared().URL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	name := pgserver.Name(t)
	require.NoError(t, CreateTable(context.Background(), pool, name))
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP TABLE "+name) })
	return pool, name
}

// fetcher is the statements of table, with a backoff of 2s, and a
// connection of pool to run them on, released at the test's end.
func fetcher(t *testing.T, pool *pgxpool.Pool, table string) (*Table, *pgxpool.Conn) {
	t.Helper()
	repo, err := NewTable(table, 2*time.Second, time.Hour, false)
	require.NoError(t, err)
	c, err := pool.Acquire(context.Background())
	require.NoError(t, err)
	t.Cleanup(c.Release)
	return repo, c
}

// TestAsyncCommitIsLocalToTheOutcome shows that AsyncCommit's statements turn
// synchronous_commit off for their own transaction, whose commit then does not
// wait for its WAL flush, and leave the pooled session as they found it.
func TestAsyncCommitIsLocalToTheOutcome(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, table := table(t)

	for _, async := range []bool{false, true} {
		repo, err := NewTable(table, 0, time.Hour, async)
		require.NoError(t, err)
		var id int64
		require.NoError(t, pool.QueryRow(ctx, "INSERT INTO "+table+" (type, natural_key, payload) VALUES ('t', 'k', '{}') RETURNING id").Scan(&id))
		pending, zero := pgtype.Text{String: StatusPending, Valid: true}, pgtype.Int8{Valid: true}
		m := Update{ID: id, Status: pending, ReadAttempts: zero, Sent: true}
		for _, ds := range [][]Update{
			{m}, // one outcome
			{m, {ID: -1, Status: pending, Sent: true}}, // a group
		} {
			var inside string
			require.NoError(t, pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				if _, err := repo.Record(ctx, tx, ds); err != nil {
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
	require.Equal(t, `"mensagem_m2m_outbox"`, IndexName("mensagem_m2m", "_outbox"), "the brief's name, unchanged")
	long := strings.Repeat("a", 55)
	a, b := IndexName(long+"_one", "_outbox_retry"), IndexName(long+"_two", "_outbox_retry")
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
	pool, table := table(t)
	_, err := pool.Exec(ctx, "INSERT INTO "+table+" (type, natural_key, payload) SELECT 't', 'k' || g, '{}' FROM generate_series(1, 20) g")
	require.NoError(t, err)
	repo, c := fetcher(t, pool, table)
	for i := range 8 {
		f, err := repo.Fetch(ctx, c, FetchArgs{MaxAttempts: 10, Types: []string{"t"}, All: []string{"t"}, Limit: 5, MaxBytes: 1 << 20,
			After: []int64{math.MinInt64}, Keyed: true, StartEpoch: i == 0, Preflight: i == 0, Headers: true, Source: table})
		require.NoError(t, err)
		require.Len(t, f.Rows, 5)
	}
	var generic, custom int64
	require.NoError(t, c.QueryRow(ctx, `SELECT coalesce(sum(generic_plans), 0), coalesce(sum(custom_plans), 0)
		FROM pg_prepared_statements WHERE statement LIKE '%m.id = ANY((SELECT g.k FROM g)%'`).Scan(&generic, &custom))
	require.GreaterOrEqual(t, generic, int64(8), "every select on its generic plan")
	require.Zero(t, custom, "no plan made for one execution")
	var mode string
	require.NoError(t, c.QueryRow(ctx, "SHOW plan_cache_mode").Scan(&mode))
	require.Equal(t, "auto", mode, "the session keeps its own setting")
}

// TestFetchReadsStatusAndType: a batch's types and statuses, read once per
// batch and shared by its rows (interned), are each row's own: a NULL status
// (a foreign table may allow one) stays NULL, which the outcome's fence reads
// as the row was.
func TestFetchReadsStatusAndType(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, table := table(t)
	_, err := pool.Exec(ctx, "ALTER TABLE "+table+" ALTER COLUMN status DROP NOT NULL")
	require.NoError(t, err)
	_, err = pool.Exec(ctx, "INSERT INTO "+table+` (type, natural_key, payload, status, attempts, updated_at) VALUES
		('t', 'a', '{}', 'PENDING', 0, now()), ('u', 'b', '{}', NULL, 0, now()),
		('t', 'c', '{}', 'ERROR', 1, now() - interval '1 day'), ('u', 'd', '{}', 'PENDING', 0, now())`)
	require.NoError(t, err)
	repo, c := fetcher(t, pool, table)
	f, err := repo.Fetch(ctx, c, FetchArgs{MaxAttempts: 10, Types: []string{"t", "u"}, All: []string{"t", "u"}, Limit: 10, MaxBytes: 1 << 20,
		After: []int64{math.MinInt64, math.MinInt64}, Width: []int32{10, 10}, Keyed: true, StartEpoch: true, Preflight: true, Headers: true, Source: table})
	require.NoError(t, err)
	type read struct {
		typ, key string
		status   pgtype.Text
	}
	var got []read
	for _, m := range f.Rows {
		got = append(got, read{m.Type, m.Key, m.Status})
	}
	require.Equal(t, []read{
		{"t", "a", pgtype.Text{String: "PENDING", Valid: true}},
		{"u", "b", pgtype.Text{}},
		{"t", "c", pgtype.Text{String: "ERROR", Valid: true}},
		{"u", "d", pgtype.Text{String: "PENDING", Valid: true}},
	}, got)
}
