package election

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/xadm/relay/internal/lease"
	"github.com/xadm/relay/internal/session"
	"github.com/xadm/relay/internal/store"
)

// This file is the guard of decision 0035: a session-scoped
// pg_try_advisory_lock(hashtext(key)) held on one connection dedicated to
// the job, and released on that same connection (relay.PostgresGuard is its
// public face).

// ErrJobAbandoned is what the function a Scheduler hands its Guard returns
// when it abandoned the job (relay.ErrJobAbandoned): the guard then ends the
// lock's session rather than unlock on it and pool it.
var ErrJobAbandoned = errors.New("relay: scheduler: the job did not return after its context ended; abandoned")

// Guard takes an election's lock on connections of its pool; within one
// process, a second try for a key it holds returns at once.
type Guard struct {
	pool     *pgxpool.Pool
	logger   *slog.Logger
	sessions *session.SessionCheck

	mu   sync.Mutex
	held map[string]bool // keys this guard holds right now
}

// NewGuard returns a guard on pool, logging to logger, that checks once
// (sessions) that the pool keeps its sessions.
func NewGuard(pool *pgxpool.Pool, logger *slog.Logger, sessions *session.SessionCheck) *Guard {
	return &Guard{pool: pool, logger: logger, sessions: sessions, held: make(map[string]bool)}
}

// Pool is the guard's pool; Sessions its pool's check.
func (g *Guard) Pool() *pgxpool.Pool             { return g.pool }
func (g *Guard) Sessions() *session.SessionCheck { return g.sessions }
func (g *Guard) SetLogger(l *slog.Logger)        { g.logger = l }

// session is what the lock statement learned of the lock's session.
type lockSession struct {
	pid      uint32
	readOnly bool
	idle     *string       // its idle_session_timeout before the lease; nil before PostgreSQL 14
	pooled   *pgxpool.Pool // behind a pooler (one that keeps sessions, the check found), the pool: see closeSession
}

// TryRun runs fn only while this process holds the election for key (relay.Guard).
func (g *Guard) TryRun(ctx context.Context, key string, fn func(ctx context.Context) error) (ran bool, err error) {
	h, err := g.Elect(ctx, key)
	if h == nil || err != nil {
		return false, err
	}
	// Unlock even if fn panics; the panic goes on after the lock is released.
	defer func() { err = h.Release(ctx, err) }()
	return true, h.Run(ctx, fn)
}

// Held is an election this process won: the lock's connection, what
// the lock statement learned of its session, and the watch that owns the
// connection from the win to the release. TryRun holds one for a job; the
// relay's loop keeps one across its passes while work keeps arriving
// (elections.go), so a steady trickle's passes take and release no lock.
type Held struct {
	g    *Guard
	key  string
	conn *pgxpool.Conn
	sess lockSession
	w    *watch
	// lost ends, with lease.ErrLost as its cause, when the watch loses the
	// session: each job's ctx ends with it.
	lost     context.Context
	loseWith context.CancelCauseFunc
}

// Elect tries to win the election for key: nil, and no error, when another
// session (or another job of this process) holds it.
func (g *Guard) Elect(ctx context.Context, key string) (*Held, error) {
	if err := g.sessions.Verify(ctx, g.pool, g.logger); err != nil {
		return nil, err
	}
	if !g.claim(key) {
		return nil, nil // this process already runs the job for key
	}
	// An unreachable database fails the election instead of hanging the caller.
	lctx, cancelLock := context.WithTimeout(ctx, session.LockTimeout)
	defer cancelLock()
	won := time.Now()
	conn, locked, sess, err := tryElection(lctx, g.pool, key, store.MarkReplica(store.LockSQL, store.ReplicaOf(ctx)), g.sessions.IsDirect())
	if err != nil {
		g.unclaim(key)
		return nil, err
	}
	switch {
	case sess.readOnly:
		conn.Release()
		g.unclaim(key)
		return nil, fmt.Errorf("%w: not electing %q on backend %d: a lock taken on a standby excludes nobody on the primary",
			store.ErrReadOnly, key, sess.pid)
	case locked == nil:
		// Someone else holds it on this very session: code that took the key on
		// the shared pool and gave the connection back, or a transaction-pooling
		// proxy that lent us the server connection another client locked on.
		// Taking it again would stack and "win"; closing the session would steal
		// their lock. Coalesce, and say so.
		conn.Release()
		g.unclaim(key)
		g.logger.LogAttrs(ctx, slog.LevelWarn, "relay: the election's key is already held by the pooled session the guard was given; coalescing",
			slog.String("key", key), slog.Uint64("pid", uint64(sess.pid)),
			slog.String("hint", "another holder took the key on the shared pool and released the connection, "+
				"or a transaction-pooling proxy sits between the relay and PostgreSQL"))
		return nil, nil
	case !*locked:
		conn.Release()
		g.unclaim(key)
		return nil, nil
	}
	h := &Held{g: g, key: key, conn: conn, sess: sess}
	h.lost, h.loseWith = context.WithCancelCause(context.Background())
	h.w = startWatch(conn.Conn().PgConn(), sess.pid, won, won, lease.Heartbeat, store.ReplicaOf(ctx), h.loseWith)
	return h, nil
}

