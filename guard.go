package relay

import (
	"context"
	"log/slog"
	"strings"
	"time"

	"github.com/xadm/relay/internal/election"
	"github.com/xadm/relay/internal/lease"
	"github.com/xadm/relay/internal/session"

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
// that the pool keeps its sessions (internal/election), and refuses with an error
// wrapping [ErrTransactionPooling] when it does not. Should that check miss,
// every statement on the lock's session carries the session's backend pid and
// acts only on that backend: one landing on another backend changes nothing,
// fails the election with ErrTransactionPooling and ends the backend that holds
// the lock, which lets it go.
//
// Within one process, a second TryRun for a key that is already held returns
// false at once, so one session never takes the lock twice (session locks stack).
type PostgresGuard struct{ g *election.Guard }

var _ Guard = (*PostgresGuard)(nil)

// NewPostgresGuard returns a guard that takes its locks on connections of pool.
func NewPostgresGuard(pool *pgxpool.Pool) *PostgresGuard {
	return &PostgresGuard{g: election.NewGuard(pool, slog.Default(), &session.SessionCheck{})}
}

// TryRun implements [Guard].
func (g *PostgresGuard) TryRun(ctx context.Context, key string, fn func(ctx context.Context) error) (ran bool, err error) {
	return g.g.TryRun(ctx, key, fn)
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
