package relay

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/xadm/relay/internal/store"
)

// TableLock is a session that holds, or waits for, an ACCESS EXCLUSIVE lock
// on the Admin's table ([Admin.TableLocks]): a migration's LOCK TABLE, an
// ALTER TABLE. Every read of the table, the relays' and the Admin's, waits
// behind it.
type TableLock struct {
	PID             int
	Granted         bool // false: it waits for the lock, and the reads queue behind it too
	ApplicationName string
	User            string
	State           string
	Query           string    // its statement, cut to 200 characters ("" when hidden)
	XactStart       time.Time // when its transaction began; zero when hidden
	At              time.Time // the database's clock
}

// TableLocks returns the sessions that hold or wait for an ACCESS EXCLUSIVE
// lock on the table, those that hold it first. It reads only the catalog and
// pg_locks, never the table, so it answers while the table is locked.
func (a *Admin) TableLocks(ctx context.Context) ([]TableLock, error) {
	rows, err := a.pool.Query(ctx, store.TableLocksSQL, a.repo.Table)
	if err != nil {
		return nil, fmt.Errorf("relay: read the locks on %s: %w", a.table, err)
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (TableLock, error) {
		var l TableLock
		var pid int32
		var start *time.Time
		err := row.Scan(&pid, &l.Granted, &l.ApplicationName, &l.User, &l.State, &l.Query, &start, &l.At)
		l.PID = int(pid)
		if start != nil {
			l.XactStart = *start
		}
		return l, err
	})
}