// Run runs fn as a job of the election: its ctx carries the lease and ends
// when ctx does or when the session is lost.
func (h *Held) Run(ctx context.Context, fn func(ctx context.Context) error) error {
	jobCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(h.lost, func() { cancel(context.Cause(h.lost)) })
	defer stop()
	return fn(lease.With(jobCtx, h.w.lease))
}

// Usable reports whether a kept election may run another job: its session
// not lost, its lease still trusted.
func (h *Held) Usable() bool {
	return h.lost.Err() == nil && h.w.lease.Valid(time.Now()) == nil
}

// Release lets go of the election after its last job, whose error err was,
// and returns err with what the release met.
func (h *Held) Release(ctx context.Context, err error) error {
	defer h.g.unclaim(h.key)
	lost := h.w.stop()
	h.loseWith(nil)
	conn, key, sess := h.conn, h.key, h.sess
	if lost != nil {
		// The watch that saw another backend answer stopped the job; the
		// locks are let go of once it has returned, never under a send.
		closeSession(ctx, conn, key, sess)
		if !errors.Is(err, lease.ErrLost) { // fn usually returns the cause already
			err = errors.Join(err, lost)
		}
		return err
	}
	if errors.Is(err, ErrJobAbandoned) {
		// fn left a job running that ignores its ctx: end the session
		// rather than unlock on it and pool it.
		CloseConn(conn)
		if werr := session.WaitLockGone(ctx, h.g.pool, sess.pid); werr != nil {
			h.g.logger.LogAttrs(ctx, slog.LevelWarn, "relay: the abandoned job's lock session was closed, but pg_locks could not confirm the lock is gone",
				slog.String("key", key), slog.Uint64("pid", uint64(sess.pid)), slog.String("error", werr.Error()))
		}
		return err
	}
	if uerr := releaseElection(ctx, conn, key, sess, store.UnlockSQL); uerr != nil {
		err = errors.Join(err, uerr)
	}
	return err
}

