package relay

import (
	"context"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/xadm/relay/internal/store"
)

// FetchForTest is the select of a batch of at most limit rows of types as a
// relay of table with backoff runs it, with its arguments, for tests that
// look at its plan.
func FetchForTest(table string, backoff time.Duration, maxAttempts int, types []string, limit int) (string, []any) {
	r, err := store.NewTable(table, backoff, retryBackoffMax, false)
	if err != nil {
		panic(err)
	}
	return r.FetchSQL(maxAttempts, types, limit)
}

// RetryBackoffMaxForTest is the cap of the wait before an ERROR row is retried.
const RetryBackoffMaxForTest = retryBackoffMax

// HistoryPlanForTest returns the plan (EXPLAIN ANALYZE, text) of the
// statement Admin.History runs for window and step, and whether it read the
// live rows through the partial indexes.
func HistoryPlanForTest(ctx context.Context, a *Admin, window, step time.Duration) (plan string, indexed bool, err error) {
	if indexed, err = historyIndexed(ctx, a.pool, a.table); err != nil {
		return "", false, err
	}
	steps := int(window / step)
	repo, err := a.repoOf(ctx)
	if err != nil {
		return "", false, err
	}
	rows, err := a.pool.Query(ctx, "EXPLAIN (ANALYZE, BUFFERS) "+repo.HistorySQL, window.Seconds(), step.Seconds(), steps,
		a.maxAttempts, historyChunk, historyGap, HistoryLookbackMax.Seconds(), indexed, a.backoff.Seconds(), retryBackoffMax.Seconds())
	if err != nil {
		return "", false, err
	}
	lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
	return strings.Join(lines, "\n"), indexed, err
}

// MissTransactionPoolingForTest makes r's check that its pool keeps its
// sessions find that it does without looking, as a check that missed a
// pooler would: what is left to protect the elections is that every statement
// on a lock's session acts only on its backend.
func MissTransactionPoolingForTest(r *Relay) {
	if r.sessions == nil {
		return // an election that takes no lock on the pool: nothing to check
	}
	r.sessions.MissForTest()
}
