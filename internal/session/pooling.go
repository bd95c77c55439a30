package session

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/xadm/relay/internal/store"
)

// This file is the check that the pool keeps its sessions: every election
// (the guard's, the partitioned one, the Scheduler's) holds a session
// advisory lock on one connection, and behind a pooler that lends a client
// connection a different server connection for each transaction (PgBouncer's
// pool_mode=transaction or statement) the lock stays on whichever server
// connection ran the statement: it excludes nobody, and is stranded there.
// No election runs on such a pool.

// Timings of the check.
const (
	// SessionCheckTimeout bounds one check, connections included.
	SessionCheckTimeout = 10 * time.Second
	// sessionCheckRounds is how many times each of the check's two
	// connections asks for its backend's pid.
	sessionCheckRounds = 4
)

// SessionCheck is the check of one pool, run once before its first election
// and kept once it is conclusive (either way). It is shared by the relay and
// its default guard.
type SessionCheck struct {
	mu     sync.Mutex
	done   bool  // conclusive
	direct bool  // each connection is a server session: its pid is the one pgx was told at connect
	err    error // wraps store.ErrTransactionPooling when the pool does not keep sessions

	// miss is a test knob: the check finds a pool that keeps its sessions
	// without looking, as a check that missed a pooler would.
	miss bool
}

// Verify runs the check once (again after an inconclusive one) and returns
// nil when the pool keeps its sessions, an error wrapping
// store.ErrTransactionPooling when it does not (logged at ERROR the first time),
// or why it could not tell.
func (c *SessionCheck) Verify(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done {
		return c.err
	}
	if c.miss {
		c.done = true
		return nil
	}
	cctx, cancel := context.WithTimeout(ctx, SessionCheckTimeout)
	defer cancel()
	direct, err := ProbeSessions(cctx, pool)
	switch {
	case errors.Is(err, store.ErrTransactionPooling):
		c.done, c.err = true, err
		logger.LogAttrs(ctx, slog.LevelError, "relay: transaction pooling detected: no election will run on this pool and nothing is delivered under one",
			slog.String("error", err.Error()),
			slog.String("fix", "set pool_mode=session for this database in the pooler (PgBouncer), or connect the relay directly to PostgreSQL"))
		return err
	case err != nil:
		return fmt.Errorf("relay: check that the pool keeps its sessions: %w", err)
	}
	c.done, c.direct = true, direct
	return nil
}

// Refused reports whether err is this check's refusal.
func (c *SessionCheck) Refused(err error) bool {
	if c == nil {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err != nil && errors.Is(err, c.err)
}

// IsDirect reports whether the check found each connection to be a server
// session of its own, whose pid pgx learned at connect.
func (c *SessionCheck) IsDirect() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.direct
}

// ProbeSessions tells a pool that keeps its sessions from one that does not.
// A direct connection answers one statement: its backend's pid is the one
// the server sent at connect (a pooler sends its own). Behind a pooler, it
// holds two connections at once and asks each for its backend's pid, in
// turn, several times: in session mode each keeps its own; in transaction
// mode the pooler lends them server connections as it likes (PgBouncer the
// most recently used first, so that both get the same one). A pgx
// prepared-statement error says the same (the statement was prepared on
// another server connection).
func ProbeSessions(ctx context.Context, pool *pgxpool.Pool) (direct bool, err error) {
	first, err := store.Acquire(ctx, pool, "check that the pool keeps its sessions")
	if err != nil {
		return false, err
	}
	defer first.Release()
	pid, err := BackendPID(ctx, first)
	if err != nil {
		return false, err
	}
	if pid == first.Conn().PgConn().PID() {
		return true, nil
	}
	// The second connection: the pool's, or, when the pool allows only one
	// (a Scheduler's, say), one of its own through the same pooler.
	ask := []func() (uint32, error){func() (uint32, error) { return BackendPID(ctx, first) }}
	if pool.Config().MaxConns >= 2 {
		second, err := store.Acquire(ctx, pool, "check that the pool keeps its sessions")
		if err != nil {
			return false, err
		}
		defer second.Release()
		ask = append(ask, func() (uint32, error) { return BackendPID(ctx, second) })
	} else {
		second, err := pgx.ConnectConfig(ctx, pool.Config().ConnConfig)
		if err != nil {
			return false, err
		}
		defer second.Close(context.WithoutCancel(ctx))
		ask = append(ask, func() (uint32, error) {
			var pid uint32
			err := second.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid)
			if PooledStatementError(err) {
				return 0, fmt.Errorf("%w: %w", store.ErrTransactionPooling, err)
			}
			return pid, err
		})
	}
	pids := []uint32{pid, 0}
	for round := range sessionCheckRounds {
		for i, backend := range ask {
			if round == 0 && i == 0 {
				continue // asked above
			}
			got, err := backend()
			if err != nil {
				return false, err
			}
			switch {
			case round == 0:
				pids[i] = got
			case got != pids[i]:
				return false, fmt.Errorf("%w: one connection answered as backend %d, then as backend %d", store.ErrTransactionPooling, pids[i], got)
			}
		}
		if pids[0] == pids[1] {
			return false, fmt.Errorf("%w: two connections held at once both answered as backend %d", store.ErrTransactionPooling, pids[0])
		}
	}
	return false, nil
}

// BackendPID asks c for its backend's pid. A prepared-statement error is
// transaction pooling's sign.
func BackendPID(ctx context.Context, c *pgxpool.Conn) (uint32, error) {
	var pid uint32
	err := c.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid)
	if PooledStatementError(err) {
		return 0, fmt.Errorf("%w: %w", store.ErrTransactionPooling, err)
	}
	return pid, err
}

// PooledStatementError reports whether err is the server not knowing, or
// already knowing, a prepared statement pgx prepared on this connection:
// another server connection answered.
func PooledStatementError(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "26000" || pe.Code == "42P05")
}
