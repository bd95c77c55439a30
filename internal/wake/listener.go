package wake

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/xadm/relay/internal/lease"
	"github.com/xadm/relay/internal/session"
	"github.com/xadm/relay/internal/store"
)

// Listener is what a started relay's listener takes of the relay.
type Listener struct {
	Pool     *pgxpool.Pool
	Logger   *slog.Logger
	Channel  string   // the table's NOTIFY channel (store.WakeChannel)
	Types    []string // the types the relay delivers: a notification of another wakes nothing
	Wake     bool     // Config.WakeOnCommit: LISTEN; false: the session only carries presence
	Interval time.Duration
	Presence *session.Presence
	Sessions *session.SessionCheck // nil: no election checks the pool
	Own      *session.OwnSession   // the statements handed to the session between its waits
	WakeUp   func()                // wakes the loop
}

// Run is the started relay's listener: a connection of its own on which it
// LISTENs for its table's channel, waking the loop for each notification of
// a type it delivers. It first checks that its own test notification comes
// back: through a transaction-pooling proxy it does not, and the relay then
// says so once and polls. A lost connection is replaced, with a backoff; the
// loop is woken after each reconnection, for what was missed meanwhile.
//
// The same session carries the relay's presence (internal/session): its locks are
// taken once the session is known to be one (the probe came back), and again
// after each reconnection. With WakeOnCommit off, the session LISTENs for
// nothing and only carries presence.
func (r *Listener) Run(ctx context.Context, attempted func()) {
	var once sync.Once
	defer once.Do(attempted)
	wake := r.Wake
	if !wake {
		once.Do(attempted) // no LISTEN to wait for
	}
	channel := r.Channel
	wait, reconnect := time.Second, false
	for ctx.Err() == nil {
		conn, pid, err := r.openListener(ctx, channel, wake)
		once.Do(attempted)
		switch {
		case errors.Is(err, session.ErrPresenceMoved):
			r.Logger.LogAttrs(ctx, slog.LevelError, "relay: presence is off: "+err.Error()+"; relayctl who and the console will not list this replica",
				slog.String("replica", r.Presence.ID()))
			return
		case errors.Is(err, errListenUnreachable) && r.dropsSessions(ctx):
			r.Logger.LogAttrs(ctx, slog.LevelWarn, "relay: wake-ups on commit are off: a notification to this session never came back "+
				"(the pool does not keep its sessions: a transaction-pooling proxy); passes run every Interval",
				slog.String("channel", channel), slog.String("interval", r.Interval.String()))
			return
		case err != nil:
			if ctx.Err() != nil {
				return
			}
			r.Logger.LogAttrs(ctx, slog.LevelWarn, "relay: cannot listen for wake-ups; passes run every Interval until it can",
				slog.String("channel", channel), slog.String("retry_in", wait.String()), slog.String("error", err.Error()))
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
			wait = min(2*wait, retryMax)
			continue
		}
		if wait > time.Second || reconnect {
			r.WakeUp() // what was committed while nobody listened
		}
		wait, reconnect = time.Second, true
		err = r.waitForWakeUps(ctx, conn, pid)
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
		if errors.Is(err, session.ErrPresenceMoved) {
			r.Logger.LogAttrs(ctx, slog.LevelError, "relay: presence is off: "+err.Error()+"; relayctl who and the console will not list this replica",
				slog.String("replica", r.Presence.ID()))
			return
		}
		r.Logger.LogAttrs(ctx, slog.LevelWarn, "relay: the wake-up listener's connection was lost; connecting again",
			slog.String("channel", channel), slog.String("error", err.Error()))
	}
}

// leavePresence lets go of the presence on conn, backend pid, before it
// is closed (why: what ended its session), and logs when it may outlive it
// a moment (presence.leave).
func (r *Listener) leavePresence(conn *pgx.Conn, pid uint32, why error) {
	if err := r.Presence.Leave(conn, r.Pool, pid, why); err != nil {
		r.Logger.LogAttrs(context.Background(), slog.LevelWarn, "relay: an earlier session's presence may outlive it a moment", slog.String("error", err.Error()))
	}
}

