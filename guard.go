package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Guard runs a job on at most one replica at a time. The relay's elected pass
// uses it, and so can any other scheduled job that must run on one replica of N.
type Guard interface {
	// TryRun runs fn only while this process holds the election for key. It
	// reports false, without running fn, when another session holds it.
	//
	// The ctx passed to fn is cancelled, with cause [ErrElectionLost], if the
	// election is lost while fn runs; fn should stop starting new work then.
	// ran is true whenever fn was called, even if it returned an error.
	TryRun(ctx context.Context, key string, fn func(ctx context.Context) error) (ran bool, err error)
}

// ErrElectionLost says the election was lost while the elected job ran: the
// lock's session died (failover, pg_terminate_backend, idle_session_timeout, a
// proxy dropping the connection) or the lock was not where the guard believed it
// was (a transaction-pooling proxy). Another replica may hold the lock now.
var ErrElectionLost = errors.New("relay: election lost: the advisory lock is no longer held by this session")

// Timings of PostgresGuard. The unlock and the heartbeat run under their own
// short deadlines, never under a caller's context that may already be cancelled.
const (
	guardLockTimeout      = 30 * time.Second
	guardUnlockTimeout    = 5 * time.Second
	guardHeartbeat        = 2 * time.Second
	guardHeartbeatTimeout = 5 * time.Second
)

// PostgresGuard is the [Guard] of decision 0035: a session-scoped
// pg_try_advisory_lock(hashtext(key)) held on one connection dedicated to the
// job, and released on that same connection. The key is hashed by the server,
// exactly as the JVM relay does, so the two exclude each other.
//
// The lock's connection is taken from the pool for the whole job and given back
// only after pg_advisory_unlock returned true on it; a connection that may still
// hold the lock (the unlock failed, returned false or could not be sent) is
// closed instead, so the server frees the lock with the session. While the job
// runs, the guard watches that connection: the server's goodbye when the session
// is terminated is noticed at once, and a heartbeat every few seconds catches a
// connection that died silently. Either cancels the job's ctx with [ErrElectionLost].
//
// Session locks need session pooling: behind PgBouncer in transaction mode the
// lock is taken and released on whatever server connection the proxy picks, and
// the guard cannot protect anything. It reports that as an error wherever it can
// tell (the backend changed between the lock and the unlock or a heartbeat).
//
// Within one process, a second TryRun for a key that is already held returns
// false at once, so one session never takes the lock twice (session locks stack).
type PostgresGuard struct {
	pool   *pgxpool.Pool
	logger *slog.Logger

	mu   sync.Mutex
	held map[string]bool // keys this guard holds right now
}

var _ Guard = (*PostgresGuard)(nil)

// NewPostgresGuard returns a guard that takes its locks on connections of pool.
func NewPostgresGuard(pool *pgxpool.Pool) *PostgresGuard {
	return &PostgresGuard{pool: pool, logger: slog.Default(), held: make(map[string]bool)}
}

// lockSQL takes the lock unless this very session already holds it, which would
// stack: a connection handed back to the pool by another holder still holding
// it. NULL means "already held by this session", and the guard coalesces.
const lockSQL = `SELECT CASE WHEN EXISTS (
    SELECT 1 FROM pg_locks
    WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND objsubid = 1 AND granted
      AND classid = ((hashtext($1)::bigint >> 32) & 4294967295)::oid
      AND objid = (hashtext($1)::bigint & 4294967295)::oid)
  THEN NULL ELSE pg_try_advisory_lock(hashtext($1)) END, pg_backend_pid()`

const unlockSQL = `SELECT pg_advisory_unlock(hashtext($1)), pg_backend_pid()`

