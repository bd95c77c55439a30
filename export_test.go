package relay

import (
	"math"
	"time"
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

// WithWakeUpWindowForTest makes the Enqueue calls given the same option
// share wake-up windows of their own, of d: how long a producer goes without
// a NOTIFY the wake-up token did not grant.
func WithWakeUpWindowForTest(d time.Duration) EnqueueOption {
	return withWakeWindows(newWakeWindows(d))
}

// RetryBackoffMaxForTest is the cap of the wait before an ERROR row is retried.
const RetryBackoffMaxForTest = retryBackoffMax
