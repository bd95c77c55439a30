package relay_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/xadm/relay"
)

// TestAdminHistory: deliveries are counted in the minute of their sent_at,
// and the lag at the end of each minute is how long the row that had waited
// longest for the relays at that instant had waited: a pending row, a row
// until it was delivered, a row that died of its first attempt until it
// died, a re-queued row since its re-queue, a retrying row since its retry
// came due. A row that was retried before it was delivered or died is not
// drawn: its backoffs were no relay's lag.
func TestAdminHistory(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	// row writes n rows of typ written created ago, in status, delivered or
	// dead ended ago (0: not yet).
	row := func(typ string, n int, status string, attempts int, created, ended time.Duration) {
		b.exec(t, `INSERT INTO %s (type, natural_key, payload, status, attempts, created_at, updated_at, sent_at)
			SELECT $1, $1 || g, '{}', $2, $3, now() - make_interval(secs => $4),
				CASE WHEN $5 > 0 THEN now() - make_interval(secs => $5) ELSE now() END,
				CASE WHEN $2 = 'SENT' THEN now() - make_interval(secs => $5) END
			FROM generate_series(1, $6) g`, typ, status, attempts, created.Seconds(), ended.Seconds(), n)
	}
	m := time.Minute
	row("old", 5, "SENT", 0, 5*time.Hour, 4*time.Hour)                               // long before the window and its lookback
	row("orders", 3, "SENT", 0, 5*m+30*time.Second, 4*m+30*time.Second)              // waited 1m, delivered in step 5
	row("orders", 2, "SENT", 0, 90*time.Second, 30*time.Second)                      // delivered in step 9
	row("orders", 1, "PENDING", 0, 20*m, 0)                                          // waits since before the window
	row("refunds", 1, "ERROR", adminCeiling, 8*m+30*time.Second, 5*m+30*time.Second) // waited 3m, then died of a 400
	b.exec(t, "UPDATE %s SET last_error = 'permanent after 1 attempt(s): 400 Bad Request' WHERE type = 'refunds'")
	row("refunds", 1, "ERROR", 1, 30*time.Second, 30*time.Second)        // retrying, due since 30s ago
	row("refunds", 1, "ERROR", adminCeiling, 9*m+30*time.Second, 5*m)    // died after its retries: not drawn
	row("refunds", 1, "SENT", 2, 9*m+30*time.Second, 4*m+30*time.Second) // delivered after retries: counted, not drawn
	row("refunds", 1, "ERROR", 1, 9*m+30*time.Second, 9*m)               // retrying, in its backoff for an hour
	b.exec(t, "UPDATE %s SET updated_at = now() + interval '1 hour' WHERE type = 'refunds' AND status = 'ERROR' AND attempts = 1 AND created_at < now() - interval '9 minutes'")
	// A row written 9m30s ago, re-queued 2m30s ago: it waits since then.
	row("requeued", 1, "PENDING", 0, 9*m+30*time.Second, 0)
	b.exec(t, "UPDATE %s SET requeued_at = now() - interval '150 seconds' WHERE type = 'requeued'")
	a := b.newAdmin(t)

	h, err := a.History(ctx, 10*m, m)
	require.NoError(t, err)
	require.Equal(t, 10*m, h.To.Sub(h.From))
	require.Equal(t, m, h.Step)
	require.Len(t, h.Types, 3, "the old type is outside the window: %+v", h.Types)
	orders, refunds, requeued := h.Types[0], h.Types[1], h.Types[2]
	require.Equal(t, "orders", orders.Type)
	require.Equal(t, []int64{0, 0, 0, 0, 0, 3, 0, 0, 0, 2}, orders.Delivered)
	require.Equal(t, "refunds", refunds.Type)
	require.Equal(t, []int64{0, 0, 0, 0, 0, 1, 0, 0, 0, 0}, refunds.Delivered, "the row delivered after retries")
	require.Equal(t, "requeued", requeued.Type)

	near := func(want, got time.Duration, msg string) {
		t.Helper()
		require.InDelta(t, want.Seconds(), got.Seconds(), 2, "%s: want %s, got %s", msg, want, got)
	}
	// orders: the pending row written 20m ago is the oldest at every instant.
	for i, lag := range orders.Lag {
		near(10*m+time.Duration(i+1)*m, lag, "orders")
	}
	// refunds: the dead row waited from 8m30s ago to 5m30s ago (the ends of
	// steps 1, 2 and 3, at 8m, 7m and 6m ago), the retrying one since 30s ago.
	want := []time.Duration{0, 30 * time.Second, 90 * time.Second, 150 * time.Second, 0, 0, 0, 0, 0, 30 * time.Second}
	for i := range want {
		near(want[i], refunds.Lag[i], "refunds step "+string(rune('0'+i)))
	}
	// requeued: nothing until its re-queue 2m30s ago, then since it.
	want = []time.Duration{0, 0, 0, 0, 0, 0, 0, 30 * time.Second, 90 * time.Second, 150 * time.Second}
	for i := range want {
		near(want[i], requeued.Lag[i], "requeued step "+string(rune('0'+i)))
	}

	for _, bad := range []struct {
		window, step time.Duration
		msg          string
	}{
		{0, m, "window must be in"},
		{-m, m, "window must be in"},
		{25 * time.Hour, m, "window must be in"},
		{time.Hour, 0, "step must be at least 1s"},
		{24 * time.Hour, time.Second, "at most 1440 steps"},
	} {
		_, err := a.History(ctx, bad.window, bad.step)
		require.ErrorContains(t, err, bad.msg)
	}

	empty := setup(t)
	h, err = empty.newAdmin(t).History(ctx, time.Hour, m)
	require.NoError(t, err)
	require.Empty(t, h.Types)
}

