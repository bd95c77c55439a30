package relay

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// This file is the election's lease: how long a holder that stopped answering
// can keep the lock (the server's side), and how long this process trusts that
// it still holds it (the holder's side). The two are set so that a holder
// always stops before the server lets another replica in.

// The lease.
const (
	// guardLease is the lock session's idle_session_timeout: the server ends
	// a holder's session, and frees its lock, this long after the holder's
	// last statement. The heartbeat runs every guardHeartbeat, so a live
	// holder never comes near it. Takeover after a silent partition or a
	// freeze: guardLease plus the next replica's Interval.
	guardLease = 10 * time.Second
	// guardLeaseTrusted is how long after a heartbeat was sent (and then
	// answered) the holder still starts new work: the server frees the lock
	// guardLease after the heartbeat *finished* on its side, so the holder
	// stops at least guardLease - guardLeaseTrusted (3 s) before it.
	guardLeaseTrusted = 7 * time.Second

	// idleHeartbeat is the keepalive of a session that holds locks while
	// nothing runs under them: the relay's own session (presence.go), and a
	// partitioned member's between idle passes (partitions.go). It is longer
	// than two Intervals of the default 1 s: an idle member's timer passes
	// look for work on these two sessions in turn, one round trip each, and
	// each of those is the session's keepalive, so that neither needs one of
	// its own.
	idleHeartbeat = 3 * time.Second

	// TCP keepalives and tcp_user_timeout of the lock session on PostgreSQL
	// 13, which has no idle_session_timeout: about guardLease to end a
	// partitioned holder on a direct connection (not a frozen one, nor one
	// behind a proxy, whose kernel answers the probes).
	guardKeepaliveIdle     = 4 * time.Second
	guardKeepaliveInterval = 2 * time.Second
	guardKeepaliveCount    = 3
)

// lease is the holder's view of its election: valid while its last answered
// heartbeat was sent less than guardLeaseTrusted ago, measured on the
// monotonic clock and on the wall clock, whichever has gone further (a VM that
// was paused may resume with a monotonic clock that did not count the pause,
// and a wall clock that NTP then steps forward).
type lease struct {
	mu   sync.Mutex
	mono time.Time // when the last answered heartbeat was sent, with its monotonic reading
	wall time.Time // the same instant, wall clock only
}

func newLease(at time.Time) *lease {
	l := &lease{}
	l.renew(at)
	return l
}

// renew records that a heartbeat sent at t was answered.
func (l *lease) renew(t time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.mono, l.wall = t, t.Round(0)
}

// valid returns nil while the lease is trusted, else why not.
func (l *lease) valid(now time.Time) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	age := max(now.Sub(l.mono), now.Round(0).Sub(l.wall))
	if age < guardLeaseTrusted {
		return nil
	}
	return fmt.Errorf("%w: no heartbeat of the lock's session answered for %s; the server frees the lock %s after the last one",
		ErrElectionLost, age.Round(time.Millisecond), guardLease)
}

type leaseKey struct{}

// leaseValid returns nil unless ctx is an elected job's whose lease is no
// longer trusted: the job must then start no new work. A job run by a Guard
// without a lease, or by no guard, is always valid.
func leaseValid(ctx context.Context) error {
	if l, ok := ctx.Value(leaseKey{}).(*lease); ok {
		return l.valid(time.Now())
	}
	return nil
}

// watch owns the lock's connection while the job runs. It blocks reading it, so
// the server's FATAL message when the session is terminated (or the socket's
// end) arrives at once, and every guardHeartbeat (idleHeartbeat between an
// idle member's passes) it checks the session answers as the same backend,
// which renews the lease on both sides.
type watch struct {
	conn  *pgconn.PgConn
	pid   uint32
	every time.Duration // the heartbeat's period: guardHeartbeat, or idleHeartbeat
	lease *lease
	beat  string      // the heartbeat, marked with the election's start
	lost  func(error) // called once, with why, when the session is lost
	err   error       // why the session was lost; read after done
	done  chan struct{}

	mu      sync.Mutex
	stopped bool
	reading bool // blocked in WaitForNotification, so stop may interrupt it
}

// startWatch watches conn, the session of backend pid that holds the
// election since won, with a lease from answered, when the session last
// answered a statement sent then, and a heartbeat every every. Its heartbeat
// names replica (markReplica).
func startWatch(conn *pgconn.PgConn, pid uint32, won, answered time.Time, every time.Duration, replica string, lost func(error)) *watch {
	w := &watch{conn: conn, pid: pid, every: every, lease: newLease(answered), lost: lost, done: make(chan struct{}),
		beat: markReplica(heartbeatSQL(won), replica)}
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
		_ = w.conn.Conn().SetReadDeadline(time.Now().Add(w.every))
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
			w.fail(fmt.Errorf("%w: %w", ErrElectionLost, err))
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
	sent := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), guardHeartbeatTimeout)
	defer cancel()
	rr := w.conn.ExecParams(ctx, w.beat, nil, nil, nil, nil).Read()
	if rr.Err != nil {
		return fmt.Errorf("%w: heartbeat: %w", ErrElectionLost, rr.Err)
	}
	if len(rr.Rows) != 1 || len(rr.Rows[0]) != 1 {
		return fmt.Errorf("%w: heartbeat: unexpected answer", ErrElectionLost)
	}
	if got := string(rr.Rows[0][0]); got != fmt.Sprint(w.pid) {
		pid, _ := strconv.ParseUint(got, 10, 32)
		return fmt.Errorf("heartbeat: the session answers as another backend: %w", sessionMoved("the heartbeat", w.pid, uint32(pid)))
	}
	w.lease.renew(sent)
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
