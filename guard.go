package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/xadm/relay/internal/lease"
	"github.com/xadm/relay/internal/store"

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
var ErrElectionLost = lease.ErrLost

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
// The election is a lease the server enforces: while it holds the lock, the
// session runs with idle_session_timeout = 10s (PostgreSQL 14 and later) and
// the guard's heartbeat touches it every 2 s. A holder that stops answering —
// its host cut off without a FIN, its process frozen (SIGSTOP, a VM pause), a
// proxy in between that keeps the socket open — is ended by the server 10 s
// after its last heartbeat, which frees the lock for another replica. The
// holder itself starts no new work once 7 s have passed since its last
// heartbeat answered, so it has stopped before the server frees the lock
// (see the lease in lease.go). PostgreSQL 13 has no idle_session_timeout: the
// guard then sets TCP keepalives on the session (4 s, every 2 s, 3 probes) and
// tcp_user_timeout (10 s), which end a partitioned holder on a direct
// connection within about 10 s, but not a frozen process or a holder behind a
// proxy: there the lock is held until the freeze ends or the proxy gives up.
//
// Every statement the guard runs on the lock's session carries the comment
// "/* relay election */", and the heartbeat's also says since when it holds
// the election ("/* relay election since 2026-11-30T10:00:00Z */"), so
// pg_stat_activity.query tells a Go relay's election, and its age, from any
// other holder (a JVM relay, an operator). A server that is read-only (in recovery, or with
// default_transaction_read_only) is never elected on: a lock on a standby
// excludes nobody on the primary. TryRun returns an error wrapping [ErrReadOnly].
//
// The lock's connection is taken from the pool for the whole job and given back
// only after pg_advisory_unlock returned true on it; a connection that may still
// hold the lock (the unlock failed, returned false or could not be sent) is
// closed instead, so the server frees the lock with the session; so is the
// connection of a job that fn abandoned ([ErrJobAbandoned]), and TryRun returns
// once pg_locks no longer shows the lock. While the job
// runs, the guard watches that connection: the server's goodbye when the session
// is terminated is noticed at once, and a heartbeat every few seconds catches a
// connection that died silently. Either cancels the job's ctx with [ErrElectionLost].
//
// Session locks need session pooling: behind PgBouncer in transaction mode the
// lock is taken and released on whatever server connection the proxy picks, and
// the guard cannot protect anything. Before its first election the guard checks
// that the pool keeps its sessions (pooling.go), and refuses with an error
// wrapping [ErrTransactionPooling] when it does not. Should that check miss,
// every statement on the lock's session carries the session's backend pid and
// acts only on that backend: one landing on another backend changes nothing,
// fails the election with ErrTransactionPooling and ends the backend that holds
// the lock, which lets it go.
//
// Within one process, a second TryRun for a key that is already held returns
// false at once, so one session never takes the lock twice (session locks stack).
type PostgresGuard struct {
	pool   *pgxpool.Pool
	logger *slog.Logger

	// sessions checks, once, that pool keeps its sessions (pooling.go).
	sessions *sessionCheck

	mu   sync.Mutex
	held map[string]bool // keys this guard holds right now
}

var _ Guard = (*PostgresGuard)(nil)

// NewPostgresGuard returns a guard that takes its locks on connections of pool.
func NewPostgresGuard(pool *pgxpool.Pool) *PostgresGuard {
	return &PostgresGuard{pool: pool, logger: slog.Default(), sessions: &sessionCheck{}, held: make(map[string]bool)}
}

// parseElectionMark reads a holder's last statement: whether a Go relay's
// guard ran it, since when it holds the election — the heartbeat's mark,
// or else the start of the statement (the lock's own, which won it) — and
// the replica whose pass it runs, when the statement names it.
func parseElectionMark(query string, queryStart time.Time) (since time.Time, replica string, ok bool) {
	rest, ok := strings.CutPrefix(query, "/* relay election")
	if !ok {
		return time.Time{}, "", false
	}
	since = queryStart
	mark, _, _ := strings.Cut(rest, "*/")
	fields := strings.Fields(mark)
	for i := 0; i < len(fields); i++ {
		switch f := fields[i]; {
		case f == "since" && i+1 < len(fields):
			if t, err := time.Parse(time.RFC3339, fields[i+1]); err == nil {
				since = t
			}
			i++
		case strings.HasPrefix(f, "replica="):
			replica = strings.TrimPrefix(f, "replica=")
		}
	}
	return since, replica, true
}

