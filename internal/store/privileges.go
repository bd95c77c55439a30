package store

import "context"

// privilegesSQL is the check of the relay's grants.
var privilegesSQL = Statements.Positional("privileges", Data{})

// Privileges says what the session's role, role, may do on table (as
// Probe's Qualified names it): whether it may select, and which of the
// columns update it may not update.
func Privileges(ctx context.Context, db querier, table string, update []string) (role string, canSelect bool, cannotUpdate []string, err error) {
	err = db.QueryRow(ctx, privilegesSQL, table, update).Scan(&role, &canSelect, &cannotUpdate)
	return role, canSelect, cannotUpdate, err
}
