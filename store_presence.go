package relay

import (
	"context"
	"strconv"
	"time"
)

// Presence's statements, in sql/presence.sql: the locks a started relay holds
// (presence.go), Admin's reading of them (admin_presence.go), and the
// table's indexes (indexes.go).

var (
	presenceTakeSQL     = statements.positional("presenceTake", sqlData{})
	presenceBeatSQL     = statements.positional("presenceBeat", sqlData{})
	presenceReleaseSQL  = statements.positional("presenceRelease", sqlData{})
	presenceStrandedSQL = statements.positional("presenceStranded", sqlData{})
	replicasSQL         = statements.positional("replicas", sqlData{})
	otherReplicasSQL    = statements.positional("otherReplicas", sqlData{})
	hasColumnSQL        = statements.positional("hasColumn", sqlData{})
	tableIndexesSQL     = statements.positional("tableIndexes", sqlData{})
)

// presenceTakeStatement takes the presence locks of args (app, replica id,
// MaxAttempts, Partitions, types, table) with the lease's settings, after mark (the
// relay's descriptor comment); it returns the backend's pid and whether
// every lock was granted.
func presenceTakeStatement(ctx context.Context, db querier, mark string, args []any, lease time.Duration) (pid uint32, ok bool, err error) {
	var ignored [2]*string
	all := append(append([]any{}, args...), strconv.Itoa(int(lease/time.Millisecond)),
		strconv.Itoa(int(guardKeepaliveIdle/time.Second)), strconv.Itoa(int(guardKeepaliveInterval/time.Second)),
		strconv.Itoa(guardKeepaliveCount), strconv.Itoa(int(lease/time.Millisecond)))
	err = db.QueryRow(ctx, mark+presenceTakeSQL, all...).Scan(&pid, &ok, &ignored[0], &ignored[1])
	return pid, ok, err
}

// presenceBeatStatement is the keepalive; it returns the answering backend.
func presenceBeatStatement(ctx context.Context, db querier, mark string) (pid uint32, err error) {
	err = db.QueryRow(ctx, mark+presenceBeatSQL).Scan(&pid)
	return pid, err
}

// presenceReleaseStatement lets go of the presence locks of args (those of
// presenceTakeStatement) on backend pid; released is false when the
// statement ran on another backend, or a lock was not held.
func presenceReleaseStatement(ctx context.Context, db querier, args []any, pid uint32) (released bool, err error) {
	var ok *bool
	var ran uint32
	err = db.QueryRow(ctx, presenceReleaseSQL, append(append([]any{}, args...), pid)...).Scan(&ok, &ran)
	return err == nil && ran == pid && ok != nil && *ok, err
}

// presenceStrandedStatement ends backend pid while it holds the presence
// lock of replica num of app.
func presenceStrandedStatement(ctx context.Context, db execer, app string, num int32, pid uint32) error {
	_, err := db.Exec(ctx, presenceStrandedSQL, app, num, pid)
	return err
}

// replicaRow is one session of replicasSQL.
type replicaRow struct {
	r          Replica
	query      string
	typeHashes []int64
	nameHashes []int64
}

// replicasStatement reads the presence of app's relays, with the hashes of names.
func replicasStatement(ctx context.Context, db querier, app string, names []string) ([]replicaRow, error) {
	rows, err := db.Query(ctx, replicasSQL, app, names)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []replicaRow
	for rows.Next() {
		var x replicaRow
		var start *time.Time
		var id, maxAttempts, parts int64
		if err := rows.Scan(&x.r.PID, &x.r.ApplicationName, &x.r.ClientAddr, &start, &x.r.Hidden, &x.query, &x.r.At,
			&id, &maxAttempts, &parts, &x.typeHashes, &x.nameHashes); err != nil {
			return nil, err
		}
		if start != nil {
			x.r.BackendStart = *start
		}
		x.r.ID, x.r.MaxAttempts, x.r.Partitions = replicaID(int32(uint32(id))), int(maxAttempts), int(parts)
		out = append(out, x)
	}
	return out, rows.Err()
}

// otherReplicaRow is one session of otherReplicasSQL.
type otherReplicaRow struct {
	r          Replica
	query      string
	locks      []int64
	nameHashes []int64
	// onTable says it holds the table key of the Admin's table, tabled
	// that it holds one (a relay older than that key holds none).
	onTable, tabled bool
}

// otherReplicasStatement reads the presence of the relays of every app but
// app, with the hashes of names and whether they deliver from table.
func otherReplicasStatement(ctx context.Context, db querier, app string, names []string, table string) ([]otherReplicaRow, error) {
	rows, err := db.Query(ctx, otherReplicasSQL, app, names, tableName(table))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []otherReplicaRow
	for rows.Next() {
		var x otherReplicaRow
		var start *time.Time
		if err := rows.Scan(&x.r.PID, &x.r.ApplicationName, &x.r.ClientAddr, &start, &x.r.Hidden, &x.query, &x.r.At,
			&x.locks, &x.nameHashes, &x.onTable, &x.tabled); err != nil {
			return nil, err
		}
		if start != nil {
			x.r.BackendStart = *start
		}
		out = append(out, x)
	}
	return out, rows.Err()
}

// hasColumn says whether table (quoted) has column.
func hasColumn(ctx context.Context, db querier, table, column string) (bool, error) {
	var ok bool
	err := db.QueryRow(ctx, hasColumnSQL, table, column).Scan(&ok)
	return ok, err
}

// tableIndexesStatement reads the indexes of table as JSON.
func tableIndexesStatement(ctx context.Context, db querier, table string) ([]byte, error) {
	var doc []byte
	err := db.QueryRow(ctx, tableIndexesSQL, table).Scan(&doc)
	return doc, err
}
