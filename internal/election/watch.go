package election

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/xadm/relay/internal/lease"
	"github.com/xadm/relay/internal/store"
)

// This file is the watch over a lock's session, which renews the election's
// lease (internal/lease: the trust window and its timings).

// watch owns the lock's connection while the job runs. It blocks reading it, so
// the server's FATAL message when the session is terminated (or the socket's
// end) arrives at once, and every lease.Heartbeat (lease.IdleHeartbeat between an
// idle member's passes) it checks the session answers as the same backend,
// which renews the lease on both sides.
type watch struct {
	conn  *pgconn.PgConn
	pid   uint32
	every time.Duration // the heartbeat's period: lease.Heartbeat, or lease.IdleHeartbeat
	lease *lease.Lease
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
	w := &watch{conn: conn, pid: pid, every: every, lease: lease.New(answered), lost: lost, done: make(chan struct{}),
		beat: store.MarkReplica(store.HeartbeatSQL(won), replica)}
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
			w.fail(fmt.Errorf("%w: %w", lease.ErrLost, err))
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
	ctx, cancel := context.WithTimeout(context.Background(), lease.HeartbeatTimeout)
	defer cancel()
	rr := w.conn.ExecParams(ctx, w.beat, nil, nil, nil, nil).Read()
	if rr.Err != nil {
		return fmt.Errorf("%w: heartbeat: %w", lease.ErrLost, rr.Err)
	}
	if len(rr.Rows) != 1 || len(rr.Rows[0]) != 1 {
		return fmt.Errorf("%w: heartbeat: unexpected answer", lease.ErrLost)
	}
	if got := string(rr.Rows[0][0]); got != fmt.Sprint(w.pid) {
		pid, _ := strconv.ParseUint(got, 10, 32)
		return fmt.Errorf("heartbeat: the session answers as another backend: %w", store.SessionMoved("the heartbeat", w.pid, uint32(pid)))
	}
	w.lease.Renew(sent)
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
