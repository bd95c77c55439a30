package relay

import (
	"context"
	"time"
)

// The Scheduler's clock, in sql/schedule.sql.

var databaseNowSQL = statements.positional("databaseNow", sqlData{})

// databaseNow reads the database's clock: the one clock every replica's
// [Scheduler] agrees on, whatever their own clocks say.
func databaseNow(ctx context.Context, db querier) (time.Time, error) {
	var t time.Time
	err := db.QueryRow(ctx, databaseNowSQL).Scan(&t)
	return t, err
}