// TryRun implements [Guard].
func (g *PostgresGuard) TryRun(ctx context.Context, key string, fn func(ctx context.Context) error) (ran bool, err error) {
	if !g.claim(key) {
		return false, nil // this process already runs the job for key
	}
	defer g.unclaim(key)

	// An unreachable database fails the election instead of hanging the caller.
	lctx, cancelLock := context.WithTimeout(ctx, guardLockTimeout)
	defer cancelLock()
	conn, locked, pid, err := g.tryLock(lctx, key)
	if err != nil {
		return false, err
	}
	switch {
	case locked == nil:
		// Someone else holds it on this very session: code that took the key on
		// the shared pool and gave the connection back, or a transaction-pooling
		// proxy that lent us the server connection another client locked on.
		// Taking it again would stack and "win"; closing the session would steal
		// their lock. Coalesce, and say so.
		conn.Release()
		g.logger.LogAttrs(ctx, slog.LevelWarn, "relay: the election's key is already held by the pooled session the guard was given; coalescing",
			slog.String("key", key), slog.Uint64("pid", uint64(pid)),
			slog.String("hint", "another holder took the key on the shared pool and released the connection, "+
				"or a transaction-pooling proxy sits between the relay and PostgreSQL"))
		return false, nil
	case !*locked:
		conn.Release()
		return false, nil
	}

	jobCtx, cancel := context.WithCancelCause(ctx)
	w := startWatch(conn.Conn().PgConn(), pid, cancel)

	// Unlock even if fn panics; the panic goes on after the lock is released.
	defer func() {
		cancel(nil)
		lost := w.stop()
		if lost != nil {
			closeConn(conn)
			if !errors.Is(err, ErrElectionLost) { // fn usually returns the cause already
				err = errors.Join(err, lost)
			}
			return
		}
		if uerr := g.unlock(ctx, conn, key, pid); uerr != nil {
			err = errors.Join(err, uerr)
		}
	}()
	return true, fn(jobCtx)
}

// tryLock takes a connection from the pool and tries the lock on it. After a
// failover or a restart the pool's idle connections are dead, and the first
// statement on each fails: such a connection is closed (a dead session holds
// no lock) and the try goes on with another, a bounded number of times.
func (g *PostgresGuard) tryLock(ctx context.Context, key string) (conn *pgxpool.Conn, locked *bool, pid uint32, err error) {
	for attempt := 1; ; attempt++ {
		conn, err = g.pool.Acquire(ctx)
		if err != nil {
			return nil, nil, 0, fmt.Errorf("relay: acquire a connection for the lock %q: %w", key, err)
		}
		err = conn.QueryRow(ctx, lockSQL, key).Scan(&locked, &pid)
		if err == nil {
			return conn, locked, pid, nil
		}
		// The statement may have reached the server and taken the lock:
		// closing the connection is what makes sure it is not held.
		dead := conn.Conn().IsClosed()
		closeConn(conn)
		if !dead || ctx.Err() != nil || attempt == guardLockAttempts {
			return nil, nil, 0, fmt.Errorf("relay: try the lock %q: %w", key, err)
		}
	}
}

// guardLockAttempts bounds how many dead pooled connections one try skips.
const guardLockAttempts = 3

// unlock releases the lock on the connection that took it, under its own
// deadline: the caller's ctx may be cancelled already, and pgconn sends nothing
// under a cancelled context. A connection that may still hold the lock is closed.
func (g *PostgresGuard) unlock(ctx context.Context, conn *pgxpool.Conn, key string, pid uint32) error {
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), guardUnlockTimeout)
	defer cancel()
	var unlocked bool
	var upid uint32
	err := conn.QueryRow(uctx, unlockSQL, key).Scan(&unlocked, &upid)
	switch {
	case err != nil:
		closeConn(conn)
		return fmt.Errorf("relay: unlock %q: %w (the connection was closed, which frees the lock)", key, err)
	case upid != pid:
		closeConn(conn)
		return fmt.Errorf("%w: lock %q was taken by backend %d but released on backend %d: a transaction-pooling "+
			"proxy sits between the relay and PostgreSQL; session advisory locks need session pooling", ErrElectionLost, key, pid, upid)
	case !unlocked:
		closeConn(conn)
		return fmt.Errorf("%w: unlock %q returned false: backend %d did not hold the lock", ErrElectionLost, key, pid)
	}
	conn.Release()
	return nil
}

