package store

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/xadm/relay/internal/lease"
)

// The elections' statements, in sql/election.sql: the guard's lock of one
// key, the lease's heartbeat and the partitioned election
// (internal/election).

// The lock of one key, exclusive (the election of one) or shared (the
// partitioned election's hold of the app's key), and their unlocks.
var (
	LockSQL         = Statements.Positional("lock", Data{Lock: "pg_try_advisory_lock"})
	LockSharedSQL   = Statements.Positional("lock", Data{Lock: "pg_try_advisory_lock_shared"})
	UnlockSQL       = Statements.Positional("unlock", Data{Unlock: "pg_advisory_unlock"})
	UnlockSharedSQL = Statements.Positional("unlock", Data{Unlock: "pg_advisory_unlock_shared"})
	letGoSQL        = Statements.Positional("letGo", Data{})
)

// HeartbeatSQL is the heartbeat of an election won at since, built once per
// election.
func HeartbeatSQL(since time.Time) string {
	return Statements.Text("heartbeat", Data{Since: since.UTC().Format(time.RFC3339)})
}

// LockStatement tries the lock of key with stmt (LockSQL, or LockSharedSQL)
// on db, the session that is to hold it, backend pid, with the lease's
// settings. sess.pid is the backend that answered: on any other than pid it
// tried nothing.
func LockStatement(ctx context.Context, db querier, stmt, key string, pid uint32) (locked *bool, sess LockSession, err error) {
	var ignored [2]*string
	err = db.QueryRow(ctx, stmt, key,
		strconv.Itoa(int(lease.Server/time.Millisecond)),
		strconv.Itoa(int(lease.KeepaliveIdle/time.Second)), strconv.Itoa(int(lease.KeepaliveInterval/time.Second)),
		strconv.Itoa(lease.KeepaliveCount), strconv.Itoa(int(lease.Server/time.Millisecond)), pid,
	).Scan(&locked, &sess.PID, &sess.ReadOnly, &sess.Idle, &ignored[0], &ignored[1])
	return locked, sess, err
}

// UnlockStatement releases the lock of key with stmt (UnlockSQL, or
// UnlockSharedSQL) on backend pid and restores the session's
// idle_session_timeout idle; answered is the backend that answered (on
// another than pid it released nothing, and ended pid if it held a lock of
// the election: letGo). unlocked is nil when it released nothing.
func UnlockStatement(ctx context.Context, db querier, stmt, key string, idle *string, pid uint32) (unlocked *bool, answered uint32, letGo bool, err error) {
	var ignored *string
	var ended *bool
	err = db.QueryRow(ctx, stmt, key, idle, pid).Scan(&unlocked, &answered, &ignored, &ended)
	return unlocked, answered, ended != nil && *ended, err
}

// LetGoStatement runs letGoSQL on db for the election key's session, backend pid.
func LetGoStatement(ctx context.Context, db execer, key string, pid uint32) error {
	_, err := db.Exec(ctx, letGoSQL, key, pid)
	return err
}

var SessionLocksHeldSQL = Statements.Positional("sessionLocksHeld", Data{})

// SessionLocksHeld reports whether backend pid still holds advisory locks.
func SessionLocksHeld(ctx context.Context, db querier, pid uint32) (held bool, err error) {
	err = db.QueryRow(ctx, SessionLocksHeldSQL, int64(pid)).Scan(&held)
	return held, err
}

// The partitioned election's statements.
var (
	markSQL              = Statements.Positional("partitionMark", Data{})
	partitionConfigSQL   = Statements.Positional("partitionConfig", Data{})
	partitionLookSQL     = Statements.Positional("partitionLook", Data{})
	rebalanceSQL         = Statements.Named("rebalance", Data{})
	releasePartitionsSQL = Statements.Named("releasePartitions", Data{})
)

// PartitionState is what a member learned at rebalanceSQL.
type PartitionState struct {
	Members  int  // members running with this N: this one among them
	ForeignN int  // 0, or the count of partitions held with another N
	Waiter   bool // an exclusive request waits for the app's key
	Fewest   int  // the fewest partitions a member holds
	Others   int  // how many partitions of this N the other members hold
	Held     []int
	Excluded bool // (join) an exclusive holder keeps this replica out
}

// PartitionLook is the election's state as an idle member sees it between
// two rebalances (partitionLookSQL): while it is what the last rebalance
// left, another would change nothing.
type PartitionLook struct {
	Members int  // members running with this N
	Held    int  // partitions of this N held, by any member
	Waiter  bool // an exclusive request waits for the app's key
}

// WorkCheck is a statement sent in the rebalance's round trip, after it: is
// there anything to deliver in the partitions the member held before?
// (Table.partitionWork)
type WorkCheck struct {
	sql  string
	args []any
	Ran  bool // it answered, and work is its answer
	Work bool
}

