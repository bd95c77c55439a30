package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/xadm/relay/internal/lease"
)

// Execer runs a statement: *pgxpool.Pool, *pgxpool.Conn, *pgx.Conn and pgx.Tx
// satisfy it.
type Execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// Querier is what the relay reads and writes through: a pooled connection
// it holds, or the pool.
type Querier interface {
	Execer
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// AcquireTimeout bounds the wait for a pooled connection. The pass waits for
// it before it sends, so a starved pool delays delivery, and says so, but
// never costs a duplicate.
const AcquireTimeout = 5 * time.Second

// ErrPoolExhausted says the pool had no free connection within a few seconds
// (relay.ErrPoolExhausted).
var ErrPoolExhausted = errors.New("relay: the pool has no free connection")

// ErrReadOnly says the server cannot write: a hot standby, or a server with
// default_transaction_read_only on (relay.ErrReadOnly).
var ErrReadOnly = errors.New("relay: the server is read-only (a hot standby, or default_transaction_read_only)")

// Acquire takes a connection from pool for what, waiting at most
// AcquireTimeout; a pool that stays full is reported as [ErrPoolExhausted]
// with its size, not as a bare deadline.
func Acquire(ctx context.Context, pool *pgxpool.Pool, what string) (*pgxpool.Conn, error) {
	actx, cancel := context.WithTimeout(ctx, AcquireTimeout)
	defer cancel()
	c, err := pool.Acquire(actx)
	if err == nil {
		return c, nil
	}
	if ctx.Err() == nil && actx.Err() != nil {
		st := pool.Stat()
		return nil, fmt.Errorf("%w to %s within %s: all %d connections of the pool are in use; "+
			"give it Concurrency + 2 connections more than the service's own code holds at once", ErrPoolExhausted, what, AcquireTimeout,
			st.MaxConns())
	}
	return nil, fmt.Errorf("relay: acquire a connection to %s: %w", what, err)
}

// ConnectionFailed reports whether err is the connection's failure rather
// than the statement's: the network, a terminated or restarting server, a
// connection already closed. Only such a failure is worth trying again on
// another connection.
func ConnectionFailed(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrPoolExhausted) {
		return false
	}
	if pgconn.SafeToRetry(err) {
		return true
	}
	if code := SQLState(err); code != "" {
		// 08: connection exception; 57P01..57P05: the server ended the
		// session (shutdown, crash, restart, database dropped, idle timeout).
		return code[:2] == "08" || strings.HasPrefix(code, "57P")
	}
	// Not the server's answer: a broken socket, EOF, a closed connection.
	return true
}

// SQLState is the SQLSTATE of a server error in err's chain, "" if none.
func SQLState(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
}

// ErrTransactionPooling says the pool does not keep a session between
// statements: a pooler in transaction or statement mode sits between the
// relay and PostgreSQL (relay.ErrTransactionPooling).
var ErrTransactionPooling = errors.New("relay: transaction pooling: the pool does not keep its session between Statements " +
	"(a pooler such as PgBouncer in pool_mode=transaction or statement sits in front of PostgreSQL); " +
	"elections hold session advisory locks: connect the relay through pool_mode=session or directly to PostgreSQL")

// SessionMoved is the error of a statement that should have run on the
// lock's session, backend pid, and ran on backend got.
func SessionMoved(what string, pid, got uint32) error {
	return fmt.Errorf("%w: %w: %s ran on backend %d, not on the lock's session (backend %d)",
		lease.ErrLost, ErrTransactionPooling, what, got, pid)
}