func (g *PostgresGuard) claim(key string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.held[key] {
		return false
	}
	g.held[key] = true
	return true
}

func (g *PostgresGuard) unclaim(key string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.held, key)
}

// closeConn takes conn out of the pool and closes it: the server ends the
// session and frees any lock it held. It never goes back to the pool.
func closeConn(conn *pgxpool.Conn) {
	c := conn.Hijack()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = c.Close(ctx)
}

// watch owns the lock's connection while the job runs. It blocks reading it, so
// the server's FATAL message when the session is terminated (or the socket's
// end) arrives at once, and every guardHeartbeat it checks the session answers
// as the same backend.
type watch struct {
	conn *pgconn.PgConn
	pid  uint32
	lost func(error) // called once, with why, when the session is lost
	err  error       // why the session was lost; read after done
	done chan struct{}

	mu      sync.Mutex
	stopped bool
	reading bool // blocked in WaitForNotification, so stop may interrupt it
}

func startWatch(conn *pgconn.PgConn, pid uint32, lost func(error)) *watch {
	w := &watch{conn: conn, pid: pid, lost: lost, done: make(chan struct{})}
	go w.run()
	return w
}

func (w *watch) run() {
	defer close(w.done)
	for {
		// The read deadline is the heartbeat timer, and stop interrupts the read
		// by moving it to now. Both happen under mu, and only while reading, so a
		// heartbeat in flight is never cut short by stop.
		w.mu.Lock()
		if w.stopped {
			w.mu.Unlock()
			return
		}
		w.reading = true
		_ = w.conn.Conn().SetReadDeadline(time.Now().Add(guardHeartbeat))
		w.mu.Unlock()

		err := w.conn.WaitForNotification(context.Background())

		w.mu.Lock()
		w.reading = false
		_ = w.conn.Conn().SetReadDeadline(time.Time{})
		stopped := w.stopped
		w.mu.Unlock()

		switch {
		case err == nil:
			// A notification; nobody listens on this session, but it is harmless.
		case !pgconn.Timeout(err):
			w.fail(fmt.Errorf("%w: %v", ErrElectionLost, err))
			return
		case stopped:
			return
		default:
			if err := w.heartbeat(); err != nil {
				w.fail(err)
				return
			}
		}
	}
}

func (w *watch) heartbeat() error {
	ctx, cancel := context.WithTimeout(context.Background(), guardHeartbeatTimeout)
	defer cancel()
	rr := w.conn.ExecParams(ctx, "SELECT pg_backend_pid()", nil, nil, nil, nil).Read()
	if rr.Err != nil {
		return fmt.Errorf("%w: heartbeat: %v", ErrElectionLost, rr.Err)
	}
	if len(rr.Rows) != 1 || len(rr.Rows[0]) != 1 {
		return fmt.Errorf("%w: heartbeat: unexpected answer", ErrElectionLost)
	}
	if got := string(rr.Rows[0][0]); got != fmt.Sprint(w.pid) {
		return fmt.Errorf("%w: the lock was taken by backend %d but the session now answers as backend %s: "+
			"a transaction-pooling proxy sits between the relay and PostgreSQL", ErrElectionLost, w.pid, got)
	}
	return nil
}

func (w *watch) fail(err error) {
	w.err = err
	w.lost(err)
}

// stop ends the watch and reports whether the session was lost meanwhile.
func (w *watch) stop() error {
	w.mu.Lock()
	w.stopped = true
	if w.reading {
		_ = w.conn.Conn().SetReadDeadline(time.Now())
	}
	w.mu.Unlock()
	<-w.done // run has returned: err is final
	return w.err
}
