package relay

import (
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"regexp"
	"strings"
	"time"
	"unicode/utf8"

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
		"{{pending_index}}", indexName(name, "_outbox_pending"),
		"{{error_index}}", indexName(name, "_outbox_error"),
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
	table          string // quoted
	countSQL       string
	deadPageSQL    string
	deadTypeSQL    string
	requeueAllSQL  string
	requeueTypeSQL string
	requeueIDsSQL  string
	purgeSQL       string

	liveGroupsSQL    string
	sentByTypeSQL    string
	estimateSentSQL  string
	sampleSentSQL    string
	countPurgeSQL    string
	estimatePurgeSQL string
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
	// A page of dead rows: keyed on id, never an offset; the payload and the
	// error are cut by the server, so a page never carries whole payloads.
	// $2 after this id, $3 limit, $4 preview characters (+1 to tell a cut), $5 error characters.
	deadPage := func(byType string) string {
		return `SELECT id, type, natural_key, attempts, left(coalesce(last_error, ''), $5), created_at, updated_at,
  left(payload::text, $4 + 1) FROM ` + t + `
WHERE ` + dead + ` AND id > $2` + byType + ` ORDER BY id LIMIT $3`
	}
	const sent = `direction = 'OUT' AND status = 'SENT'`
	return &adminRepository{
		table: t,
		countSQL: `SELECT type, status, status = 'ERROR' AND attempts >= $1 AS dead, count(*) FROM ` + t + `
WHERE direction = 'OUT' GROUP BY 1, 2, 3 ORDER BY 1, 2, 3`,
		deadPageSQL:    deadPage(""),
		deadTypeSQL:    deadPage(" AND type = $6"),
		requeueAllSQL:  `UPDATE ` + t + ` ` + requeue,
		requeueTypeSQL: `UPDATE ` + t + ` ` + requeue + ` AND type = $2`,
		requeueIDsSQL:  `UPDATE ` + t + ` ` + requeue + ` AND id = ANY($2::bigint[])`,
		// One bounded chunk, oldest first: short statements, few locks. SENT
		// rows are never written by a pass again. id = ANY(ARRAY(...)) deletes
		// by primary key; "id IN (subquery)" plans a hash join that reads the
		// whole table for every chunk.
		purgeSQL: `DELETE FROM ` + t + ` WHERE id = ANY(ARRAY(SELECT id FROM ` + t + `
WHERE direction = 'OUT' AND status = 'SENT' AND sent_at < $1 ORDER BY id LIMIT $2))`,

		// The live rows by type and state, each group with its first row (the
		// lowest id). Each branch repeats a partial index's predicate word for
		// word (the pending and the error index of schema.sql), so it reads that
		// index and never the SENT history. $1 ceiling, $2 error characters.
		liveGroupsSQL: `WITH g AS (
  SELECT type, 'PENDING' AS status, false AS dead, count(*) AS n, min(id) AS head FROM ` + t + `
  WHERE direction = 'OUT' AND (status = 'PENDING' OR status IS NULL) GROUP BY type
  UNION ALL
  SELECT type, 'ERROR', attempts >= $1, count(*), min(id) FROM ` + t + `
  WHERE direction = 'OUT' AND status = 'ERROR' GROUP BY type, attempts >= $1
)
SELECT g.type, g.status, g.dead, g.n, h.id, coalesce(h.status, 'PENDING'), h.attempts, h.created_at,
  left(coalesce(h.last_error, ''), $2)
FROM g JOIN ` + t + ` h ON h.id = g.head
ORDER BY g.type, g.status, g.dead`,
		// Only on a small table: the SENT rows have no index.
		sentByTypeSQL: `SELECT type, count(*) FROM ` + t + ` WHERE ` + sent + ` GROUP BY type ORDER BY type`,
		// The planner's row estimates, from the table's statistics: no scan.
		estimateSentSQL: `EXPLAIN (FORMAT JSON) SELECT 1 FROM ` + t + ` WHERE ` + sent,
		// A table never analyzed: count a sample of its pages ($1 percent).
		sampleSentSQL:    `SELECT count(*) FROM ` + t + ` TABLESAMPLE SYSTEM ($1) WHERE ` + sent,
		countPurgeSQL:    `SELECT count(*) FROM ` + t + ` WHERE ` + sent + ` AND sent_at < $1`,
		estimatePurgeSQL: `EXPLAIN (FORMAT JSON) SELECT 1 FROM ` + t + ` WHERE ` + sent + ` AND sent_at < $1`,
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

func (r *adminRepository) deadPage(ctx context.Context, db querier, ceiling int, q DeadQuery) ([]DeadMessage, error) {
	sql, args := r.deadPageSQL, []any{ceiling, q.AfterID, q.Limit, PayloadPreviewMax, LastErrorMax}
	if q.Type != "" {
		sql, args = r.deadTypeSQL, append(args, q.Type)
	}
	rows, err := db.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (DeadMessage, error) {
		var d DeadMessage
		err := row.Scan(&d.ID, &d.Type, &d.Key, &d.Attempts, &d.LastError, &d.CreatedAt, &d.UpdatedAt, &d.Payload)
		if n := utf8.RuneCountInString(d.Payload); n > PayloadPreviewMax {
			d.Payload, d.PayloadCut = cutRunes(d.Payload, PayloadPreviewMax), true
		}
		return d, err
	})
}

// cutRunes returns the first n runes of s.
func cutRunes(s string, n int) string {
	for i := range s {
		if n == 0 {
			return s[:i]
		}
		n--
	}
	return s
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

func (r *adminRepository) countSentBefore(ctx context.Context, db querier, cutoff time.Time) (int64, error) {
	srv, err := r.server(ctx, db)
	if err != nil {
		return 0, err
	}
	if srv.pages > sentCountMaxPages {
		return r.estimate(ctx, db, r.estimatePurgeSQL, cutoff)
	}
	var n int64
	err = db.QueryRow(ctx, r.countPurgeSQL, cutoff).Scan(&n)
	return n, err
}

// liveGroup is one row of liveGroupsSQL: a type's rows in one state.
type liveGroup struct {
	typ, status string
	dead        bool
	count       int64
	head        RowHead
}

func (r *adminRepository) liveGroups(ctx context.Context, db querier, ceiling int) ([]liveGroup, error) {
	rows, err := db.Query(ctx, r.liveGroupsSQL, ceiling, LastErrorMax)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (liveGroup, error) {
		var g liveGroup
		err := row.Scan(&g.typ, &g.status, &g.dead, &g.count,
			&g.head.ID, &g.head.Status, &g.head.Attempts, &g.head.CreatedAt, &g.head.LastError)
		return g, err
	})
}

// typeCount is a count of one type's rows.
type typeCount struct {
	typ   string
	count int64
}

func (r *adminRepository) sentByType(ctx context.Context, db querier) ([]typeCount, error) {
	rows, err := db.Query(ctx, r.sentByTypeSQL)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (typeCount, error) {
		var c typeCount
		err := row.Scan(&c.typ, &c.count)
		return c, err
	})
}