// TestHistoryMillion: on a table of 1,000,000 rows with the relay's
// indexes, History counts the last hour, and costs about as much as the
// Overview. (That its statement reads through the primary key and the
// partial indexes, never by a sequential scan, is internal/store's
// TestHistoryPlanMillion.)
//
//	go test -run TestHistoryMillion -v .
func TestHistoryMillion(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a table of 1,000,000 rows; -short skips it")
	}
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	// One row every 0.1 s for 27.8 hours, delivered 2 s after it was written,
	// but for the last 6,000 (10 minutes): pending, then dead and retrying.
	b.exec(t, `INSERT INTO %s (type, natural_key, payload, status, attempts, created_at, updated_at, sent_at)
		SELECT (ARRAY['orders','invoices','customers','shipments'])[1 + g %% 4], 'key-' || (g %% 50000),
			jsonb_build_object('id', g, 'note', repeat('x', 120)),
			CASE WHEN g <= 994000 THEN 'SENT' WHEN g <= 998000 THEN 'PENDING' ELSE 'ERROR' END,
			CASE WHEN g <= 998000 THEN 0 WHEN g <= 999000 THEN 1 ELSE $1 END,
			now() - make_interval(secs => (1000000 - g) / 10.0), now() - make_interval(secs => (1000000 - g) / 10.0 - 2),
			CASE WHEN g <= 994000 THEN now() - make_interval(secs => (1000000 - g) / 10.0 - 2) END
		FROM generate_series(1, 1000000) g`, adminCeiling)
	b.exec(t, "VACUUM ANALYZE %s")
	a := b.newAdmin(t)

	o, err := a.Overview(ctx)
	require.NoError(t, err)
	require.Empty(t, o.MissingIndexes, "the table has the relay's indexes")

	median := func(f func()) time.Duration {
		var ds []time.Duration
		for range 5 {
			s := time.Now()
			f()
			ds = append(ds, time.Since(s))
		}
		for i := range ds {
			for j := i + 1; j < len(ds); j++ {
				if ds[j] < ds[i] {
					ds[i], ds[j] = ds[j], ds[i]
				}
			}
		}
		return ds[2]
	}
	var h relay.History
	hist := median(func() { h, err = a.History(ctx, time.Hour, time.Minute); require.NoError(t, err) })
	over := median(func() { _, err := a.Overview(ctx); require.NoError(t, err) })
	t.Logf("History (last hour, by minute): median %s; Overview: median %s; rows read from id %d", hist, over, h.FromID)
	require.Len(t, h.Types, 4)
	var delivered int64
	for _, th := range h.Types {
		for _, n := range th.Delivered {
			delivered += n
		}
		require.Len(t, th.Lag, 60)
		require.InDelta(t, 10*time.Minute.Seconds(), th.Lag[59].Seconds(), 120, "%s: the oldest pending row waits since 10 minutes ago (when the table was built)", th.Type)
		require.Less(t, th.Lag[30], 3*time.Second, "%s: delivered 2 s after writing, half an hour ago", th.Type)
	}
	// Rows 964000..994000 were delivered in the last hour, 600 a minute.
	require.InDelta(t, 30_000, delivered, 600, "less the rows the window left behind while the test ran")
	require.Greater(t, h.FromID, int64(960_000), "the range starts near the hour's first row, not at the table's start")
}

