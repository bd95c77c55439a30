package relay_test

import (
	"context"
	"encoding/json"
	"math"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/xadm/relay"
)

// TestAdminEstimatePurge: on a small table the estimate is the exact count of
// what the purge then deletes, by type; live, recent and inbound rows are not
// in it.
func TestAdminEstimatePurge(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	f := b.seedAdmin(t)
	b.exec(t, `INSERT INTO %s (type, natural_key, payload, status, sent_at)
		SELECT 'u', 'k' || g, '{}', 'SENT', now() - interval '3 days' FROM generate_series(1, 5) g`)
	b.exec(t, "UPDATE %s SET direction = 'IN', status = 'SENT', sent_at = now() - interval '3 days' WHERE id = $1", f.pending)
	a := b.newAdmin(t)

	est, err := a.EstimatePurge(ctx, 24*time.Hour)
	require.NoError(t, err)
	require.True(t, est.Exact)
	require.EqualValues(t, 6, est.Rows)
	require.Equal(t, []relay.TypeCount{{Type: "t", Rows: 1}, {Type: "u", Rows: 5}}, est.Types)
	require.WithinDuration(t, time.Now().Add(-24*time.Hour), est.Cutoff, time.Minute)

	all, err := a.EstimatePurge(ctx, 0)
	require.NoError(t, err)
	require.EqualValues(t, 7, all.Rows, "retention 0: every outbound SENT row")

	// An Admin of type u estimates what it would purge: u's rows only.
	u, err := relay.NewAdmin(b.pool, b.cfg, relay.AdminTypes("u"))
	require.NoError(t, err)
	est, err = u.EstimatePurge(ctx, 24*time.Hour)
	require.NoError(t, err)
	require.Equal(t, []relay.TypeCount{{Type: "u", Rows: 5}}, est.Types)
	est, err = a.EstimatePurge(ctx, 24*time.Hour)
	require.NoError(t, err)

	var calls [][2]int64
	n, err := a.PurgeSentProgress(ctx, 24*time.Hour, func(deleted, expected int64) { calls = append(calls, [2]int64{deleted, expected}) })
	require.NoError(t, err)
	require.EqualValues(t, est.Rows, n)
	require.Equal(t, [][2]int64{{0, 6}, {6, 6}}, calls)

	_, err = a.EstimatePurge(ctx, -time.Second)
	require.ErrorContains(t, err, "retention must not be negative")
}

// TestPurgeEstimateMillion measures the estimate against a table of 1,000,000
// rows that was never analyzed (as a bulk load leaves it until autovacuum
// comes), then analyzed, beside what the planner would say; and purges
// 900,000 rows with progress, whose expected total is fixed before the first
// chunk while deleted moves from under 1% to the end.
//
//	go test -run TestPurgeEstimateMillion -v .
func TestPurgeEstimateMillion(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a table of 1,000,000 rows; -short skips it")
	}
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	const total, sent = 1_000_000, 960_000
	b.exec(t, "ALTER TABLE %s SET (autovacuum_enabled = false)") // it stays never analyzed until we say so
	// Row g (SENT up to g = sent) was delivered total-g seconds ago:
	// retention r selects the SENT rows g < total - r.
	b.exec(t, `INSERT INTO %s (type, natural_key, payload, status, attempts, created_at, sent_at)
		SELECT (ARRAY['orders','invoices','customers','shipments'])[1 + g %% 4], 'key-' || (g %% 50000),
			jsonb_build_object('id', g, 'note', repeat('x', 120)),
			CASE WHEN g <= $1 THEN 'SENT' ELSE 'PENDING' END, 0,
			now() - make_interval(secs => ($2 - g) + 1),
			CASE WHEN g <= $1 THEN now() - make_interval(secs => ($2 - g)) END
		FROM generate_series(1, $2) g`, sent, total)
	a := b.newAdmin(t)
	table := pgx.Identifier{b.table}.Sanitize()

	var reltuples float64
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT reltuples FROM pg_class WHERE oid = $1::regclass", table).Scan(&reltuples))
	require.EqualValues(t, -1, reltuples, "never analyzed")

	planner := func(retention time.Duration) int64 {
		var doc []byte
		require.NoError(t, b.pool.QueryRow(ctx, `EXPLAIN (FORMAT JSON) SELECT 1 FROM `+table+`
			WHERE direction = 'OUT' AND status = 'SENT' AND sent_at < now() - make_interval(secs => $1::float8)`, retention.Seconds()).Scan(&doc))
		var plans []struct {
			Plan struct {
				Rows float64 `json:"Plan Rows"`
			}
		}
		require.NoError(t, json.Unmarshal(doc, &plans))
		return int64(plans[0].Plan.Rows)
	}
	retentions := []time.Duration{0, 500_000 * time.Second, 900_000 * time.Second, 990_000 * time.Second}
	check := func(state string) {
		t.Logf("%s:", state)
		for _, r := range retentions {
			var want int64
			require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM `+table+`
				WHERE direction = 'OUT' AND status = 'SENT' AND sent_at < now() - make_interval(secs => $1::float8)`, r.Seconds()).Scan(&want))
			start := time.Now()
			est, err := a.EstimatePurge(ctx, r)
			took := time.Since(start)
			require.NoError(t, err)
			require.False(t, est.Exact)
			errPct := 100 * float64(est.Rows-want) / float64(want)
			t.Logf("  older than %8s: %7d rows; sample of %d of %d pages says %7d (%+.1f%%) in %s; the planner says %d",
				r, want, est.SampledPages, est.Pages, est.Rows, errPct, took.Round(time.Millisecond), planner(r))
			// The sample is of pages, and the rows of a page share their
			// status and age here: its relative error is about 1/√m for m
			// sampled pages that hold rows to purge. Four of those, at least 5%.
			m := float64(est.SampledPages) * float64(want) / total
			tolerance := max(5, 400/math.Sqrt(m))
			require.Less(t, math.Abs(errPct), tolerance, "the sample's estimate is near the count")
			var byType int64
			for _, c := range est.Types {
				byType += c.Rows
			}
			require.Equal(t, est.Rows, byType)
			require.Len(t, est.Types, 4)
		}
	}
	check("never analyzed")
	b.exec(t, "ANALYZE %s")
	check("after ANALYZE")

	// The purge: its expected total is fixed before the first chunk, and the
	// fraction done moves with each chunk.
	const retention = 60_000 * time.Second // rows 1..940000
	var before int64
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM `+table+` WHERE status = 'SENT'`).Scan(&before))
	var first, last [2]int64
	calls := 0
	start := time.Now()
	n, err := a.PurgeSentProgress(ctx, retention, func(deleted, expected int64) {
		if calls == 0 {
			first = [2]int64{deleted, expected}
		}
		require.Equal(t, first[1], expected, "the total does not follow the count")
		if calls > 0 {
			require.Greater(t, deleted, last[0])
		}
		last = [2]int64{deleted, expected}
		calls++
	})
	require.NoError(t, err)
	var after int64
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM `+table+` WHERE status = 'SENT'`).Scan(&after))
	require.Equal(t, before-after, n)
	require.InDelta(t, 940_000, n, 1000)
	t.Logf("purged %d rows in %d chunks in %s; expected %d (%+.1f%%)", n, calls, time.Since(start).Round(time.Millisecond),
		first[1], 100*float64(first[1]-n)/float64(n))
	require.Zero(t, first[0], "the total is known before the first chunk")
	require.Equal(t, n, last[0])
	require.EqualValues(t, 1+(n+relay.PurgeChunk)/relay.PurgeChunk, calls)
}
