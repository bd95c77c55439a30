package relay

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// The elections' statements, in sql/election.sql: the guard's lock of one
// key (guard.go), the lease's heartbeat (lease.go) and the partitioned
// election (partitions.go).

// The lock of one key, exclusive (the election of one) or shared (the
// partitioned election's hold of the app's key), and their unlocks.
var (
	lockSQL         = statements.positional("lock", sqlData{Lock: "pg_try_advisory_lock"})
	lockSharedSQL   = statements.positional("lock", sqlData{Lock: "pg_try_advisory_lock_shared"})
	unlockSQL       = statements.positional("unlock", sqlData{Unlock: "pg_advisory_unlock"})
	unlockSharedSQL = statements.positional("unlock", sqlData{Unlock: "pg_advisory_unlock_shared"})
	letGoSQL        = statements.positional("letGo", sqlData{})
)

// heartbeatSQL is the heartbeat of an election won at since, built once per
// election.
func heartbeatSQL(since time.Time) string {
	return statements.text("heartbeat", sqlData{Since: since.UTC().Format(time.RFC3339)})
}

// lockStatement tries the lock of key with stmt (lockSQL, or lockSharedSQL)
// on db, the session that is to hold it, backend pid, with the lease's
// settings. sess.pid is the backend that answered: on any other than pid it
// tried nothing.
func lockStatement(ctx context.Context, db querier, stmt, key string, pid uint32) (locked *bool, sess session, err error) {
	var ignored [2]*string
	err = db.QueryRow(ctx, stmt, key,
		strconv.Itoa(int(guardLease/time.Millisecond)),
		strconv.Itoa(int(guardKeepaliveIdle/time.Second)), strconv.Itoa(int(guardKeepaliveInterval/time.Second)),
		strconv.Itoa(guardKeepaliveCount), strconv.Itoa(int(guardLease/time.Millisecond)), pid,
	).Scan(&locked, &sess.pid, &sess.readOnly, &sess.idle, &ignored[0], &ignored[1])
	return locked, sess, err
}

// unlockStatement releases the lock of key with stmt (unlockSQL, or
// unlockSharedSQL) on backend pid and restores the session's
// idle_session_timeout idle; answered is the backend that answered (on
// another than pid it released nothing, and ended pid if it held a lock of
// the election: letGo). unlocked is nil when it released nothing.
func unlockStatement(ctx context.Context, db querier, stmt, key string, idle *string, pid uint32) (unlocked *bool, answered uint32, letGo bool, err error) {
	var ignored *string
	var ended *bool
	err = db.QueryRow(ctx, stmt, key, idle, pid).Scan(&unlocked, &answered, &ignored, &ended)
	return unlocked, answered, ended != nil && *ended, err
}

// letGoStatement runs letGoSQL on db for the election key's session, backend pid.
func letGoStatement(ctx context.Context, db execer, key string, pid uint32) error {
	_, err := db.Exec(ctx, letGoSQL, key, pid)
	return err
}

var sessionLocksHeldSQL = statements.positional("sessionLocksHeld", sqlData{})

// sessionLocksHeld reports whether backend pid still holds advisory locks.
func sessionLocksHeld(ctx context.Context, db querier, pid uint32) (held bool, err error) {
	err = db.QueryRow(ctx, sessionLocksHeldSQL, int64(pid)).Scan(&held)
	return held, err
}

// The partitioned election's statements.
var (
	markSQL              = statements.positional("partitionMark", sqlData{})
	partitionConfigSQL   = statements.positional("partitionConfig", sqlData{})
	partitionLookSQL     = statements.positional("partitionLook", sqlData{})
	rebalanceSQL         = statements.named("rebalance", sqlData{})
	releasePartitionsSQL = statements.named("releasePartitions", sqlData{})
)

// partitionState is what a member learned at rebalanceSQL.
type partitionState struct {
	members  int  // members running with this N: this one among them
	foreignN int  // 0, or the count of partitions held with another N
	waiter   bool // an exclusive request waits for the app's key
	fewest   int  // the fewest partitions a member holds
	others   int  // how many partitions of this N the other members hold
	held     []int
	excluded bool // (join) an exclusive holder keeps this replica out
}

// partitionLook is the election's state as an idle member sees it between
// two rebalances (partitionLookSQL): while it is what the last rebalance
// left, another would change nothing.
type partitionLook struct {
	members int  // members running with this N
	held    int  // partitions of this N held, by any member
	waiter  bool // an exclusive request waits for the app's key
}