// historyRows writes n outbound rows of typ into table (any migration's: every
// column given), written created ago, in status with attempts, delivered or
// dead ended ago (0: not yet), and returns the first id.
func historyRows(t *testing.T, pool *pgxpool.Pool, table, typ string, n int, status string, attempts int, created, ended time.Duration) int64 {
	t.Helper()
	var first int64
	require.NoError(t, pool.QueryRow(context.Background(), fmt.Sprintf(`WITH ins AS (
		INSERT INTO %s (direction, type, natural_key, payload, status, attempts, created_at, updated_at, sent_at)
		SELECT 'OUT', $1::text, 'k' || g, '{}', $2::text, $3, now() - make_interval(secs => $4),
			CASE WHEN $5 > 0 THEN now() - make_interval(secs => $5) ELSE now() - make_interval(secs => $4) END,
			CASE WHEN $2::text = 'SENT' THEN now() - make_interval(secs => $5) END
		FROM generate_series(1, $6) g RETURNING id)
		SELECT min(id) FROM ins`, pgx.Identifier{table}.Sanitize()), typ, status, attempts, created.Seconds(), ended.Seconds(), n).Scan(&first))
	return first
}

// TestHistoryWalk: History moves back from the window's first row over the
// rows that were still waiting when the window began, across runs of rows
// that were not (delivered or dead before it), until 1,024 ids in a row
// where none was: a row delivered in the window behind such a run is not
// counted, one behind a shorter run is.
func TestHistoryWalk(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	m := time.Minute
	historyRows(t, b.pool, b.table, "far", 1, "SENT", 0, 3*time.Hour, 30*m)                         // behind 6,000 rows delivered long ago: not counted
	historyRows(t, b.pool, b.table, "old", 6000, "SENT", 0, 150*m, 120*m)                           // delivered before the window
	near := historyRows(t, b.pool, b.table, "near", 1, "SENT", 0, 120*m, 9*m+30*time.Second)        // delivered in step 50
	historyRows(t, b.pool, b.table, "old", 500, "SENT", 0, 120*m, 90*m)                             // a shorter run
	historyRows(t, b.pool, b.table, "near", 1, "SENT", 0, 72*m, 5*m+30*time.Second)                 // delivered in step 54
	historyRows(t, b.pool, b.table, "new", 10, "SENT", 0, 30*m+30*time.Second, 29*m+30*time.Second) // step 30

	h, err := b.newAdmin(t).History(ctx, time.Hour, m)
	require.NoError(t, err)
	require.Equal(t, near, h.FromID, "the walk stops at the run of 6,000 rows that were not waiting")
	require.Len(t, h.Types, 2, "%+v", h.Types)
	require.Equal(t, "near", h.Types[0].Type)
	require.EqualValues(t, 1, h.Types[0].Delivered[50])
	require.EqualValues(t, 1, h.Types[0].Delivered[54])
	require.Equal(t, "new", h.Types[1].Type)
	require.EqualValues(t, 10, h.Types[1].Delivered[30])
}

