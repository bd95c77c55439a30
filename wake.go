package relay

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/xadm/relay/internal/election"
	"github.com/xadm/relay/internal/lease"
	"github.com/xadm/relay/internal/store"
)

// This file is the wake-up on commit: producers NOTIFY when they write a
// message (Enqueue does, and a trigger can for producers it does not write
// for), and each started relay LISTENs on a connection of its own, so a
// message reaches its Sender within milliseconds of its commit instead of at
// the next poll. Polling every Interval stays underneath: rows written without
// a NOTIFY (the JVM, plain SQL), and relays behind a transaction-pooling proxy
// where LISTEN cannot work, are still delivered within one Interval.
//
// PostgreSQL commits the transactions that NOTIFY one at a time (they take a
// global lock through their WAL flush): measured, 8 producers that each
// notify commit at 0.41× their rate without. So only one transaction at a
// time carries the NOTIFY: it takes the wake-up token, a transaction-scoped
// try-lock on the channel, and the others, finding it taken, do not notify.
// Even one notifier at a time cost 8 producers 0.79–0.87× of a plain INSERT's
// commits (issue 21): a transaction was nearly always holding the token, and
// its commit was the slow one. So a producer process whose Enqueues of a type
// and table come densely (less than wakeDenseGap, 2ms, apart) tries at most
// once per wakeUpWindow (5ms): the other Enqueues of the window write their
// row with neither the token's try nor a NOTIFY. A sparser producer (200
// msg/s is 5ms apart) tries on every Enqueue, as before, so that a trickle's
// latency does not wait for the relay's follow-up. Rows written
// without a NOTIFY are found by the woken pass if they committed before it
// selected, else by the relay's follow-up poll, wakeFollowUp after a woken
// pass that delivered. A token held by a long transaction would silence every
// other producer for its length, so an attempt notifies, token or not, when
// its process has not notified for wakeForceAfter (50ms). Enqueue and the
// trigger take the same token; the trigger has no window.

// Timings of the wake-up.
const (
	// wakeFollowUp is how soon after a woken pass that delivered rows the
	// relay looks again, for rows whose producers did not notify because
	// another had just done so.
	wakeFollowUp = 5 * time.Millisecond
	// listenProbeTimeout bounds the wait for the listener's own test
	// notification, which does not come back through a transaction-pooling
	// proxy.
	listenProbeTimeout = 2 * time.Second
	// listenRetryMax caps the wait before the listener connects again.
	listenRetryMax = 30 * time.Second
)

// The timings of a producer process's wake-up attempts (see above).
const (
	// wakeUpWindow is how often, at most, a producer process tries to wake
	// the relays of a table for a type: one Enqueue per window carries the
	// attempt (the wake-up token's try, and the NOTIFY if it gets the token);
	// the others of the window write their row without either. It is
	// wakeFollowUp, so that the rows of the window are, most of the time,
	// committed before the follow-up poll of the pass the attempt woke.
	wakeUpWindow = wakeFollowUp
	// wakeDenseGap is the gap between two Enqueues of a process (of one type
	// and table) under which the second is dense: then wakeUpWindow applies.
	wakeDenseGap = 2 * time.Millisecond
	// wakeForceAfter is how long a producer process goes without notifying a
	// type and table before an attempt notifies without the token.
	wakeForceAfter = 50 * time.Millisecond
)

// wakeWindows is a producer's wake-up attempts, per channel and type, with
// their timings. Every Enqueue shares one, enqueueWakes; a test gives Enqueue
// one of its own (withWakeWindows) to change the timings.
type wakeWindows struct {
	window, denseGap, forceAfter int64     // nanoseconds
	clock                        time.Time // the monotonic origin of the states' times
	states                       sync.Map  // channel + "\x00" + type → *wakeState
}

