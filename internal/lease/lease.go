// Package lease is the election's lease: how long a holder that stopped
// answering can keep its lock (the server's side), and how long the holder
// trusts that it still holds it (its own side). The two are set so that a
// holder always stops before the server lets another replica in.
//
// # Trust window
//
// The lock's session runs with idle_session_timeout = [Server]: the server
// ends a holder's session, and frees its lock, that long after the holder's
// last statement. The holder renews its lease each time a heartbeat is
// answered, and trusts it for [Trusted] after the heartbeat was sent, on the
// monotonic and on the wall clock, whichever went further: a process frozen
// (SIGSTOP, a paused VM) or cut off without a FIN stops starting new work at
// least Server - Trusted (3 s) before another replica can be elected, and one
// that wakes from a freeze sends nothing more.
//
// # Failure handling
//
// A job runs under the lease its election put in its context ([With]); the
// pass asks [Valid] before each message. A job run by no election, or by an
// adopter's Guard, has no lease and is always valid.
package lease

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// The lease's timings.
const (
	// Server is the lock session's idle_session_timeout: the server ends a
	// holder's session, and frees its lock, this long after the holder's
	// last statement. The heartbeat runs every Heartbeat, so a live holder
	// never comes near it.
	Server = 10 * time.Second
	// Trusted is how long after a heartbeat was sent (and then answered) the
	// holder still starts new work: the server frees the lock Server after
	// the heartbeat finished on its side, so the holder stops at least
	// Server - Trusted before it.
	Trusted = 7 * time.Second
	// Heartbeat is how often the holder of a lock under which work runs
	// checks its session, which renews the lease on both sides.
	Heartbeat = 2 * time.Second
	// HeartbeatTimeout bounds one heartbeat.
	HeartbeatTimeout = 5 * time.Second
	// IdleHeartbeat is the keepalive of a session that holds locks while
	// nothing runs under them (the relay's own session, a partitioned
	// member's between idle passes). It is longer than two Intervals of the
	// default 1 s: an idle member's timer passes look for work on its two
	// sessions in turn, one round trip each, and each of those is the
	// session's keepalive.
	IdleHeartbeat = 3 * time.Second

	// TCP keepalives and tcp_user_timeout of a lock's session on PostgreSQL
	// 13, which has no idle_session_timeout: about Server to end a
	// partitioned holder on a direct connection (not a frozen one, nor one
	// behind a proxy, whose kernel answers the probes).
	KeepaliveIdle     = 4 * time.Second
	KeepaliveInterval = 2 * time.Second
	KeepaliveCount    = 3
)

// ErrLost says the election is lost: its lock is no longer held by this
// process's session, or no longer trusted to be (relay.ErrElectionLost).
var ErrLost = errors.New("relay: election lost: the advisory lock is no longer held by this session")

// Lease is a holder's view of its election: valid while its last answered
// heartbeat was sent less than Trusted ago, measured on the monotonic clock
// and on the wall clock, whichever has gone further (a VM that was paused may
// resume with a monotonic clock that did not count the pause, and a wall
// clock that NTP then steps forward).
type Lease struct {
	mu   sync.Mutex
	mono time.Time // when the last answered heartbeat was sent, with its monotonic reading
	wall time.Time // the same instant, wall clock only
}

// New returns a lease renewed at at.
func New(at time.Time) *Lease {
	l := &Lease{}
	l.Renew(at)
	return l
}

// Renew records that a heartbeat sent at t was answered.
func (l *Lease) Renew(t time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.mono, l.wall = t, t.Round(0)
}

// Valid returns nil while the lease is trusted at now, else why not (wrapping
// [ErrLost]).
func (l *Lease) Valid(now time.Time) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	age := max(now.Sub(l.mono), now.Round(0).Sub(l.wall))
	if age < Trusted {
		return nil
	}
	return fmt.Errorf("%w: no heartbeat of the lock's session answered for %s; the server frees the lock %s after the last one",
		ErrLost, age.Round(time.Millisecond), Server)
}

// stepWall moves the lease's wall reading by d, as a clock stepped by -d
// since the heartbeat would (tests).
func (l *Lease) stepWall(d time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.wall = l.wall.Add(d)
}

type key struct{}

// With returns ctx carrying l, for the job an election runs.
func With(ctx context.Context, l *Lease) context.Context { return context.WithValue(ctx, key{}, l) }

// Valid returns nil unless ctx is an elected job's whose lease is no longer
// trusted: the job must then start no new work. A job run by a Guard without
// a lease, or by no guard, is always valid.
func Valid(ctx context.Context) error {
	if l, ok := ctx.Value(key{}).(*Lease); ok {
		return l.Valid(time.Now())
	}
	return nil
}