// serverState is what Overview reads of the server and of the table's size.
type serverState struct {
	now                         time.Time
	inRecovery, defaultReadOnly bool
	analyzed                    bool  // the table has statistics (reltuples is known)
	pages                       int64 // the table's size now, in pages
}

func (r *adminRepository) server(ctx context.Context, db querier) (serverState, error) {
	var s serverState
	err := db.QueryRow(ctx, `SELECT now(), pg_is_in_recovery(), current_setting('default_transaction_read_only') = 'on',
  c.reltuples >= 0, pg_relation_size(c.oid) / current_setting('block_size')::bigint
FROM pg_class c WHERE c.oid = $1::regclass`, r.table).Scan(&s.now, &s.inRecovery, &s.defaultReadOnly, &s.analyzed, &s.pages)
	return s, err
}

// sampledPages is how many pages sampleSent reads of a table never analyzed.
const sampledPages = 256

// sampleSent estimates the SENT rows of a table of pages pages that has no
// statistics yet, from a sample of about sampledPages of its pages.
func (r *adminRepository) sampleSent(ctx context.Context, db querier, pages int64) (int64, error) {
	pct := min(100, 100*float64(sampledPages)/float64(max(pages, 1)))
	var n int64
	if err := db.QueryRow(ctx, r.sampleSentSQL, pct).Scan(&n); err != nil {
		return 0, err
	}
	return int64(float64(n) * 100 / pct), nil
}

// estimate runs an EXPLAIN (FORMAT JSON) and returns its top plan's row estimate.
func (r *adminRepository) estimate(ctx context.Context, db querier, explainSQL string, args ...any) (int64, error) {
	var doc []byte
	if err := db.QueryRow(ctx, explainSQL, args...).Scan(&doc); err != nil {
		return 0, err
	}
	var plans []struct {
		Plan struct {
			Rows float64 `json:"Plan Rows"`
		}
	}
	if err := json.Unmarshal(doc, &plans); err != nil || len(plans) != 1 {
		return 0, fmt.Errorf("read the planner's estimate: unexpected EXPLAIN output %.200q", doc)
	}
	return int64(plans[0].Plan.Rows), nil
}

// lockHoldersSQL lists the sessions that hold or wait for the advisory locks
// of keys, taken as the relays take them: pg_try_advisory_lock(hashtext(key))
// is a one-bigint lock (objsubid 1) whose bigint splits into classid (high 32
// bits) and objid (low 32 bits). Locks of another database are not ours.
const lockHoldersSQL = `SELECT k.key, l.mode, l.granted, coalesce(l.pid, 0), coalesce(a.usename::text, ''),
  coalesce(a.application_name, ''), coalesce(host(a.client_addr), ''),
  a.backend_start, coalesce(a.state, ''), a.state_change, a.backend_start IS NULL, now()
FROM unnest($1::text[]) AS k(key)
JOIN pg_locks l ON l.locktype = 'advisory' AND l.objsubid = 1
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND l.classid = ((hashtext(k.key)::bigint >> 32) & 4294967295)::oid
  AND l.objid = (hashtext(k.key)::bigint & 4294967295)::oid
LEFT JOIN pg_stat_activity a ON a.pid = l.pid
ORDER BY k.key, l.granted DESC, l.mode, a.backend_start, l.pid`

func (r *adminRepository) lockHolders(ctx context.Context, db querier, keys []string) ([]LockHolder, error) {
	rows, err := db.Query(ctx, lockHoldersSQL, keys)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (LockHolder, error) {
		var h LockHolder
		var mode string
		var start, change *time.Time
		var pid int32
		err := row.Scan(&h.Key, &mode, &h.Granted, &pid, &h.User, &h.ApplicationName, &h.ClientAddr,
			&start, &h.State, &change, &h.Hidden, &h.At)
		h.PID = int(pid)
		h.Mode = LockExclusive
		if mode == "ShareLock" {
			h.Mode = LockShared
		}
		if start != nil {
			h.BackendStart = *start
		}
		if change != nil {
			h.StateChange = *change
		}
		return h, err
	})
}

func rowsAffected(tag pgconn.CommandTag, err error) (int64, error) {
	if err != nil {
		return 0, err
	}
	return tag.RowsAffected(), nil
}
