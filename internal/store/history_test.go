package store

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// TestHistoryPlanMillion: on a table of 1,000,000 rows, History's statement
// reads the last hour through the primary key and the partial indexes, never
// by a sequential scan. (What relay.Admin.History makes of it on such a table,
// and what it costs beside the Overview, is the root's TestHistoryMillion.)
//
//	go test -run TestHistoryPlanMillion -v ./internal/store
func TestHistoryPlanMillion(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a table of 1,000,000 rows; -short skips it")
	}
	t.Parallel()
	ctx := context.Background()
	pool, name := table(t)
	const ceiling = 3
	exec := func(sql string, args ...any) {
		t.Helper()
		_, err := pool.Exec(ctx, fmt.Sprintf(sql, pgx.Identifier{name}.Sanitize()), args...)
		require.NoError(t, err)
	}
	// One row every 0.1 s for 27.8 hours, delivered 2 s after it was written,
	// but for the last 6,000 (10 minutes): pending, then dead and retrying.
	exec(`INSERT INTO %s (type, natural_key, payload, status, attempts, created_at, updated_at, sent_at)
		SELECT (ARRAY['orders','invoices','customers','shipments'])[1 + g %% 4], 'key-' || (g %% 50000),
			jsonb_build_object('id', g, 'note', repeat('x', 120)),
			CASE WHEN g <= 994000 THEN 'SENT' WHEN g <= 998000 THEN 'PENDING' ELSE 'ERROR' END,
			CASE WHEN g <= 998000 THEN 0 WHEN g <= 999000 THEN 1 ELSE $1 END,
			now() - make_interval(secs => (1000000 - g) / 10.0), now() - make_interval(secs => (1000000 - g) / 10.0 - 2),
			CASE WHEN g <= 994000 THEN now() - make_interval(secs => (1000000 - g) / 10.0 - 2) END
		FROM generate_series(1, 1000000) g`, ceiling)
	exec("VACUUM ANALYZE %s")

	// The statement as relay.Admin.History runs it for the last hour by
	// minute (admin_history.go: the walk's historyChunk and historyGap,
	// HistoryLookbackMax; RetryBackoff 0 under retryBackoffMax), on a table
	// with the partial indexes (historyIndexed).
	admin, err := NewAdminSQL(name, true)
	require.NoError(t, err)
	window, step := time.Hour, time.Minute
	const chunk, gap, lookback, indexed, backoff, backoffMax = 4096, 1024, 24 * time.Hour, true, 0, time.Hour
	rows, err := pool.Query(ctx, "EXPLAIN (ANALYZE, BUFFERS) "+admin.HistorySQL, window.Seconds(), step.Seconds(), int(window/step),
		ceiling, chunk, gap, lookback.Seconds(), indexed, float64(backoff), backoffMax.Seconds())
	require.NoError(t, err)
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	plan := strings.Join(lines, "\n")
	t.Logf("plan:\n%s", plan)
	require.NotContains(t, plan, "Seq Scan", "the window is read by index ranges")
	require.True(t, strings.Contains(plan, "Index Only Scan"), "the live rows are counted and skip-scanned in their indexes")
}
