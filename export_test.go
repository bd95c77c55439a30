package relay

import "time"

// FetchSQLForTest is the select of a batch as a relay of table with backoff
// runs it ($1 ceiling, $2 types, $3 limit, $4 after this id, $5 backoff base,
// $6 backoff cap), for tests that look at its plan.
func FetchSQLForTest(table string, backoff time.Duration) string {
	r, err := newRepository(table, backoff, false)
	if err != nil {
		panic(err)
	}
	return r.fetchSQL
}

// SetWakeUpWindowForTest sets how long a producer process goes without a
// NOTIFY the wake-up token did not grant, and returns the restore.
func SetWakeUpWindowForTest(d time.Duration) (restore func()) {
	old := wakeUpWindow
	wakeUpWindow = d
	return func() { wakeUpWindow = old }
}