// workCheck is a statement sent in the rebalance's round trip, after it: is
// there anything to deliver in the partitions the member held before?
// (repository.partitionWork)
type workCheck struct {
	sql  string
	args []any
	ran  bool // it answered, and work is its answer
	work bool
}

// rebalanceStatement takes the configuration lock and runs rebalanceSQL, in
// one round trip and one transaction, followed by check when it is set. A
// check that fails (the table gone) leaves check.ran false and the
// rebalance as it was: the session-level locks it took do not follow the
// transaction's rollback, and the pass's select meets the failure.
func rebalanceStatement(ctx context.Context, db querier, key string, n, start int, pid uint32, check *workCheck) (partitionState, error) {
	var st partitionState
	var foreign *int32
	var held []int32
	var ran uint32
	rebalanced := false
	b := &pgx.Batch{}
	b.Queue(markReplica(partitionConfigSQL, replicaOf(ctx)), key)
	b.Queue(markReplica(rebalanceSQL.sql, replicaOf(ctx)), rebalanceSQL.args(map[string]any{"key": key, "n": n, "start": start, "pid": pid})...).
		QueryRow(func(row pgx.Row) error {
			err := row.Scan(&ran, &st.members, &foreign, &st.waiter, &st.fewest, &st.others, &held)
			rebalanced = err == nil
			return err
		})
	if check != nil {
		b.Queue(markReplica(check.sql, replicaOf(ctx)), check.args...).QueryRow(func(row pgx.Row) error {
			err := row.Scan(&check.work)
			check.ran = err == nil
			return err
		})
	}
	if err := db.SendBatch(ctx, b).Close(); err != nil {
		var pgErr *pgconn.PgError
		if !rebalanced || check == nil || check.ran || !errors.As(err, &pgErr) {
			return partitionState{}, err
		}
	}
	if ran != pid {
		return partitionState{}, sessionMoved("the rebalance", pid, ran)
	}
	if foreign != nil {
		st.foreignN = int(*foreign)
	}
	for _, p := range held {
		st.held = append(st.held, int(p))
	}
	slices.Sort(st.held)
	return st, nil
}

// idleLookStatement is an idle member's look between two of its rebalances,
// on the relay's own session (membership.idleCheck): check, then the
// election's state (partitionLookSQL), then the presence keepalive, in one
// round trip. All three carry mark, the presence comment Admin reads from the
// session's statement. It sets check's answer, and returns the state and the
// backend that answered.
func idleLookStatement(ctx context.Context, db querier, mark string, check *workCheck, key string, n int) (look partitionLook, pid uint32, err error) {
	b := &pgx.Batch{}
	b.Queue(mark+check.sql, check.args...).QueryRow(func(row pgx.Row) error {
		err := row.Scan(&check.work)
		check.ran = err == nil
		return err
	})
	b.Queue(mark+partitionLookSQL, key, n).QueryRow(func(row pgx.Row) error {
		return row.Scan(&look.members, &look.held, &look.waiter)
	})
	b.Queue(mark + presenceBeatSQL).QueryRow(func(row pgx.Row) error { return row.Scan(&pid) })
	return look, pid, db.SendBatch(ctx, b).Close()
}

// releasePartitionsStatement releases the partitions release of n, and the
// member mark when leave, on backend pid.
func releasePartitionsStatement(ctx context.Context, db querier, key string, n int, release []int, leave bool, pid uint32) (bool, error) {
	var ok *bool
	var ran uint32
	err := db.QueryRow(ctx, releasePartitionsSQL.sql,
		releasePartitionsSQL.args(map[string]any{"key": key, "n": n, "release": release, "leave": leave, "pid": pid})...).Scan(&ok, &ran)
	switch {
	case err != nil:
		return false, err
	case ran != pid:
		return false, sessionMoved("the release of partitions", pid, ran)
	}
	return ok != nil && *ok, nil
}

// markStatement takes the member mark of n on backend pid.
func markStatement(ctx context.Context, db querier, key string, n int, pid uint32) (bool, error) {
	var ok *bool
	var ran uint32
	err := db.QueryRow(ctx, markReplica(markSQL, replicaOf(ctx)), key, n, pid).Scan(&ok, &ran)
	switch {
	case err != nil:
		return false, err
	case ran != pid:
		return false, sessionMoved("the member mark", pid, ran)
	}
	return ok != nil && *ok, nil
}