// session is what the lock statement learned of the lock's session.
type session struct {
	pid      uint32
	readOnly bool
	idle     *string       // its idle_session_timeout before the lease; nil before PostgreSQL 14
	pooled   *pgxpool.Pool // behind a pooler (one that keeps sessions, the check found), the pool: see closeSession
}

// TryRun implements [Guard].
func (g *PostgresGuard) TryRun(ctx context.Context, key string, fn func(ctx context.Context) error) (ran bool, err error) {
	h, err := g.elect(ctx, key)
	if h == nil || err != nil {
		return false, err
	}
	// Unlock even if fn panics; the panic goes on after the lock is released.
	defer func() { err = h.release(ctx, err) }()
	return true, h.run(ctx, fn)
}

// heldElection is an election this process won: the lock's connection, what
// the lock statement learned of its session, and the watch that owns the
// connection from the win to the release. TryRun holds one for a job; the
// relay's loop keeps one across its passes while work keeps arriving
// (election.go), so a steady trickle's passes take and release no lock.
type heldElection struct {
	g    *PostgresGuard
	key  string
	conn *pgxpool.Conn
	sess session
	w    *watch
	// lost ends, with ErrElectionLost as its cause, when the watch loses the
	// session: each job's ctx ends with it.
	lost     context.Context
	loseWith context.CancelCauseFunc
}