func newWakeWindows(window, denseGap, forceAfter time.Duration) *wakeWindows {
	return &wakeWindows{window: int64(window), denseGap: int64(denseGap), forceAfter: int64(forceAfter), clock: time.Now()}
}

// enqueueWakes is this process's wake-up attempts, shared by every Enqueue:
// set once here, never reassigned.
var enqueueWakes = newWakeWindows(wakeUpWindow, wakeDenseGap, wakeForceAfter)

// wakeState is when a producer last tried to wake, and last notified, a
// channel for a type (nanoseconds on its wakeWindows' clock).
type wakeState struct {
	of       *wakeWindows
	channel  string
	seen     atomic.Int64 // the last Enqueue
	attempt  atomic.Int64
	notified atomic.Int64
}

// attempt reports whether the Enqueue of a message of typ into channel's
// table should try to wake the relays (nil: it comes densely after another
// Enqueue of this producer, and one tried within the window), and whether it
// should notify even without the token (this producer has not notified for
// forceAfter).
func (ws *wakeWindows) attempt(channel, typ string) (w *wakeState, force bool) {
	return ws.attemptAt(channel, typ, int64(time.Since(ws.clock)))
}

// attemptAt is attempt at now, nanoseconds on ws.clock.
func (ws *wakeWindows) attemptAt(channel, typ string, now int64) (w *wakeState, force bool) {
	v, ok := ws.states.Load(channel + "\x00" + typ)
	if !ok {
		v, _ = ws.states.LoadOrStore(channel+"\x00"+typ, &wakeState{of: ws, channel: channel})
	}
	w = v.(*wakeState)
	seen := w.seen.Swap(now)
	if dense := seen != 0 && now-seen < ws.denseGap; !dense {
		w.attempt.Store(now)
	} else if prev := w.attempt.Load(); prev != 0 && now-prev < ws.window || !w.attempt.CompareAndSwap(prev, now) {
		return nil, false
	}
	last := w.notified.Load()
	return w, last == 0 || now-last >= ws.forceAfter
}

// notifiedNow records that an attempt notified.
func (w *wakeState) notifiedNow() { w.notified.Store(max(int64(time.Since(w.of.clock)), 1)) }

// listen is the started relay's listener: a connection of its own on which it
// LISTENs for its table's channel, waking the loop for each notification of
// a type it delivers. It first checks that its own test notification comes
// back: through a transaction-pooling proxy it does not, and the relay then
// says so once and polls. A lost connection is replaced, with a backoff; the
// loop is woken after each reconnection, for what was missed meanwhile.
//
// The same session carries the relay's presence (presence.go): its locks are
// taken once the session is known to be one (the probe came back), and again
// after each reconnection. With WakeOnCommit off, the session LISTENs for
// nothing and only carries presence.
func (r *Relay) listen(ctx context.Context, l *loop) {
	defer close(l.listening)
	var attempted sync.Once
	defer attempted.Do(func() { close(l.attempted) })
	wake := r.cfg.WakeOnCommit
	if !wake {
		attempted.Do(func() { close(l.attempted) }) // no LISTEN to wait for
	}
	channel := store.WakeChannel(r.tableID)
	wait, reconnect := time.Second, false
	for ctx.Err() == nil {
		conn, pid, err := r.openListener(ctx, channel, wake)
		attempted.Do(func() { close(l.attempted) })
		switch {
		case errors.Is(err, election.ErrPresenceMoved):
			r.logger.LogAttrs(ctx, slog.LevelError, "relay: presence is off: "+err.Error()+"; relayctl who and the console will not list this replica",
				slog.String("replica", r.presence.ID()))
			return
		case errors.Is(err, errListenUnreachable) && r.dropsSessions(ctx):
			r.logger.LogAttrs(ctx, slog.LevelWarn, "relay: wake-ups on commit are off: a notification to this session never came back "+
				"(the pool does not keep its sessions: a transaction-pooling proxy); passes run every Interval",
				slog.String("channel", channel), durationAttr("interval", r.cfg.Interval))
			return
		case err != nil:
			if ctx.Err() != nil {
				return
			}
			r.logger.LogAttrs(ctx, slog.LevelWarn, "relay: cannot listen for wake-ups; passes run every Interval until it can",
				slog.String("channel", channel), durationAttr("retry_in", wait), slog.String("error", err.Error()))
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
			wait = min(2*wait, listenRetryMax)
			continue
		}
		if wait > time.Second || reconnect {
			l.wakeUp() // what was committed while nobody listened
		}
		wait, reconnect = time.Second, true
		err = r.waitForWakeUps(ctx, conn, l, pid)
		// No job can cut a wait short any more (waitForWakeUps let go of the
		// session): clear the keepalive's deadline it may have left, so that
		// the release is sent and answered, and Stop returns with the
		// replica gone.
		_ = conn.PgConn().Conn().SetReadDeadline(time.Time{})
		r.leavePresence(conn, pid, err)
		closeCtx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = conn.Close(closeCtx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, election.ErrPresenceMoved) {
			r.logger.LogAttrs(ctx, slog.LevelError, "relay: presence is off: "+err.Error()+"; relayctl who and the console will not list this replica",
				slog.String("replica", r.presence.ID()))
			return
		}
		r.logger.LogAttrs(ctx, slog.LevelWarn, "relay: the wake-up listener's connection was lost; connecting again",
			slog.String("channel", channel), slog.String("error", err.Error()))
	}
}

