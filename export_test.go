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

// SetWakeUpWindowForTest sets how long a producer process goes without a
// NOTIFY the wake-up token did not grant, and returns the restore.
func SetWakeUpWindowForTest(d time.Duration) (restore func()) {
	old := wakeUpWindow
	wakeUpWindow = d
	return func() { wakeUpWindow = old }
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