// elect tries to win the election for key: nil, and no error, when another
// session (or another job of this process) holds it.
func (g *PostgresGuard) elect(ctx context.Context, key string) (*heldElection, error) {
	if err := g.sessions.verify(ctx, g.pool, g.logger); err != nil {
		return nil, err
	}
	if !g.claim(key) {
		return nil, nil // this process already runs the job for key
	}
	// An unreachable database fails the election instead of hanging the caller.
	lctx, cancelLock := context.WithTimeout(ctx, guardLockTimeout)
	defer cancelLock()
	won := time.Now()
	conn, locked, sess, err := tryElection(lctx, g.pool, key, store.MarkReplica(store.LockSQL, store.ReplicaOf(ctx)), g.sessions.isDirect())
	if err != nil {
		g.unclaim(key)
		return nil, err
	}
	switch {
	case sess.readOnly:
		conn.Release()
		g.unclaim(key)
		return nil, fmt.Errorf("%w: not electing %q on backend %d: a lock taken on a standby excludes nobody on the primary",
			ErrReadOnly, key, sess.pid)
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
	h := &heldElection{g: g, key: key, conn: conn, sess: sess}
	h.lost, h.loseWith = context.WithCancelCause(context.Background())
	h.w = startWatch(conn.Conn().PgConn(), sess.pid, won, won, guardHeartbeat, store.ReplicaOf(ctx), h.loseWith)
	return h, nil
}

// run runs fn as a job of the election: its ctx carries the lease and ends
// when ctx does or when the session is lost.
func (h *heldElection) run(ctx context.Context, fn func(ctx context.Context) error) error {
	jobCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(h.lost, func() { cancel(context.Cause(h.lost)) })
	defer stop()
	return fn(lease.With(jobCtx, h.w.lease))
}

// usable reports whether a kept election may run another job: its session
// not lost, its lease still trusted.
func (h *heldElection) usable() bool {
	return h.lost.Err() == nil && h.w.lease.Valid(time.Now()) == nil
}

// release lets go of the election after its last job, whose error err was,
// and returns err with what the release met.
func (h *heldElection) release(ctx context.Context, err error) error {
	defer h.g.unclaim(h.key)
	lost := h.w.stop()
	h.loseWith(nil)
	conn, key, sess := h.conn, h.key, h.sess
	if lost != nil {
		// The watch that saw another backend answer stopped the job; the
		// locks are let go of once it has returned, never under a send.
		closeSession(ctx, conn, key, sess)
		if !errors.Is(err, ErrElectionLost) { // fn usually returns the cause already
			err = errors.Join(err, lost)
		}
		return err
	}
	if errors.Is(err, ErrJobAbandoned) {
		// fn left a job running that ignores its ctx: end the session
		// rather than unlock on it and pool it.
		closeConn(conn)
		if werr := waitLockGone(ctx, h.g.pool, sess.pid); werr != nil {
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

// guardSessionEndTimeout bounds waitLockGone.
const guardSessionEndTimeout = 2 * time.Second

// waitLockGone returns once pg_locks shows no advisory lock of backend pid, whose
// connection was just closed: the server drops a session's locks as its
// backend exits, a moment after the client has gone.
func waitLockGone(ctx context.Context, pool *pgxpool.Pool, pid uint32) error {
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), guardSessionEndTimeout)
	defer cancel()
	for {
		held, err := store.SessionLocksHeld(wctx, pool, pid)
		switch {
		case err != nil:
			return err
		case !held:
			return nil
		}
		select {
		case <-wctx.Done():
			return fmt.Errorf("backend %d still holds advisory locks after %s", pid, guardSessionEndTimeout)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// tryElection takes a connection from pool and tries the election's lock on
// it with stmt (store.LockSQL, or store.LockSharedSQL), on the backend the connection
// answers from first (direct: the one pgx learned at connect). After a failover or a restart the
// pool's idle connections are dead, and the first statement on each fails:
// such a connection is closed (a dead session holds no lock) and the try goes
// on with another, a bounded number of times.
func tryElection(ctx context.Context, pool *pgxpool.Pool, key, stmt string, direct bool) (conn *pgxpool.Conn, locked *bool, sess session, err error) {
	for attempt := 1; ; attempt++ {
		conn, err = store.Acquire(ctx, pool, "take the election "+strconv.Quote(key))
		if err != nil {
			return nil, nil, session{}, err
		}
		var pid uint32
		pid, err = lockSessionPID(ctx, conn, direct)
		if err == nil {
			var ls store.LockSession
			locked, ls, err = store.LockStatement(ctx, conn, stmt, key, pid)
			sess = session{pid: ls.PID, readOnly: ls.ReadOnly, idle: ls.Idle}
		}
		if err == nil && sess.pid != pid {
			closeConn(conn) // nothing was tried on that backend
			return nil, nil, session{}, fmt.Errorf("relay: try the lock %q: %w", key, store.SessionMoved("the lock statement", pid, sess.pid))
		}
		if !direct {
			sess.pooled = pool
		}
		if err == nil {
			return conn, locked, sess, nil
		}
		tookNothing := lockTookNothing(err)
		if pooledStatementError(err) {
			err = fmt.Errorf("%w: %w", ErrTransactionPooling, err)
		}
		// The statement may have reached the server and taken the lock:
		// closing the connection is what makes sure it is not held. Behind
		// a pooler, backend pid may be another holder's session (the pooler
		// answered the pid's question from a server connection that holds
		// an election), so its locks are let go of only when this statement
		// may have taken one there.
		dead := conn.Conn().IsClosed()
		if pid != 0 && !tookNothing {
			closeSession(ctx, conn, key, session{pid: pid, pooled: sess.pooled}) // closes conn
		} else {
			closeConn(conn)
		}
		if !dead || ctx.Err() != nil || attempt == guardLockAttempts {
			return nil, nil, session{}, fmt.Errorf("relay: try the lock %q: %w", key, err)
		}
	}
}

// guardLockAttempts bounds how many dead pooled connections one try skips.
const guardLockAttempts = 3

// releaseElection releases the lock (stmt: store.UnlockSQL, or store.UnlockSharedSQL) on
// the connection that took it, under its own deadline: the caller's ctx may be
// cancelled already, and pgconn sends nothing under a cancelled context. A
// connection that may still hold the lock is closed.
func releaseElection(ctx context.Context, conn *pgxpool.Conn, key string, sess session, stmt string) error {
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), guardUnlockTimeout)
	defer cancel()
	pid := sess.pid
	unlocked, upid, letGo, err := store.UnlockStatement(uctx, conn, stmt, key, sess.idle, pid)
	switch {
	case err != nil:
		closeSession(ctx, conn, key, sess)
		return fmt.Errorf("relay: unlock %q: %w (the connection was closed, which frees the lock)", key, err)
	case upid != pid:
		closeConn(conn)
		return fmt.Errorf("relay: unlock %q: %w (released nothing there; the lock's backend was ended, which lets it go: %v)",
			key, store.SessionMoved("the unlock", pid, upid), letGo)
	case unlocked == nil || !*unlocked:
		closeSession(ctx, conn, key, sess)
		return fmt.Errorf("%w: unlock %q returned false: backend %d did not hold the lock", ErrElectionLost, key, pid)
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
func closeSession(ctx context.Context, conn *pgxpool.Conn, key string, sess session) {
	if sess.pooled != nil {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), guardUnlockTimeout)
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
				closeConn(c)
				continue
			}
			c.Release()
			break
		}
		cancel()
	}
	closeConn(conn)
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
