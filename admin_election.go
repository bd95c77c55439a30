package relay

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/xadm/relay/internal/session"
)

// HolderKind tells what holds an election, as [LockHolder] reports it.
type HolderKind string

// The kinds of [LockHolder].
const (
	// HolderRelay is a Go relay of this library: every statement its guard
	// runs on the lock's session is marked, and the heartbeat's mark says
	// since when it holds the election; its idle poll, which holds the
	// election for its statement's length, carries the relay's presence mark.
	HolderRelay HolderKind = "relay"
	// HolderPause is an operator's pause (relayctl pause): a session that holds
	// the election so that no relay delivers.
	HolderPause HolderKind = "pause"
	// HolderOther is any other session: a JVM relay of the same app, or SQL
	// (psql, another tool) that took the key.
	HolderOther HolderKind = "other"
)

// The lock modes of [LockHolder].
const (
	LockExclusive = "exclusive" // pg_advisory_lock: one holder at a time
	LockShared    = "shared"    // pg_advisory_lock_shared: any number of holders, no exclusive one
)

// LockHolder is a session that holds, or waits for, an election's advisory lock.
type LockHolder struct {
	Key     string // the election key, as hashtext hashes it: "<AppName>_relay_m2m"
	Mode    string // [LockExclusive] or [LockShared]
	Granted bool   // true: it holds the lock; false: it waits for it (relays never wait; SQL may)

	Kind HolderKind
	// Since is when it won the election, when the session says so: a Go
	// relay's mark (to the second) or a pause's session start. Zero otherwise.
	Since time.Time
	// Replica names a Go relay's replica: its session's application_name, as
	// its pool set it; "" if it has none.
	Replica string
	// ReplicaID is the id of the live replica ([Admin.Replicas]) whose pass
	// or membership this session runs, when its statements name it; "" otherwise.
	ReplicaID string
	// Partitions are the partitions a partitioned replica holds (Mode
	// shared), of PartitionsOf, its Config.Partitions; nil and 0 otherwise.
	Partitions   []int
	PartitionsOf int

	PID             int
	User            string
	ApplicationName string    // as pg_stat_activity shows it, mark included
	ClientAddr      string    // the client's address; "" over a Unix socket or when Hidden
	BackendStart    time.Time // when the session connected; zero when Hidden
	State           string    // "active", "idle", "idle in transaction", …; "" when Hidden
	StateChange     time.Time // when State last changed; zero when Hidden
	// Hidden says the role Admin connects as may not read this session's
	// details (another role's session): grant it pg_read_all_stats.
	Hidden bool

	At time.Time // the database's clock when it was read

	query      string    // the session's last statement, to recognise a Go relay's
	queryStart time.Time // when that statement started
}

// HeldFor is how long the holder has held the election, when it says since
// when ([LockHolder.Since]); 0 otherwise.
func (h LockHolder) HeldFor() time.Duration {
	if h.Since.IsZero() {
		return 0
	}
	return max(h.At.Sub(h.Since), 0)
}

// Election returns the sessions that hold, or wait for, the app's election
// right now: none between passes, one while a relay (Go or JVM) delivers or an
// operator pauses delivery, and every member of a partitioned election, with
// its partitions, for as long as it runs. It reads pg_locks and pg_stat_activity of the
// current database; the details of another role's sessions need the
// pg_read_all_stats role.
//
// It returns a list, holders first, because an election may come to have
// several holders: shared holds of the app's key and exclusive holds of
// other keys report the same way, each with its Key and Mode.
func (a *Admin) Election(ctx context.Context) ([]LockHolder, error) {
	holders, err := a.repo.lockHolders(ctx, a.pool, []string{a.key})
	if err != nil {
		return nil, fmt.Errorf("relay: read who holds the election %q: %w", a.key, err)
	}
	for i := range holders {
		classify(&holders[i], a.app)
	}
	return holders, nil
}

// pauseMarkPrefix starts the application_name of relayctl pause's session:
// "relayctl pause <app>".
const pauseMarkPrefix = "relayctl pause "

// applicationNameMax is PostgreSQL's limit (NAMEDATALEN - 1): longer names are cut.
const applicationNameMax = 63

// classify sets h's Kind, Since and Replica from its last statement and its
// application_name: a Go relay's guard marks every statement it runs on the
// lock's session (sql/election.sql, electionMark), and its heartbeat also says since
// when it holds the election; its idle poll carries its presence mark.
func classify(h *LockHolder, app string) {
	if since, id, ok := parseElectionMark(h.query, h.queryStart); ok {
		h.Kind, h.Since, h.Replica, h.ReplicaID = HolderRelay, since, h.ApplicationName, id
		return
	}
	if id, ok := session.MarkedReplica(h.query); ok {
		// The idle poll: it wins the election for its own statement's length,
		// on the relay's own session, whose statements carry the presence
		// mark (sql/pass.sql, poll).
		h.Kind, h.Since, h.Replica, h.ReplicaID = HolderRelay, h.queryStart, h.ApplicationName, id
		return
	}
	// The pause's name is cut at 63 bytes for a long app name.
	full := pauseMarkPrefix + app
	name := h.ApplicationName
	if name == full || len(name) == applicationNameMax && strings.HasPrefix(full, name) {
		h.Kind, h.Since = HolderPause, h.BackendStart
		return
	}
	h.Kind = HolderOther
}
