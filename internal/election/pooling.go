package election

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/xadm/relay/internal/session"
)

// This file is the election's lock statements behind a pooler that keeps
// its sessions (the check that it does is internal/session's pooling.go):
// which backend a lock statement must run on, and which failures say it
// took nothing.

// lockTookNothing reports whether err, a lock statement's failure, says it
// took no lock: the server ended the session that ran it (FATAL: whatever it
// took ends with it; a pooler's own FATAL says it ran nowhere or its server
// connection is gone), or a pooler's server connection did not know the
// statement pgx prepared (it never ran).
func lockTookNothing(err error) bool {
	var pe *pgconn.PgError
	return session.PooledStatementError(err) || errors.As(err, &pe) && (pe.Severity == "FATAL" || pe.Severity == "PANIC")
}

// lockSessionPID is the pid of conn's backend, the one the lock statement
// must run on: the one pgx learned at connect on a direct pool, else asked.
func lockSessionPID(ctx context.Context, conn *pgxpool.Conn, direct bool) (uint32, error) {
	if direct {
		return conn.Conn().PgConn().PID(), nil
	}
	return session.BackendPID(ctx, conn)
}