// RebalanceStatement takes the configuration lock and runs rebalanceSQL, in
// one round trip and one transaction, followed by check when it is set. A
// check that fails (the table gone) leaves check.Ran false and the
// rebalance as it was: the session-level locks it took do not follow the
// transaction's rollback, and the pass's select meets the failure.
func RebalanceStatement(ctx context.Context, db querier, key string, n, start int, pid uint32, check *WorkCheck) (PartitionState, error) {
	var st PartitionState
	var foreign *int32
	var held []int32
	var ran uint32
	rebalanced := false
	b := &pgx.Batch{}
	b.Queue(MarkReplica(partitionConfigSQL, ReplicaOf(ctx)), key)
	b.Queue(MarkReplica(rebalanceSQL.sql, ReplicaOf(ctx)), rebalanceSQL.Args(map[string]any{"key": key, "n": n, "start": start, "pid": pid})...).
		QueryRow(func(row pgx.Row) error {
			err := row.Scan(&ran, &st.Members, &foreign, &st.Waiter, &st.Fewest, &st.Others, &held)
			rebalanced = err == nil
			return err
		})
	if check != nil {
		b.Queue(MarkReplica(check.sql, ReplicaOf(ctx)), check.args...).QueryRow(func(row pgx.Row) error {
			err := row.Scan(&check.Work)
			check.Ran = err == nil
			return err
		})
	}
	if err := db.SendBatch(ctx, b).Close(); err != nil {
		var pgErr *pgconn.PgError
		if !rebalanced || check == nil || check.Ran || !errors.As(err, &pgErr) {
			return PartitionState{}, err
		}
	}
	if ran != pid {
		return PartitionState{}, SessionMoved("the rebalance", pid, ran)
	}
	if foreign != nil {
		st.ForeignN = int(*foreign)
	}
	for _, p := range held {
		st.Held = append(st.Held, int(p))
	}
	slices.Sort(st.Held)
	return st, nil
}

// IdleLookStatement is an idle member's look between two of its rebalances,
// on the relay's own session (membership.idleCheck): check, then the
// election's state (partitionLookSQL), then the presence keepalive, in one
// round trip. All three carry mark, the presence comment Admin reads from the
// session's statement. It sets check's answer, and returns the state and the
// backend that answered.
func IdleLookStatement(ctx context.Context, db querier, mark string, check *WorkCheck, key string, n int) (look PartitionLook, pid uint32, err error) {
	b := &pgx.Batch{}
	b.Queue(mark+check.sql, check.args...).QueryRow(func(row pgx.Row) error {
		err := row.Scan(&check.Work)
		check.Ran = err == nil
		return err
	})
	b.Queue(mark+partitionLookSQL, key, n).QueryRow(func(row pgx.Row) error {
		return row.Scan(&look.Members, &look.Held, &look.Waiter)
	})
	b.Queue(mark + presenceBeatSQL).QueryRow(func(row pgx.Row) error { return row.Scan(&pid) })
	return look, pid, db.SendBatch(ctx, b).Close()
}

// MemberLookStatement is a woken member's look at its partitions between two
// of its rebalances, on the membership's session (membership.look): beat,
// the heartbeat of its election, then check, in one round trip, without the
// configuration lock. It returns the backend that answered the heartbeat. A
// check that fails (the table gone) leaves check.Ran false and err nil once
// the heartbeat answered: the pass's select meets the failure.
func MemberLookStatement(ctx context.Context, db querier, beat string, check *WorkCheck) (pid uint32, err error) {
	b := &pgx.Batch{}
	beaten := false
	b.Queue(beat).QueryRow(func(row pgx.Row) error {
		err := row.Scan(&pid)
		beaten = err == nil
		return err
	})
	b.Queue(MarkReplica(check.sql, ReplicaOf(ctx)), check.args...).QueryRow(func(row pgx.Row) error {
		err := row.Scan(&check.Work)
		check.Ran = err == nil
		return err
	})
	if err := db.SendBatch(ctx, b).Close(); err != nil {
		var pgErr *pgconn.PgError
		if !beaten || check.Ran || !errors.As(err, &pgErr) {
			return 0, err
		}
	}
	return pid, nil
}

// ReleasePartitionsStatement releases the partitions release of n, and the
// member mark when leave, on backend pid.
func ReleasePartitionsStatement(ctx context.Context, db querier, key string, n int, release []int, leave bool, pid uint32) (bool, error) {
	var ok *bool
	var ran uint32
	err := db.QueryRow(ctx, releasePartitionsSQL.sql,
		releasePartitionsSQL.Args(map[string]any{"key": key, "n": n, "release": release, "leave": leave, "pid": pid})...).Scan(&ok, &ran)
	switch {
	case err != nil:
		return false, err
	case ran != pid:
		return false, SessionMoved("the release of partitions", pid, ran)
	}
	return ok != nil && *ok, nil
}

// MarkStatement takes the member mark of n on backend pid.
func MarkStatement(ctx context.Context, db querier, key string, n int, pid uint32) (bool, error) {
	var ok *bool
	var ran uint32
	err := db.QueryRow(ctx, MarkReplica(markSQL, ReplicaOf(ctx)), key, n, pid).Scan(&ok, &ran)
	switch {
	case err != nil:
		return false, err
	case ran != pid:
		return false, SessionMoved("the member mark", pid, ran)
	}
	return ok != nil && *ok, nil
}

// LockSession is the session a lock statement ran on: its backend, whether
// the server is read-only, and its idle_session_timeout before the lease (nil
// before PostgreSQL 14).
type LockSession struct {
	PID      uint32
	ReadOnly bool
	Idle     *string
}

// MarkReplica adds a relay's replica id (internal/session's presence) to the election mark
// of stmt: "/* relay election replica=1a2b3c4d */ …", so that Admin links an
// election's session to the live replica whose pass it runs. statements
// without the mark, and an empty id, are returned as they are.
func MarkReplica(stmt, replica string) string {
	if replica == "" || !strings.HasPrefix(stmt, "/* relay election") {
		return stmt
	}
	i := strings.Index(stmt, " */")
	if i < 0 {
		return stmt
	}
	return stmt[:i] + " replica=" + replica + stmt[i:]
}

type replicaKey struct{}

// WithReplica marks ctx with the replica id whose election statements the
// guard marks (MarkReplica).
func WithReplica(ctx context.Context, replica string) context.Context {
	return context.WithValue(ctx, replicaKey{}, replica)
}

// ReplicaOf is the replica id WithReplica put in ctx, "" if none.
func ReplicaOf(ctx context.Context) string {
	id, _ := ctx.Value(replicaKey{}).(string)
	return id
}
