package relay

import (
	"context"
	_ "embed"
	"fmt"
	"hash/fnv"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Every SQL statement of the package lives in this file (and schema.sql).

//go:embed schema.sql
var schemaTemplate string

// identifierRE is what a part of Config.Table may be: a plain SQL identifier.
var identifierRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

// parseTable validates a possibly schema-qualified table name and returns it as
// an identifier, so that it is always quoted and never pasted into SQL as given.
func parseTable(name string) (pgx.Identifier, error) {
	parts := strings.Split(name, ".")
	if len(parts) > 2 {
		return nil, fmt.Errorf("table %q: want name or schema.name", name)
	}
	for _, p := range parts {
		if !identifierRE.MatchString(p) {
			return nil, fmt.Errorf("table %q: %q is not an identifier of at most 63 letters, digits and underscores, starting with a letter or underscore", name, p)
		}
	}
	return pgx.Identifier(parts), nil
}

// SchemaSQL returns the outbox table's DDL for table (optionally schema-qualified),
// for adopters who keep it in their own migrations. It is idempotent.
func SchemaSQL(table string) (string, error) {
	id, err := parseTable(table)
	if err != nil {
		return "", fmt.Errorf("relay: %w", err)
	}
	name := id[len(id)-1]
	return strings.NewReplacer(
		"{{table}}", id.Sanitize(),
		"{{outbox_index}}", indexName(name, "_outbox"),
		"{{retry_index}}", indexName(name, "_outbox_retry"),
	).Replace(schemaTemplate), nil
}

// indexName is table+suffix. Past PostgreSQL's 63 bytes, the table's part is
// cut and a hash of the whole name keeps it apart from another long table with
// the same beginning: two tables never share an index name (with IF NOT
// EXISTS, the second would silently get no index).
func indexName(table, suffix string) string {
	if len(table)+len(suffix) > 63 {
		h := fnv.New32a()
		h.Write([]byte(table))
		tag := fmt.Sprintf("_%08x", h.Sum32())
		table = table[:63-len(suffix)-len(tag)] + tag
	}
	return pgx.Identifier{table + suffix}.Sanitize()
}

// Beginner starts a transaction: *pgxpool.Pool, *pgx.Conn and pgx.Tx satisfy it.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// CreateTable creates the outbox table and its indexes if they do not exist.
// Replicas may call it at the same time on start-up: it serialises them on a
// transaction-scoped advisory lock.
func CreateTable(ctx context.Context, db Beginner, table string) error {
	ddl, err := SchemaSQL(table)
	if err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext($1))`, "relay_schema:"+table); err != nil {
			return fmt.Errorf("relay: create table %s: %w", table, err)
		}
		if _, err := tx.Exec(ctx, ddl); err != nil {
			return fmt.Errorf("relay: create table %s: %w", table, err)
		}
		return nil
	})
}

// Execer runs a statement: *pgxpool.Pool, *pgx.Conn and pgx.Tx satisfy it.
type execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// querier is what the pass reads and writes through: *pgxpool.Pool in production.
type querier interface {
	execer
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// row is one outbound row as the pass read it: the message and the state that
// fences its outcome.
type row struct {
	Message
	status string
}

// Row statuses.
const (
	statusPending = "PENDING"
	statusError   = "ERROR"
	statusSent    = "SENT"
)

// repository holds the statements of one table, built once by newRepository.
type repository struct {
	table      string // quoted
	source     string // as Message.IdempotencyKey names it
	fetchSQL   string
	sentSQL    string
	failedSQL  string
	deadSQL    string
	groupSQL   string
	backoff    float64 // seconds; 0 = no backoff
	backoffMax float64
}

func newRepository(table string, backoff time.Duration, asyncCommit bool) (*repository, error) {
	id, err := parseTable(table)
	if err != nil {
		return nil, err
	}
	t := id.Sanitize()
	r := &repository{table: t, source: table, backoff: backoff.Seconds(), backoffMax: RetryBackoffMax.Seconds()}

	// The predicate repeats the partial index's (direction, status) word for
	// word, so the planner walks the index in id order and stops at LIMIT.
	// $1 ceiling, $2 types, $3 limit, $4 backoff base (s), $5 backoff cap (s).
	live := func(a string) string {
		return a + `direction = 'OUT' AND ` + a + `status IN ('PENDING', 'ERROR') AND ` +
			a + `attempts < $1 AND ` + a + `type = ANY($2::text[])`
	}
	if r.backoff == 0 {
		r.fetchSQL = `SELECT id, type, natural_key, payload, attempts, created_at, status FROM ` + t + `
WHERE ` + live("") + `
ORDER BY id LIMIT $3`
	} else {
		waiting := func(a string) string {
			return a + `status = 'ERROR' AND ` + a + `updated_at > now() - make_interval(secs => least($4::float8 * power(2, greatest(` +
				a + `attempts - 1, 0)), $5::float8))`
		}
		// A row waits while it, or an earlier live row of its key, waits out a
		// backoff, so a retry never lets a later message of the same key overtake it.
		r.fetchSQL = `SELECT m.id, m.type, m.natural_key, m.payload, m.attempts, m.created_at, m.status FROM ` + t + ` m
WHERE ` + live("m.") + ` AND NOT (` + waiting("m.") + `)
  AND NOT EXISTS (SELECT 1 FROM ` + t + ` e
    WHERE e.natural_key = m.natural_key AND e.id < m.id AND ` + live("e.") + ` AND ` + waiting("e.") + `)
ORDER BY m.id LIMIT $3`
	}
	// Every outcome is fenced on the state the pass read (status, attempts):
	// a late writer never overwrites a newer outcome.
	//
	// With Config.AsyncCommit, each statement also sets synchronous_commit =
	// off for its own implicit transaction (is_local), in a FROM item: one
	// statement, one round trip, and the commit that ends it does not wait for
	// its WAL flush. Nothing else on the session is touched.
	async, asyncItem := "", ""
	if asyncCommit {
		async = "\nFROM (SELECT set_config('synchronous_commit', 'off', true)) AS async_commit"
		asyncItem = ",\n  (SELECT set_config('synchronous_commit', 'off', true)) AS async_commit"
	}
	r.sentSQL = `UPDATE ` + t + ` SET status = 'SENT', sent_at = now(), updated_at = now()` + async + `
WHERE id = $1 AND status = $2 AND attempts = $3`
	r.failedSQL = `UPDATE ` + t + ` SET status = 'ERROR', attempts = attempts + 1, last_error = $4, updated_at = now()` + async + `
WHERE id = $1 AND status = $2 AND attempts = $3`
	r.deadSQL = `UPDATE ` + t + ` SET status = 'ERROR', attempts = greatest(attempts + 1, $5), last_error = $4, updated_at = now()` + async + `
WHERE id = $1 AND status = $2 AND attempts = $3`
	// Grouped outcomes (Config.GroupOutcomes): one statement, each row still
	// fenced on its own read state; a failure still marks only its own row.
	r.groupSQL = `UPDATE ` + t + ` AS m SET status = o.new_status, attempts = o.new_attempts,
  last_error = coalesce(o.err, m.last_error),
  sent_at = CASE WHEN o.new_status = 'SENT' THEN now() ELSE m.sent_at END,
  updated_at = now()
FROM unnest($1::bigint[], $2::text[], $3::int[], $4::text[], $5::int[], $6::text[])
  AS o(id, status, attempts, new_status, new_attempts, err)` + asyncItem + `
WHERE m.id = o.id AND m.status = o.status AND m.attempts = o.attempts
RETURNING m.id`
	return r, nil
}

// fetch selects one batch, outside any transaction.
func (r *repository) fetch(ctx context.Context, db querier, maxAttempts int, types []string, limit int) ([]row, error) {
	args := []any{maxAttempts, types, limit}
	if r.backoff != 0 {
		args = append(args, r.backoff, r.backoffMax)
	}
	rows, err := db.Query(ctx, r.fetchSQL, args...)
	if err != nil {
		return nil, err
	}
	batch := make([]row, 0, limit)
	for rows.Next() {
		var m row
		if err := rows.Scan(&m.ID, &m.Type, &m.Key, &m.Payload, &m.Attempts, &m.CreatedAt, &m.status); err != nil {
			rows.Close()
			return nil, err
		}
		m.source = r.source
		batch = append(batch, m)
	}
	return batch, rows.Err()
}

// record writes the outcomes ds: one in its own short transaction, several in
// one statement. Each row is fenced on the state the pass read; it returns the
// ids of the rows that had moved on and were left alone.
func (r *repository) record(ctx context.Context, db querier, ds []delivery, maxAttempts int) (stale map[int64]bool, err error) {
	if len(ds) == 1 {
		d := &ds[0]
		sql, args := r.sentSQL, []any{d.m.ID, d.m.status, d.m.Attempts}
		switch d.out {
		case outcomeFailed:
			sql, args = r.failedSQL, append(args, errorText(d.sendErr))
		case outcomeDead:
			sql, args = r.deadSQL, append(args, errorText(d.sendErr), maxAttempts)
		}
		tag, err := db.Exec(ctx, sql, args...)
		if err != nil {
			return nil, err
		}
		if tag.RowsAffected() != 1 {
			return map[int64]bool{d.m.ID: true}, nil
		}
		return nil, nil
	}

	n := len(ds)
	ids, statuses, attempts := make([]int64, n), make([]string, n), make([]int32, n)
	newStatuses, newAttempts, errs := make([]string, n), make([]int32, n), make([]*string, n)
	for i := range ds {
		d := &ds[i]
		ids[i], statuses[i], attempts[i] = d.m.ID, d.m.status, int32(d.m.Attempts)
		newStatuses[i], newAttempts[i] = statusSent, int32(d.newAttempts(maxAttempts))
		if d.out != outcomeSent {
			newStatuses[i] = statusError
			text := errorText(d.sendErr)
			errs[i] = &text
		}
	}
	rows, err := db.Query(ctx, r.groupSQL, ids, statuses, attempts, newStatuses, newAttempts, errs)
	if err != nil {
		return nil, err
	}
	recorded, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, err
	}
	stale = make(map[int64]bool, n)
	for _, id := range ids {
		stale[id] = true
	}
	for _, id := range recorded {
		delete(stale, id)
	}
	return stale, nil
}

// ---- The producer (Enqueue) and the operator's statements (Admin) ----

// enqueue inserts one outbound PENDING row and returns its id. The payload
// goes as text cast to jsonb, which works in every pgx query mode.
func enqueue(ctx context.Context, q Querier, table pgx.Identifier, m Outgoing) (int64, error) {
	var id int64
	err := q.QueryRow(ctx, `INSERT INTO `+table.Sanitize()+` (direction, type, natural_key, payload, status, attempts)
VALUES ('OUT', $1, $2, $3::jsonb, 'PENDING', 0) RETURNING id`, m.Type, m.Key, string(m.Payload)).Scan(&id)
	return id, err
}

// adminRepository holds the statements of Admin for one table. A dead row is
// an outbound ERROR row whose attempts reached the ceiling ($1 everywhere).
type adminRepository struct {
	countSQL       string
	listDeadSQL    string
	requeueAllSQL  string
	requeueTypeSQL string
	requeueIDsSQL  string
	purgeSQL       string
}

func newAdminRepository(table string) (*adminRepository, error) {
	id, err := parseTable(table)
	if err != nil {
		return nil, err
	}
	t := id.Sanitize()
	const dead = `direction = 'OUT' AND status = 'ERROR' AND attempts >= $1`
	// Re-queue touches only rows dead at the moment of the statement; no pass
	// reads them, so it never races a delivery.
	const requeue = `SET status = 'PENDING', attempts = 0, updated_at = now() WHERE ` + dead
	return &adminRepository{
		countSQL: `SELECT type, status, status = 'ERROR' AND attempts >= $1 AS dead, count(*) FROM ` + t + `
WHERE direction = 'OUT' GROUP BY 1, 2, 3 ORDER BY 1, 2, 3`,
		listDeadSQL: `SELECT id, type, natural_key, attempts, coalesce(last_error, ''), updated_at FROM ` + t + `
WHERE ` + dead + ` ORDER BY id LIMIT $2`,
		requeueAllSQL:  `UPDATE ` + t + ` ` + requeue,
		requeueTypeSQL: `UPDATE ` + t + ` ` + requeue + ` AND type = $2`,
		requeueIDsSQL:  `UPDATE ` + t + ` ` + requeue + ` AND id = ANY($2::bigint[])`,
		// One bounded chunk, oldest first: short statements, few locks. SENT
		// rows are never written by a pass again. id = ANY(ARRAY(...)) deletes
		// by primary key; "id IN (subquery)" plans a hash join that reads the
		// whole table for every chunk.
		purgeSQL: `DELETE FROM ` + t + ` WHERE id = ANY(ARRAY(SELECT id FROM ` + t + `
WHERE direction = 'OUT' AND status = 'SENT' AND sent_at < $1 ORDER BY id LIMIT $2))`,
	}, nil
}

func (r *adminRepository) countByStatus(ctx context.Context, db querier, ceiling int) ([]StatusCount, error) {
	rows, err := db.Query(ctx, r.countSQL, ceiling)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (StatusCount, error) {
		var c StatusCount
		err := row.Scan(&c.Type, &c.Status, &c.Dead, &c.Count)
		return c, err
	})
}

func (r *adminRepository) listDead(ctx context.Context, db querier, ceiling, limit int) ([]DeadMessage, error) {
	rows, err := db.Query(ctx, r.listDeadSQL, ceiling, limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (DeadMessage, error) {
		var d DeadMessage
		err := row.Scan(&d.ID, &d.Type, &d.Key, &d.Attempts, &d.LastError, &d.UpdatedAt)
		return d, err
	})
}

func (r *adminRepository) requeueAll(ctx context.Context, db execer, ceiling int) (int64, error) {
	return rowsAffected(db.Exec(ctx, r.requeueAllSQL, ceiling))
}

func (r *adminRepository) requeueType(ctx context.Context, db execer, ceiling int, typ string) (int64, error) {
	return rowsAffected(db.Exec(ctx, r.requeueTypeSQL, ceiling, typ))
}

func (r *adminRepository) requeueIDs(ctx context.Context, db execer, ceiling int, ids []int64) (int64, error) {
	return rowsAffected(db.Exec(ctx, r.requeueIDsSQL, ceiling, ids))
}

// cutoff is the database's now() minus retention, fixed once for a whole purge.
func (r *adminRepository) cutoff(ctx context.Context, db querier, retention time.Duration) (time.Time, error) {
	var t time.Time
	err := db.QueryRow(ctx, `SELECT now() - make_interval(secs => $1::float8)`, retention.Seconds()).Scan(&t)
	return t, err
}

func (r *adminRepository) purgeChunk(ctx context.Context, db execer, cutoff time.Time, limit int) (int64, error) {
	return rowsAffected(db.Exec(ctx, r.purgeSQL, cutoff, limit))
}

func rowsAffected(tag pgconn.CommandTag, err error) (int64, error) {
	if err != nil {
		return 0, err
	}
	return tag.RowsAffected(), nil
}

// databaseNow reads the database's clock: the one clock every replica's
// [Scheduler] agrees on, whatever their own clocks say.
func databaseNow(ctx context.Context, db querier) (time.Time, error) {
	var t time.Time
	err := db.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&t)
	return t, err
}