// leavePresence lets go of the presence on conn, backend pid, before it
// is closed (why: what ended its session), and logs when it may outlive it
// a moment (presence.leave).
func (r *Relay) leavePresence(conn *pgx.Conn, pid uint32, why error) {
	if err := r.presence.Leave(conn, r.pool, pid, why); err != nil {
		r.logger.LogAttrs(context.Background(), slog.LevelWarn, "relay: an earlier session's presence may outlive it a moment", slog.String("error", err.Error()))
	}
}

// errListenUnreachable says the listener's own notification did not come
// back in time. Through a transaction-pooling proxy it never does; on a pool
// that keeps its sessions it was late (a loaded server), and the listener
// connects again, as after any other failure, rather than leave the replica
// without wake-ups and presence for its life.
var errListenUnreachable = fmt.Errorf("relay: the listener's own test notification did not come back within %s", listenProbeTimeout)

// dropsSessions reports whether the relay's pool was found not to keep its
// sessions (a transaction-pooling proxy), by the election's check when it has
// one, else by the same probe; false when it keeps them or the probe could
// not tell.
func (r *Relay) dropsSessions(ctx context.Context) bool {
	if r.sessions != nil {
		return errors.Is(r.sessions.Verify(ctx, r.pool, r.logger), ErrTransactionPooling)
	}
	cctx, cancel := context.WithTimeout(ctx, election.SessionCheckTimeout)
	defer cancel()
	_, err := election.ProbeSessions(cctx, r.pool)
	return errors.Is(err, ErrTransactionPooling)
}

