package store

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// privilegesSQL is the check of the relay's grants.
var privilegesSQL = Statements.Positional("privileges", Data{})

// Privileges says what the session's role, role, may do on table (as
// Probe's Qualified names it): whether it may select, and which of the
// columns update it may not update.
func Privileges(ctx context.Context, db querier, table string, update []string) (role string, canSelect bool, cannotUpdate []string, err error) {
	err = db.QueryRow(ctx, privilegesSQL, table, update).Scan(&role, &canSelect, &cannotUpdate)
	return role, canSelect, cannotUpdate, err
}

// relayUpdates are the columns a pass's outcomes write: what the relay's role
// must be granted UPDATE on (docs/security.md).
var relayUpdates = []string{"status", "attempts", "last_error", "updated_at", "sent_at"}

// CheckGrants refuses, before the first pass, a role that lacks a grant the
// pass needs, naming it: without UPDATE a pass would send its messages and
// fail to record them, and send them again on every pass.
func CheckGrants(ctx context.Context, db Querier, table string) error {
	role, canSelect, cannotUpdate, err := Privileges(ctx, db, table, relayUpdates)
	if err != nil {
		return fmt.Errorf("relay: read the role's grants on %s: %w", table, err)
	}
	var lacks []string
	if !canSelect {
		lacks = append(lacks, "SELECT")
	}
	if len(cannotUpdate) > 0 {
		lacks = append(lacks, "UPDATE ("+strings.Join(cannotUpdate, ", ")+")")
	}
	if len(lacks) == 0 {
		return nil
	}
	// PostgreSQL's own code, insufficient_privilege, for a caller that reads
	// the SQLSTATE of a pass's error.
	denied := &pgconn.PgError{Severity: "ERROR", Code: "42501",
		Message: fmt.Sprintf("permission denied: role %q lacks %s on %s", role, strings.Join(lacks, " and "), table)}
	return fmt.Errorf("relay: role %q lacks %s on %s, which every pass needs: grant the relay's role what docs/security.md lists "+
		"(GRANT SELECT, UPDATE (%s) ON %s TO %s): %w", role, strings.Join(lacks, " and "), table, strings.Join(relayUpdates, ", "), table, role, denied)
}
