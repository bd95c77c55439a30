package pass

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/xadm/relay/internal/store"
	"github.com/xadm/relay/internal/testkit/pgserver"
)

// TestMain gets a real PostgreSQL (RELAY_TEST_DATABASE_URL, or the local
// binaries) for TestSelectModel; the engine's other tests need none.
func TestMain(m *testing.M) { pgserver.Main(m) }

// TestSelectModel checks the model of the select that the engine's tests run
// on (select_model_test.go) against the select itself (sql/pass.sql), on
// random tables and random queries: the same rows, held the same way, the
// same lanes with more, the same epoch.
func TestSelectModel(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, pgserver.Shared().URL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	table := pgserver.Name(t)
	require.NoError(t, store.CreateTable(ctx, pool, table))
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP TABLE "+table) })
	c, err := pool.Acquire(ctx)
	require.NoError(t, err)
	defer c.Release()

	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 7))
	types := []string{"a", "b", "c"}
	keys := []string{"k0", "k1", "k2", "k3", "k4", "k5"}
	hashes := map[string]map[int]int{} // key → partitions → its partition, as hashtext makes it
	for _, k := range keys {
		hashes[k] = map[int]int{}
		for n := 2; n <= 4; n++ {
			var p int
			require.NoError(t, c.QueryRow(ctx, "SELECT (hashtext($1) & 2147483647) % $2", k, n).Scan(&p))
			hashes[k][n] = p
		}
	}
	backoff := 10 * time.Second
	for round := range 150 {
		// A random table: rows of the relay's types and another app's, in
		// every state, failed ones in or past their backoff.
		_, err := c.Exec(ctx, "TRUNCATE "+table)
		require.NoError(t, err)
		m := modelTable{maxAttempts: 3, batch: 1 + rng.IntN(6), backoff: backoff, backoffCap: time.Hour,
			partitions: 2 + rng.IntN(3), partition: func(key string, n int) int { return hashes[key][n] }}
		var dbNow time.Time
		require.NoError(t, c.QueryRow(ctx, "SELECT now()").Scan(&dbNow))
		m.now = dbNow
		for range 5 + rng.IntN(30) {
			r := &modelRow{typ: append(types, "other")[rng.IntN(4)], key: keys[rng.IntN(len(keys))], visible: true, size: 2}
			switch rng.IntN(5) {
			case 0, 1:
				r.status = store.StatusPending
			case 2:
				r.status, r.attempts = store.StatusSent, rng.IntN(3)
			default:
				r.status, r.attempts = store.StatusError, rng.IntN(4) // 3: dead
			}
			// In its backoff or long past it: never at its edge.
			ago := time.Duration(rng.IntN(2)) * 2 * time.Hour
			r.updated = dbNow.Add(-ago)
			require.NoError(t, c.QueryRow(ctx, "INSERT INTO "+table+` (type, natural_key, payload, status, attempts, updated_at)
				VALUES ($1, $2, '{}', $3, $4, $5) RETURNING id`, r.typ, r.key, r.status, r.attempts, r.updated).Scan(&r.id))
			m.rows = append(m.rows, r)
		}
		repo, err := store.NewTable(table, backoff, time.Hour, false)
		require.NoError(t, err)
		for range 20 {
			q := randomQuery(rng, types, m)
			want := m.fetch(q)
			a := store.FetchArgs{MaxAttempts: m.maxAttempts, Types: q.Types, After: q.After, Width: q.Width, All: q.All,
				Later: q.Later, Epoch: q.Epoch, StartEpoch: q.StartEpoch, Keyed: q.Keyed, Limit: m.batch, MaxBytes: 1 << 20}
			if q.Parts != nil {
				a.Partitions, a.Parts = m.partitions, q.Parts
			}
			got, err := repo.Fetch(ctx, c, a)
			require.NoError(t, err)
			what := fmt.Sprintf("seed %d, round %d, query %+v", seed, round, q)
			require.Equal(t, summary(want), summary(got), what)
			if q.StartEpoch {
				require.Equal(t, want.Epoch, got.Epoch, what)
			}
		}
	}
}

// randomQuery is a query the engine could make of m: some of the relay's
// types, each past a cursor, some probing, some left out as unable to send.
func randomQuery(rng *rand.Rand, types []string, m modelTable) Query {
	q := Query{All: types, Keyed: rng.IntN(3) != 0, StartEpoch: rng.IntN(3) == 0}
	q.Epoch = math.MinInt64
	if n := len(m.rows); n > 0 && !q.StartEpoch {
		q.Epoch = m.rows[rng.IntN(n)].id
	}
	for _, typ := range types {
		if rng.IntN(4) == 0 && q.Keyed {
			if rng.IntN(2) == 0 {
				q.Later = append(q.Later, typ)
			}
			continue
		}
		after := int64(math.MinInt64)
		if n := len(m.rows); n > 0 && !q.StartEpoch && rng.IntN(2) == 0 {
			after = m.rows[rng.IntN(n)].id
		}
		width := int32(m.batch)
		if rng.IntN(4) == 0 {
			width = 1
		}
		q.Types, q.After, q.Width = append(q.Types, typ), append(q.After, after), append(q.Width, width)
	}
	if len(q.Types) == 0 {
		q.Types, q.After, q.Width, q.Later = []string{"a"}, []int64{math.MinInt64}, []int32{int32(m.batch)}, nil
	}
	if rng.IntN(3) == 0 {
		for p := range m.partitions {
			if rng.IntN(2) == 0 {
				q.Parts = append(q.Parts, p)
			}
		}
		if q.Parts == nil {
			q.Parts = []int{0}
		}
	}
	return q
}

// summary is what a select's answer says, in a form to compare.
func summary(f store.Batch) string {
	s := fmt.Sprintf("more %v full %v:", slices.Clip(f.More), f.Full)
	for _, r := range f.Rows {
		s += fmt.Sprintf(" %d/%s/%s/held%d", r.ID, r.Type, r.Key, r.Held)
	}
	return s
}