// openListener takes a connection out of the pool, LISTENs on it and checks
// that a notification comes back (only when wake), and takes the relay's
// presence on it. It returns the connection and its backend's pid.
func (r *Relay) openListener(ctx context.Context, channel string, wake bool) (*pgx.Conn, uint32, error) {
	pc, err := store.Acquire(ctx, r.pool, "listen for wake-ups")
	if err != nil {
		return nil, 0, err
	}
	conn := pc.Hijack() // ours until closed: it never goes back to the pool
	fail := func(err error) (*pgx.Conn, uint32, error) {
		closeCtx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = conn.Close(closeCtx)
		return nil, 0, err
	}
	present := func() (*pgx.Conn, uint32, error) {
		pctx, cancel := context.WithTimeout(ctx, election.LockTimeout)
		defer cancel()
		pid, err := r.presence.Take(pctx, conn)
		if err != nil {
			return fail(err)
		}
		// Through a transaction-pooling proxy the next statement may answer
		// from another backend: then the locks are not this session's.
		if err := r.presence.Beat(pctx, conn, pid); err != nil {
			r.leavePresence(conn, pid, err) // a stop meanwhile: gone before Stop returns
			return fail(err)
		}
		return conn, pid, nil
	}
	if !wake {
		return present()
	}
	lctx, cancel := context.WithTimeout(ctx, listenProbeTimeout)
	defer cancel()
	if _, err := conn.Exec(lctx, store.ListenSQL(channel)); err != nil {
		return fail(err)
	}
	var token [8]byte
	_, _ = rand.Read(token[:])
	probe := "probe:" + hex.EncodeToString(token[:])
	// The probe goes out on another connection: through a transaction-pooling
	// proxy the LISTEN's server connection went back to the proxy's pool, and
	// a notification to it never reaches this client, even if the proxy
	// happens to lend this client the same server connection again.
	if err := store.WakeProbe(lctx, r.pool, channel, probe); err != nil {
		return fail(err)
	}
	for {
		n, err := conn.WaitForNotification(lctx)
		switch {
		case err != nil && ctx.Err() == nil && lctx.Err() != nil:
			return fail(errListenUnreachable)
		case err != nil:
			return fail(err)
		case n.Payload == probe:
			return present()
		}
	}
}

// waitForWakeUps wakes the loop for each notification of a type this relay
// delivers, runs the store.statements handed to the session (the loop's idle poll,
// session.go), and the presence keepalive when no statement ran for
// lease.IdleHeartbeat, until ctx ends or the connection fails. The wait is cut by
// the socket's read deadline, which leaves the connection usable (as the
// election's watch does).
func (r *Relay) waitForWakeUps(ctx context.Context, conn *pgx.Conn, l *loop, pid uint32) error {
	l.own.Hold(conn)
	defer l.own.Release()
	last := time.Now() // the session's last statement
	for {
		_ = conn.PgConn().Conn().SetReadDeadline(last.Add(lease.IdleHeartbeat))
		if l.own.Serve(ctx, conn, pid) { // a job handed over meanwhile (session.go)
			last = time.Now()
			continue
		}
		if !l.own.StartWait() { // one came just now: serve it first
			continue
		}
		n, err := conn.WaitForNotification(ctx)
		l.own.EndWait(conn)
		switch {
		case err != nil && ctx.Err() == nil && pgconn.Timeout(err):
			if l.own.Serve(ctx, conn, pid) {
				last = time.Now()
				continue
			}
			if time.Since(last) < lease.IdleHeartbeat {
				continue
			}
			if err := r.presence.Beat(ctx, conn, pid); err != nil {
				return err
			}
			last = time.Now()
			continue
		case err != nil:
			return err
		}
		if n.Payload == "" || slices.Contains(r.types, n.Payload) {
			l.wakeUp()
		}
	}
}

// WakeTriggerSQL returns the DDL of a trigger that wakes the relays of table
// (optionally schema-qualified) whenever rows are inserted by any producer,
// for producers that do not call [Enqueue] (a JVM service, plain SQL). It is
// idempotent. One statement notifies once per type it inserted; of several
// transactions inserting at once, only the one holding the wake-up token
// carries the NOTIFY, so the producers' commits stay concurrent. Its price is
// one more function call per INSERT statement. Unlike Enqueue it has no
// window of its own: while a long transaction holds the token, the relays
// find the rows of the others at their next poll.
func WakeTriggerSQL(table string) (string, error) { return store.WakeTriggerSQL(table) }

// CreateWakeTrigger installs [WakeTriggerSQL]'s trigger on table.
func CreateWakeTrigger(ctx context.Context, db Beginner, table string) error {
	return store.CreateWakeTrigger(ctx, db, table)
}
