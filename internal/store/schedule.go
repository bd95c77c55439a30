package store

import (
	"context"
	"time"
)

// The Scheduler's clock, in sql/schedule.sql.

var databaseNowSQL = Statements.Positional("databaseNow", Data{})

// DatabaseNow reads the database's clock: the one clock every replica's
// [Scheduler] agrees on, whatever their own clocks say.
func DatabaseNow(ctx context.Context, db querier) (time.Time, error) {
	var t time.Time
	err := db.QueryRow(ctx, databaseNowSQL).Scan(&t)
	return t, err
}