// TestHistoryWithoutIndexes: on a table the JVM's migration made (no partial
// index, nullable varchar columns, timestamps without time zone), History
// reads every range of the walk instead of counting the live ones in their
// index, and finds what it finds on a table of SchemaSQL: a backlog of more
// live rows than a range, rows delivered behind it, dead rows within it.
func TestHistoryWithoutIndexes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	jvm := jvmTableOf(t, b.pool)
	m := time.Minute
	for _, table := range []string{b.table, jvm} {
		historyRows(t, b.pool, table, "orders", 300, "SENT", 0, 100*m, 50*m+30*time.Second) // waited from before the window to step 9
		historyRows(t, b.pool, table, "orders", 9000, "PENDING", 0, 90*m, 0)                // a backlog of two ranges and more
		historyRows(t, b.pool, table, "orders", 200, "ERROR", adminCeiling, 80*m, 20*m+30*time.Second)
		historyRows(t, b.pool, table, "refunds", 5000, "ERROR", 1, 70*m, 0)
		historyRows(t, b.pool, table, "orders", 100, "SENT", 0, 10*m+30*time.Second, 9*m+30*time.Second) // step 50
	}
	read := func(table string) (relay.History, bool) {
		cfg := b.cfg
		cfg.Table, cfg.MaxAttempts = table, adminCeiling
		a, err := relay.NewAdmin(b.pool, cfg, relay.AdminAllTypes())
		require.NoError(t, err)
		h, err := a.History(ctx, time.Hour, m)
		require.NoError(t, err)
		o, err := a.Overview(ctx)
		require.NoError(t, err)
		return h, !lacksHistoryIndexes(o.MissingIndexes)
	}
	want, indexed := read(b.table)
	require.True(t, indexed)
	got, indexed := read(jvm)
	require.False(t, indexed, "the JVM's table lacks the partial indexes")
	for _, h := range []relay.History{want, got} {
		require.Len(t, h.Types, 2)
		orders, refunds := h.Types[0], h.Types[1]
		require.EqualValues(t, 300, orders.Delivered[9])
		require.EqualValues(t, 100, orders.Delivered[50])
		var n int64
		for _, d := range orders.Delivered {
			n += d
		}
		require.EqualValues(t, 400, n)
		for i, lag := range orders.Lag {
			oldest := 100 * m // the delivered rows until step 9, then the backlog
			if i >= 9 {
				oldest = 90 * m
			}
			require.InDelta(t, (oldest - 60*m + time.Duration(i+1)*m).Seconds(), lag.Seconds(), 2, "orders step %d", i)
		}
		for i, lag := range refunds.Lag {
			require.InDelta(t, (10*m + time.Duration(i+1)*m).Seconds(), lag.Seconds(), 2, "refunds step %d", i)
		}
	}
	require.Equal(t, want.Types[0].Delivered, got.Types[0].Delivered)
}

// lacksHistoryIndexes reports whether missing, an Overview's, names one of
// the partial indexes History reads the live rows through (_outbox,
// _outbox_pending, _outbox_error): without one it reads them by the primary
// key's ranges.
func lacksHistoryIndexes(missing []relay.MissingIndex) bool {
	for _, m := range missing {
		for _, suffix := range []string{"_outbox", "_outbox_pending", "_outbox_error"} {
			if strings.HasSuffix(m.Name, suffix) {
				return true
			}
		}
	}
	return false
}
