package session

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// This file is the relay's own session: the one connection a started relay
// holds for its life, out of the pool (the wake-up listener's, wake.go; with
// WakeOnCommit off, one that carries only presence). Between its waits for
// notifications it runs the statements other goroutines hand it — the loop's
// idle poll — so that an idle replica costs one round trip per Interval on a
// session pgxpool never pings, and that round trip is the session's keepalive
// too (no presence beat while polls come at least every presenceBeat).

// OwnSession hands statements to the goroutine that holds the relay's own
// session.
type OwnSession struct {
	jobs chan sessionJob // at most one waiting

	mu      sync.Mutex
	conn    *pgx.Conn // nil while no session is held
	waiting bool      // the holder waits for notifications: a job cuts the wait short
}

// sessionJob is a statement to run on the session, and where its answer goes.
type sessionJob struct {
	run  func(ctx context.Context, conn *pgx.Conn, pid uint32) error
	done chan error
}

// ErrNoSession says the relay holds no session of its own right now (it is
// connecting again, or has none): the caller uses the pool instead.
var ErrNoSession = errors.New("relay: no session of its own")

func NewOwnSession() *OwnSession { return &OwnSession{jobs: make(chan sessionJob, 1)} }

// Do runs fn on the session, between the holder's waits, and returns its
// error; ErrNoSession when there is no session to run it on.
func (s *OwnSession) Do(ctx context.Context, fn func(ctx context.Context, conn *pgx.Conn, pid uint32) error) error {
	if s == nil {
		return ErrNoSession
	}
	job := sessionJob{run: fn, done: make(chan error, 1)}
	s.mu.Lock()
	conn := s.conn
	if conn == nil {
		s.mu.Unlock()
		return ErrNoSession
	}
	select {
	case s.jobs <- job:
	default:
		s.mu.Unlock()
		return ErrNoSession // another is waiting: never queue behind it
	}
	// Cut the holder's wait short: its read deadline passes now, which leaves
	// the connection usable, and it then takes the job. Only while it waits
	// (under mu, which startWait and endWait take too): a deadline that
	// passed in a statement (a job taken meanwhile, the presence keepalive,
	// presence's release) would cut that statement short and close the
	// session.
	if s.waiting {
		_ = conn.PgConn().Conn().SetReadDeadline(time.Now())
	}
	s.mu.Unlock()
	select {
	case err := <-job.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Hold says the holder's goroutine now serves jobs on conn; release says it
// no longer does, and answers a job left waiting with ErrNoSession.
func (s *OwnSession) Hold(conn *pgx.Conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.conn = conn
}

func (s *OwnSession) Release() {
	s.mu.Lock()
	s.conn = nil
	s.mu.Unlock()
	for {
		select {
		case job := <-s.jobs:
			job.done <- ErrNoSession
		default:
			return
		}
	}
}

// StartWait says the holder is about to wait for notifications on the
// session; false when a job came meanwhile, to be served first.
func (s *OwnSession) StartWait() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.jobs) > 0 {
		return false
	}
	s.waiting = true
	return true
}

// EndWait says the holder's wait has ended, and clears the read deadline a
// job may have set to end it.
func (s *OwnSession) EndWait(conn *pgx.Conn) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.waiting = false
	_ = conn.PgConn().Conn().SetReadDeadline(time.Time{})
}

// Serve runs the job waiting, if any, and reports whether it did.
func (s *OwnSession) Serve(ctx context.Context, conn *pgx.Conn, pid uint32) bool {
	select {
	case job := <-s.jobs:
		_ = conn.PgConn().Conn().SetReadDeadline(time.Time{})
		job.done <- job.run(ctx, conn, pid)
		return true
	default:
		return false
	}
}