// errListenUnreachable says the listener's own notification did not come
// back in time. Through a transaction-pooling proxy it never does; on a pool
// that keeps its sessions it was late (a loaded server), and the listener
// connects again, as after any other failure, rather than leave the replica
// without wake-ups and presence for its life.
var errListenUnreachable = fmt.Errorf("relay: the listener's own test notification did not come back within %s", probeTimeout)

// dropsSessions reports whether the relay's pool was found not to keep its
// sessions (a transaction-pooling proxy), by the election's check when it has
// one, else by the same probe; false when it keeps them or the probe could
// not tell.
func (r *Listener) dropsSessions(ctx context.Context) bool {
	if r.Sessions != nil {
		return errors.Is(r.Sessions.Verify(ctx, r.Pool, r.Logger), store.ErrTransactionPooling)
	}
	cctx, cancel := context.WithTimeout(ctx, session.SessionCheckTimeout)
	defer cancel()
	_, err := session.ProbeSessions(cctx, r.Pool)
	return errors.Is(err, store.ErrTransactionPooling)
}

// openListener takes a connection out of the pool, LISTENs on it and checks
// that a notification comes back (only when wake), and takes the relay's
// presence on it. It returns the connection and its backend's pid.
func (r *Listener) openListener(ctx context.Context, channel string, wake bool) (*pgx.Conn, uint32, error) {
	pc, err := store.Acquire(ctx, r.Pool, "listen for wake-ups")
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
		pctx, cancel := context.WithTimeout(ctx, session.LockTimeout)
		defer cancel()
		pid, err := r.Presence.Take(pctx, conn)
		if err != nil {
			// The locks may be held: a stop meanwhile cut short the claim of
			// the relay's types that follows their taking. Gone before Stop
			// returns, as below.
			r.leavePresence(conn, conn.PgConn().PID(), err)
			return fail(err)
		}
		// Through a transaction-pooling proxy the next statement may answer
		// from another backend: then the locks are not this session's.
		if err := r.Presence.Beat(pctx, conn, pid); err != nil {
			r.leavePresence(conn, pid, err) // a stop meanwhile: gone before Stop returns
			return fail(err)
		}
		return conn, pid, nil
	}
	if !wake {
		return present()
	}
	lctx, cancel := context.WithTimeout(ctx, probeTimeout)
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
	if err := store.WakeProbe(lctx, r.Pool, channel, probe); err != nil {
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
// delivers, runs the statements handed to the session (the loop's idle poll,
// session.go), and the presence keepalive when no statement ran for
// lease.IdleHeartbeat, until ctx ends or the connection fails. The wait is cut by
// the socket's read deadline, which leaves the connection usable (as the
// election's watch does).
func (r *Listener) waitForWakeUps(ctx context.Context, conn *pgx.Conn, pid uint32) error {
	r.Own.Hold(conn)
	defer r.Own.Release()
	last := time.Now() // the session's last statement
	for {
		// A type yielded to another app is claimed again every few seconds,
		// so that this relay takes it over once that app's relays stop.
		if ran, err := r.Presence.Reclaim(ctx, conn, pid); err != nil {
			return err
		} else if ran {
			last = time.Now()
		}
		_ = conn.PgConn().Conn().SetReadDeadline(last.Add(lease.IdleHeartbeat))
		if r.Own.Serve(ctx, conn, pid) { // a job handed over meanwhile (internal/election)
			last = time.Now()
			continue
		}
		if !r.Own.StartWait() { // one came just now: serve it first
			continue
		}
		n, err := conn.WaitForNotification(ctx)
		r.Own.EndWait(conn)
		switch {
		case err != nil && ctx.Err() == nil && pgconn.Timeout(err):
			if r.Own.Serve(ctx, conn, pid) {
				last = time.Now()
				continue
			}
			if time.Since(last) < lease.IdleHeartbeat {
				continue
			}
			if err := r.Presence.Beat(ctx, conn, pid); err != nil {
				return err
			}
			last = time.Now()
			continue
		case err != nil:
			return err
		}
		if n.Payload == "" || slices.Contains(r.Types, n.Payload) {
			r.WakeUp()
		}
	}
}
