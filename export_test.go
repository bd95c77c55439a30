package relay

import (
	"context"
	"math"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// FetchForTest is the select of a batch of at most limit rows of types as a
// relay of table with backoff runs it, with its arguments, for tests that
// look at its plan.
func FetchForTest(table string, backoff time.Duration, maxAttempts int, types []string, limit int) (string, []any) {
	r, err := newRepository(table, backoff, false)
	if err != nil {
		panic(err)
	}
	return r.fetchSQL.sql, r.fetchSQL.args(map[string]any{"max": maxAttempts, "types": types, "limit": limit,
		"after": int64(math.MinInt64), "backoff": r.backoff, "cap": r.backoffMax})
}

// WithWakeUpForTest makes the Enqueue calls given the same option share
// wake-up attempts of their own: how often a producer whose Enqueues come
// within denseGap of each other tries to wake the relays, and how long it
// goes without a NOTIFY the wake-up token did not grant.
func WithWakeUpForTest(window, denseGap, forceAfter time.Duration) EnqueueOption {
	return withWakeWindows(newWakeWindows(window, denseGap, forceAfter))
}

// KeepElectionForTest makes r's loop keep its election between passes for
// up to idle without work, instead of keptIdle. It must run before Start.
func KeepElectionForTest(r *Relay, idle time.Duration) {
	if e, ok := r.election.(*polledElection); ok {
		e.keptIdle = idle
		return
	}
	panic("relay: KeepElectionForTest: not the relay's own election")
}

// RetryBackoffMaxForTest is the cap of the wait before an ERROR row is retried.
const RetryBackoffMaxForTest = retryBackoffMax

// HistoryPlansForTest returns the plans (EXPLAIN ANALYZE, text) of the
// statements Admin.History runs for window and step: the binary search, one
// step of the search back, and the read of the window.
func HistoryPlansForTest(ctx context.Context, a *Admin, window, step time.Duration) (search, back, read string, err error) {
	var now time.Time
	var lo, first int64
	if err := a.pool.QueryRow(ctx, a.repo.historyStartSQL, window.Seconds()).Scan(&now, &lo, &first); err != nil {
		return "", "", "", err
	}
	from := now.Add(-window)
	at := float64(from.UnixMicro()) / 1e6
	explain := func(sql string, args ...any) (string, error) {
		rows, err := a.pool.Query(ctx, "EXPLAIN (ANALYZE, BUFFERS) "+sql, args...)
		if err != nil {
			return "", err
		}
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		return strings.Join(lines, "\n"), err
	}
	if search, err = explain(a.repo.historyStartSQL, window.Seconds()); err != nil {
		return
	}
	if back, err = explain(a.repo.historyBackSQL, first-historyBackChunk, first, at, a.maxAttempts); err != nil {
		return
	}
	if first, err = a.repo.historyBack(ctx, a.pool, lo, first, from, a.maxAttempts); err != nil {
		return
	}
	if read, err = explain(a.repo.historyReadSQL, first, at, step.Seconds(), int(window/step), a.maxAttempts, from); err != nil {
		return
	}
	live, err := explain(a.repo.historyLiveSQL, a.maxAttempts)
	read += "\n" + live
	return
}

// MissTransactionPoolingForTest makes r's check that its pool keeps its
// sessions find that it does without looking, as a check that missed a
// pooler would: what is left to protect the elections is that every statement
// on a lock's session acts only on its backend.
func MissTransactionPoolingForTest(r *Relay) {
	if r.sessions == nil {
		return // an election that takes no lock on the pool: nothing to check
	}
	r.sessions.mu.Lock()
	defer r.sessions.mu.Unlock()
	r.sessions.miss = true
}
