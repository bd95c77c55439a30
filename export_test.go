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

// SetWakeUpForTest sets how often a producer process whose Enqueues come
// within denseGap of each other tries to wake the relays, and how long it
// goes without a NOTIFY the wake-up token did not grant; it returns the
// restore.
func SetWakeUpForTest(window, denseGap, forceAfter time.Duration) (restore func()) {
	oldWindow, oldGap, oldForce := wakeUpWindow.Swap(int64(window)), wakeDenseGap.Swap(int64(denseGap)), wakeForceAfter.Swap(int64(forceAfter))
	return func() { wakeUpWindow.Store(oldWindow); wakeDenseGap.Store(oldGap); wakeForceAfter.Store(oldForce) }
}