// tryElection takes a connection from pool and tries the election's lock on
// it with stmt (store.LockSQL, or store.LockSharedSQL), on the backend the connection
// answers from first (direct: the one pgx learned at connect). After a failover or a restart the
// pool's idle connections are dead, and the first statement on each fails:
// such a connection is closed (a dead session holds no lock) and the try goes
// on with another, a bounded number of times.
func tryElection(ctx context.Context, pool *pgxpool.Pool, key, stmt string, direct bool) (conn *pgxpool.Conn, locked *bool, sess lockSession, err error) {
	for attempt := 1; ; attempt++ {
		conn, err = store.Acquire(ctx, pool, "take the election "+strconv.Quote(key))
		if err != nil {
			return nil, nil, lockSession{}, err
		}
		var pid uint32
		pid, err = lockSessionPID(ctx, conn, direct)
		if err == nil {
			var ls store.LockSession
			locked, ls, err = store.LockStatement(ctx, conn, stmt, key, pid)
			sess = lockSession{pid: ls.PID, readOnly: ls.ReadOnly, idle: ls.Idle}
		}
		if err == nil && sess.pid != pid {
			CloseConn(conn) // nothing was tried on that backend
			return nil, nil, lockSession{}, fmt.Errorf("relay: try the lock %q: %w", key, store.SessionMoved("the lock statement", pid, sess.pid))
		}
		if !direct {
			sess.pooled = pool
		}
		if err == nil {
			return conn, locked, sess, nil
		}
		tookNothing := lockTookNothing(err)
		if session.PooledStatementError(err) {
			err = fmt.Errorf("%w: %w", store.ErrTransactionPooling, err)
		}
		// The statement may have reached the server and taken the lock:
		// closing the connection is what makes sure it is not held. Behind
		// a pooler, backend pid may be another holder's session (the pooler
		// answered the pid's question from a server connection that holds
		// an election), so its locks are let go of only when this statement
		// may have taken one there.
		dead := conn.Conn().IsClosed()
		if pid != 0 && !tookNothing {
			closeSession(ctx, conn, key, lockSession{pid: pid, pooled: sess.pooled}) // closes conn
		} else {
			CloseConn(conn)
		}
		if !dead || ctx.Err() != nil || attempt == guardLockAttempts {
			return nil, nil, lockSession{}, fmt.Errorf("relay: try the lock %q: %w", key, err)
		}
	}
}

// guardLockAttempts bounds how many dead pooled connections one try skips.
const guardLockAttempts = 3

// releaseElection releases the lock (stmt: store.UnlockSQL, or store.UnlockSharedSQL) on
// the connection that took it, under its own deadline: the caller's ctx may be
// cancelled already, and pgconn sends nothing under a cancelled context. A
// connection that may still hold the lock is closed.
func releaseElection(ctx context.Context, conn *pgxpool.Conn, key string, sess lockSession, stmt string) error {
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), session.UnlockTimeout)
	defer cancel()
	pid := sess.pid
	unlocked, upid, letGo, err := store.UnlockStatement(uctx, conn, stmt, key, sess.idle, pid)
	switch {
	case err != nil:
		closeSession(ctx, conn, key, sess)
		return fmt.Errorf("relay: unlock %q: %w (the connection was closed, which frees the lock)", key, err)
	case upid != pid:
		CloseConn(conn)
		return fmt.Errorf("relay: unlock %q: %w (released nothing there; the lock's backend was ended, which lets it go: %v)",
			key, store.SessionMoved("the unlock", pid, upid), letGo)
	case unlocked == nil || !*unlocked:
		closeSession(ctx, conn, key, sess)
		return fmt.Errorf("%w: unlock %q returned false: backend %d did not hold the lock", lease.ErrLost, key, pid)
	}
	conn.Release()
	return nil
}

// closeSession closes the connection of the lock's session sess, which may
// still hold locks. On a direct connection that ends the session, and frees
// them. Behind a pooler the server connection may outlive the client's (or,
// if the check missed transaction pooling, be another one): letGoSQL lets go
// of them first, on conn, or on another connection of the pool when conn is
// closed already (the pooler passed on a FATAL of another server connection),
// a bounded number of times.
func closeSession(ctx context.Context, conn *pgxpool.Conn, key string, sess lockSession) {
	if sess.pooled != nil {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), session.UnlockTimeout)
		// The statement may land on a server connection that is being ended
		// (another replica letting go of its own): try again, a few times.
		for range guardLockAttempts {
			if !conn.Conn().IsClosed() {
				if err := store.LetGoStatement(uctx, conn, key, sess.pid); err == nil {
					break
				}
				continue
			}
			c, err := sess.pooled.Acquire(uctx)
			if err != nil {
				break
			}
			err = store.LetGoStatement(uctx, c, key, sess.pid)
			if err != nil {
				CloseConn(c)
				continue
			}
			c.Release()
			break
		}
		cancel()
	}
	CloseConn(conn)
}

func (g *Guard) claim(key string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.held[key] {
		return false
	}
	g.held[key] = true
	return true
}

func (g *Guard) unclaim(key string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.held, key)
}

// CloseConn takes conn out of the pool and closes it: the server ends the
// session and frees any lock it held. It never goes back to the pool.
func CloseConn(conn *pgxpool.Conn) {
	c := conn.Hijack()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = c.Close(ctx)
}
