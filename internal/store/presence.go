package store

import (
	"context"
	"strconv"
	"time"

	"github.com/xadm/relay/internal/lease"
)

// Presence's statements, in sql/presence.sql: the locks a started relay holds
// (internal/session), Admin's reading of them, and the table's
// indexes (relay's indexes.go).

var (
	presenceTakeSQL     = Statements.Positional("presenceTake", Data{})
	presenceBeatSQL     = Statements.Positional("presenceBeat", Data{})
	presenceReleaseSQL  = Statements.Positional("presenceRelease", Data{})
	presenceStrandedSQL = Statements.Positional("presenceStranded", Data{})
	replicasSQL         = Statements.Positional("replicas", Data{})
	otherReplicasSQL    = Statements.Positional("otherReplicas", Data{})
	hasColumnSQL        = Statements.Positional("hasColumn", Data{})
	tableIndexesSQL     = Statements.Positional("tableIndexes", Data{})
)

// PresenceTakeStatement takes the presence locks of args (app, replica id,
// MaxAttempts, Partitions, types, table) with the lease's settings, after mark (the
// relay's descriptor comment); it returns the backend's pid and whether
// every lock was granted.
func PresenceTakeStatement(ctx context.Context, db querier, mark string, args []any, idle time.Duration) (pid uint32, ok bool, err error) {
	var ignored [3]*string
	all := append(append([]any{}, args...), strconv.Itoa(int(idle/time.Millisecond)),
		strconv.Itoa(int(lease.KeepaliveIdle/time.Second)), strconv.Itoa(int(lease.KeepaliveInterval/time.Second)),
		strconv.Itoa(lease.KeepaliveCount), strconv.Itoa(int(idle/time.Millisecond)))
	err = db.QueryRow(ctx, mark+presenceTakeSQL, all...).Scan(&pid, &ok, &ignored[0], &ignored[1], &ignored[2])
	return pid, ok, err
}

// PresenceBeatStatement is the keepalive; it returns the answering backend.
func PresenceBeatStatement(ctx context.Context, db querier, mark string) (pid uint32, err error) {
	err = db.QueryRow(ctx, mark+presenceBeatSQL).Scan(&pid)
	return pid, err
}

// PresenceReleaseStatement lets go of the presence locks of args (those of
// PresenceTakeStatement) on backend pid; released is false when the
// statement ran on another backend, or a lock was not held.
func PresenceReleaseStatement(ctx context.Context, db querier, args []any, pid uint32) (released bool, err error) {
	var ok *bool
	var ran uint32
	err = db.QueryRow(ctx, presenceReleaseSQL, append(append([]any{}, args...), pid)...).Scan(&ok, &ran)
	return err == nil && ran == pid && ok != nil && *ok, err
}

// PresenceStrandedStatement ends backend pid while it holds the presence
// lock of replica num of app.
func PresenceStrandedStatement(ctx context.Context, db execer, app string, num int32, pid uint32) error {
	_, err := db.Exec(ctx, presenceStrandedSQL, app, num, pid)
	return err
}

// ReplicaRow is one session of replicasSQL: a live relay's presence.
type ReplicaRow struct {
	PID             int
	ApplicationName string
	ClientAddr      string
	BackendStart    time.Time // zero when hidden
	Hidden          bool      // the reader may not see the session (pg_read_all_stats)
	Query           string    // its last statement, which carries its descriptor
	At              time.Time // the database's clock
	Replica         int32     // its replica lock's second int
	MaxAttempts     int
	Partitions      int
	TypeHashes      []int64
	NameHashes      []int64 // the hashes of the names asked for, in order
}

// ReplicasStatement reads the presence of app's relays, with the hashes of names.
func ReplicasStatement(ctx context.Context, db Querier, app string, names []string) ([]ReplicaRow, error) {
	rows, err := db.Query(ctx, replicasSQL, app, names)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []ReplicaRow
	for rows.Next() {
		var x ReplicaRow
		var start *time.Time
		var id, maxAttempts, parts int64
		if err := rows.Scan(&x.PID, &x.ApplicationName, &x.ClientAddr, &start, &x.Hidden, &x.Query, &x.At,
			&id, &maxAttempts, &parts, &x.TypeHashes, &x.NameHashes); err != nil {
			return nil, err
		}
		if start != nil {
			x.BackendStart = *start
		}
		x.Replica, x.MaxAttempts, x.Partitions = int32(uint32(id)), int(maxAttempts), int(parts)
		out = append(out, x)
	}
	return out, rows.Err()
}

// OtherReplicaRow is one session of otherReplicasSQL: a live relay of
// another app.
type OtherReplicaRow struct {
	PID             int
	ApplicationName string
	ClientAddr      string
	BackendStart    time.Time // zero when hidden
	Hidden          bool      // the reader may not see the session (pg_read_all_stats)
	Query           string    // its last statement, which carries its descriptor
	At              time.Time // the database's clock
	Locks           []int64   // the second ints of every shared advisory lock it holds
	NameHashes      []int64   // the hashes of the names asked for, in order
	// OnTable says it holds the table key of the Admin's table, Tabled
	// that it holds one (a relay older than that key holds none).
	OnTable, Tabled bool
}

// OtherReplicasStatement reads the presence of the relays of every app but
// app, with the hashes of names and whether they deliver from table (its
// name without the schema).
func OtherReplicasStatement(ctx context.Context, db Querier, app string, names []string, table string) ([]OtherReplicaRow, error) {
	rows, err := db.Query(ctx, otherReplicasSQL, app, names, table)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []OtherReplicaRow
	for rows.Next() {
		var x OtherReplicaRow
		var start *time.Time
		if err := rows.Scan(&x.PID, &x.ApplicationName, &x.ClientAddr, &start, &x.Hidden, &x.Query, &x.At,
			&x.Locks, &x.NameHashes, &x.OnTable, &x.Tabled); err != nil {
			return nil, err
		}
		if start != nil {
			x.BackendStart = *start
		}
		out = append(out, x)
	}
	return out, rows.Err()
}

// HasColumn says whether table (quoted) has column.
func HasColumn(ctx context.Context, db Querier, table, column string) (bool, error) {
	var ok bool
	err := db.QueryRow(ctx, hasColumnSQL, table, column).Scan(&ok)
	return ok, err
}

// TableIndexesStatement reads the indexes of table as JSON.
func TableIndexesStatement(ctx context.Context, db querier, table string) ([]byte, error) {
	var doc []byte
	err := db.QueryRow(ctx, tableIndexesSQL, table).Scan(&doc)
	return doc, err
}
