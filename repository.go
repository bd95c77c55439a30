package relay

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"maps"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
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

// execer runs a statement: *pgxpool.Pool, *pgxpool.Conn, *pgx.Conn and pgx.Tx satisfy it.
type execer interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// querier is what the pass reads and writes through: a pooled connection the
// pass holds, or the pool.
type querier interface {
	execer
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// row is one outbound row as the pass read it: the message, the state that
// fences its outcome, exactly as read (NULLs included), and, for a row that
// cannot be delivered, why.
type row struct {
	Message
	status   pgtype.Text // as read; not Valid: NULL (read as PENDING)
	attempts pgtype.Int8 // as read; not Valid: NULL (read as 0)
	bad      string      // the column that makes the row undeliverable, and how; "" if none
	size     int         // payload bytes; for a row fetched without its payload, what it will take
	large    bool        // its payload is loaded apart, after the batch, within BatchBytes
}

// Row statuses.
const (
	statusPending = "PENDING"
	statusError   = "ERROR"
	statusSent    = "SENT"
)

// inlinePayloadMax is the stored size (pg_column_size, perhaps compressed) up
// to which a payload comes with its row; a larger one is loaded on its own,
// after its size was checked, so a batch never holds more than BatchBytes.
const inlinePayloadMax = 8 << 10

// repository holds the statements of one table, built once by newRepository.
type repository struct {
	table        string   // quoted
	name         string   // as configured, for to_regclass
	fetchSQL     namedSQL // every partition
	fetchPartSQL namedSQL // this replica's partitions
	pollSQL      namedSQL
	payloadSQL   string
	sentSQL      string
	errorSQL     string
	groupSQL     string
	groupSentSQL string
	stateSQL     string
	probeSQL     string
	backoff      float64 // seconds; 0 = no backoff
	backoffMax   float64
}

// preflightSQL is sent with the first select of a pass, in the same round
// trip: a read-only server (a hot standby after a failover, a cutover's
// default_transaction_read_only) can never record an outcome, so nothing is
// sent from it; and the database's clock measures the lag against the
// producers' own now().
const preflightSQL = `SELECT pg_is_in_recovery() OR current_setting('transaction_read_only')::bool, clock_timestamp()`

func newRepository(table string, backoff time.Duration, asyncCommit bool) (*repository, error) {
	id, err := parseTable(table)
	if err != nil {
		return nil, err
	}
	t := id.Sanitize()
	r := &repository{table: t, name: t, backoff: backoff.Seconds(), backoffMax: RetryBackoffMax.Seconds()}

	// The select's parameters are named (@max the ceiling, @types, @limit,
	// @after the least id, @backoff and @cap in seconds, @n partitions and
	// @parts this replica's, @key the election) and numbered by numbered.
	//
	// Each part walks an index of its own types only (schema.sql): the waiting
	// rows by (type, id), one type at a time, and the failed rows by (type,
	// attempts, id), whose range attempts < ceiling stops before the dead
	// rows, then sorted. Another app's backlog and the dead rows, however
	// many, are never read. Two shapes keep the planner on those indexes: the
	// type is matched by a range, not "=", so that "ORDER BY type, id" is not
	// reduced to "ORDER BY id", which the primary key would offer at the price
	// of walking every row (the planner cannot see that few rows of a busy
	// table are this type's waiting ones); and OFFSET 0 keeps it from trading
	// the failed rows' range for a walk in id order.
	//
	// The columns are cast and read as nullable, and a NULL status or attempts
	// is read as PENDING or 0: a table made by another migration (nullable
	// columns, varchar instead of text) never makes the select fail, and a row
	// that cannot be delivered is marked dead by the pass, not skipped.
	waiting := func(a string) string { return "false" }
	if r.backoff != 0 {
		// The exponent is clamped (2^40 s is far past the cap), so no number
		// of attempts overflows; a NULL updated_at does not wait.
		waiting = func(a string) string {
			return `coalesce(` + a + `.updated_at > now() - make_interval(secs => least(@backoff::float8 * power(2::float8, least(greatest(coalesce(` +
				a + `.attempts, 0), 1) - 1, 40)), @cap::float8)), false)`
		}
	}
	// A row waits while an earlier failed row of its key waits out its
	// backoff: a retry never lets a later message of its key overtake it.
	heldBack := ""
	if r.backoff != 0 {
		heldBack = `
      AND NOT EXISTS (SELECT 1 FROM ` + t + ` e
        WHERE e.natural_key = m.natural_key AND e.id < m.id AND e.direction = 'OUT' AND e.status = 'ERROR'
          AND e.type = ANY(@types::text[]) AND (e.attempts < @max OR e.attempts IS NULL) AND ` + waiting("e") + `)`
	}
	// candidates are the ids of deliverable rows, at most @limit of each part;
	// partitioned, only of this replica's partitions (partitions.go).
	candidates := func(partitioned bool) string {
		part := ""
		if partitioned {
			part = ` AND ` + partitionOf("m.natural_key") + ` = ANY(@parts::int[])`
		}
		failed := func(attempts string) string {
			return `
  UNION ALL
  (SELECT e.id FROM (SELECT m.id FROM ` + t + ` m
    WHERE m.type = ANY(@types::text[]) AND m.direction = 'OUT' AND m.status = 'ERROR' AND ` + attempts + ` AND m.id > @after` + part + `
      AND NOT ` + waiting("m") + heldBack + `
    OFFSET 0) e ORDER BY e.id LIMIT @limit)`
		}
		return `
  SELECT p.id FROM unnest(@types::text[]) AS ty(type) CROSS JOIN LATERAL (
    SELECT m.id FROM ` + t + ` m
    WHERE m.type >= ty.type AND m.type <= ty.type AND m.direction = 'OUT' AND (m.status = 'PENDING' OR m.status IS NULL)
      AND coalesce(m.attempts, 0) < @max AND m.id > @after` + part + heldBack + `
    ORDER BY m.type, m.id LIMIT @limit) p` +
			failed("m.attempts < @max") + failed("m.attempts IS NULL")
	}
	fetch := func(partitioned bool) namedSQL {
		return numbered(`SELECT m.id, m.type::text, m.natural_key::text, m.status::text, m.attempts::bigint, m.created_at::timestamptz,
  pg_column_size(m.payload), CASE WHEN pg_column_size(m.payload) <= ` + fmt.Sprint(inlinePayloadMax) + ` THEN m.payload::text END
FROM ` + t + ` m
WHERE m.id = ANY(ARRAY(SELECT c.id FROM (` + candidates(partitioned) + `
  ) c ORDER BY c.id LIMIT @limit))
ORDER BY m.id`)
	}
	r.fetchSQL, r.fetchPartSQL = fetch(false), fetch(true)
	// The idle poll, one statement: is the server writable, does this
	// session win the election for the statement's own length (a
	// transaction-scoped lock, gone when the statement ends: nobody waits on
	// it, a JVM replica trying at that instant coalesces), and is there
	// anything to deliver? Only a poll that finds work takes the election for
	// real. @limit is 1.
	r.pollSQL = numbered(`SELECT l.read_only, l.won, l.won AND EXISTS (` + candidates(false) + `)
FROM (SELECT r.read_only, NOT r.read_only AND pg_try_advisory_xact_lock(hashtext(@key)) AS won
  FROM (SELECT pg_is_in_recovery() OR current_setting('transaction_read_only')::bool AS read_only OFFSET 0) r
  OFFSET 0) l`)

	// A large payload, measured before it is sent, and read in chunks of $3
	// bytes: pgx reads each row into a buffer of its size, so a payload that
	// came as one value would be held twice (pgx's buffer and the copy kept).
	// Above $2 bytes (what is left of the batch's budget) only its size comes
	// back, in one row, and nothing of it is read. Each chunk says where it
	// starts (1-based), so their order does not matter.
	r.payloadSQL = `SELECT s.n, g.i, CASE WHEN s.n <= $2 THEN substring(s.b FROM g.i FOR $3) END
FROM (SELECT p.b, octet_length(p.b) AS n
  FROM (SELECT convert_to(payload::text, 'UTF8') AS b FROM ` + t + ` WHERE id = $1 OFFSET 0) p OFFSET 0) s
CROSS JOIN LATERAL generate_series(1, CASE WHEN s.n <= $2 THEN greatest(s.n, 1) ELSE 1 END, $3) AS g(i)`

	// Every outcome is fenced on the state the pass read (status, attempts,
	// NULLs included): a late writer never overwrites a newer outcome. The
	// new values are written explicitly, never computed from the row.
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
	const fence = `
WHERE id = $1 AND status IS NOT DISTINCT FROM $2 AND attempts IS NOT DISTINCT FROM $3`
	r.sentSQL = `UPDATE ` + t + ` SET status = 'SENT', sent_at = now(), updated_at = now()` + async + fence
	r.errorSQL = `UPDATE ` + t + ` SET status = 'ERROR', attempts = $4, last_error = $5, updated_at = now()` + async + fence
	// Grouped outcomes (Config.GroupOutcomes): one statement, each row still
	// fenced on its own read state; a failure still marks only its own row.
	// "m.id = ANY($1)" says again what the join says, in the form the planner
	// turns into a primary-key probe: without it, the first plans hashed the
	// whole table.
	r.groupSQL = `UPDATE ` + t + ` AS m SET status = o.new_status, attempts = o.new_attempts,
  last_error = CASE WHEN o.new_status = 'SENT' THEN m.last_error ELSE o.err END,
  sent_at = CASE WHEN o.new_status = 'SENT' THEN now() ELSE m.sent_at END,
  updated_at = now()
FROM unnest($1::bigint[], $2::text[], $3::bigint[], $4::text[], $5::bigint[], $6::text[])
  AS o(id, status, attempts, new_status, new_attempts, err)` + asyncItem + `
WHERE m.id = o.id AND m.id = ANY($1::bigint[])
  AND m.status IS NOT DISTINCT FROM o.status AND m.attempts IS NOT DISTINCT FROM o.attempts
RETURNING m.id`
	// The common group: every message sent, every row read as PENDING with
	// no attempt. One array, one fence for all, and the planner probes the
	// primary key: half the server's time of the general statement.
	r.groupSentSQL = `UPDATE ` + t + ` SET status = 'SENT', sent_at = now(), updated_at = now()` + async + `
WHERE id = ANY($1::bigint[]) AND status = 'PENDING' AND attempts = 0
RETURNING id`
	// The state of rows whose fenced outcome touched nothing: was it this
	// relay's own earlier write, whose answer was lost?
	r.stateSQL = `SELECT id, status::text, attempts::bigint FROM ` + t + ` WHERE id = ANY($1::bigint[])`
	// What the relay learns of the table before its first pass: its
	// schema-qualified name, the columns it has, and the width of last_error
	// when it is declared narrower than text (varchar(255)).
	r.probeSQL = `SELECT n.nspname::text, c.relname::text,
  coalesce((SELECT array_agg(a.attname::text) FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped), '{}'),
  coalesce((SELECT CASE WHEN a.atttypid IN ('varchar'::regtype, 'bpchar'::regtype) AND a.atttypmod > 4 THEN a.atttypmod - 4 END
    FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attname = 'last_error' AND NOT a.attisdropped), 0)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.oid = to_regclass($1)`
	return r, nil
}

// namedSQL is a statement whose parameters were named ("@max") and numbered
// ($1) by numbered, in order of first appearance.
type namedSQL struct {
	sql   string
	names []string
}

var paramName = regexp.MustCompile(`@[a-z]+`)

// numbered numbers the named parameters of a statement's template.
func numbered(template string) namedSQL {
	var n namedSQL
	index := map[string]int{}
	n.sql = paramName.ReplaceAllStringFunc(template, func(name string) string {
		i, ok := index[name]
		if !ok {
			n.names = append(n.names, name[1:])
			i = len(n.names)
			index[name] = i
		}
		return "$" + strconv.Itoa(i)
	})
	return n
}

// args orders values by the statement's parameters; a name it lacks is a
// bug, and panics.
func (n namedSQL) args(values map[string]any) []any {
	args := make([]any, len(n.names))
	for i, name := range n.names {
		v, ok := values[name]
		if !ok {
			panic("relay: no value for the statement's parameter @" + name)
		}
		args[i] = v
	}
	return args
}

// partitionOf is the partition of a natural key, for Config.Partitions
// @n: its hashtext, without sign, modulo @n. A NULL key is in partition of
// the empty key, so that some replica marks its row dead.
func partitionOf(key string) string {
	return `((hashtext(coalesce(` + key + `::text, '')) & 2147483647) % @n::int)`
}

// fetchArgs are what one select asks for.
type fetchArgs struct {
	maxAttempts int
	types       []string
	limit       int
	maxBytes    int
	after       int64  // only rows past this id: a drain's next batch, while the last one's outcomes are written
	partitions  int    // Config.Partitions, when parts is set
	parts       []int  // only rows of these partitions; nil: every row
	preflight   bool   // the pass's first select: ask whether the server is writable
	source      string // the schema-qualified table, for Message.IdempotencyKey
}

// fetched is one select's answer.
type fetched struct {
	rows     []row
	full     bool      // the select filled its limit, or was cut short by the byte bound: more may wait
	cut      bool      // the select was cut short by the byte bound (BatchBytes), before its limit
	readOnly bool      // the server cannot record an outcome: send nothing (preflight only)
	now      time.Time // the database's clock at the select (preflight only)
}

// fetch selects one batch, outside any transaction, and loads its large
// payloads within maxBytes: the batch is cut short before the row that would
// exceed it (the rest wait for the next batch), and a row whose payload alone
// exceeds it comes back marked bad.
func (r *repository) fetch(ctx context.Context, db querier, a fetchArgs) (fetched, error) {
	var f fetched
	sql := r.fetchSQL
	if a.parts != nil {
		sql = r.fetchPartSQL
	}
	args := sql.args(map[string]any{"max": a.maxAttempts, "types": a.types, "limit": a.limit, "after": a.after,
		"backoff": r.backoff, "cap": r.backoffMax, "n": a.partitions, "parts": a.parts})
	b := &pgx.Batch{}
	if a.preflight {
		b.Queue(preflightSQL).QueryRow(func(row pgx.Row) error { return row.Scan(&f.readOnly, &f.now) })
	}
	b.Queue(sql.sql, args...).Query(func(rows pgx.Rows) error {
		f.rows = make([]row, 0, min(a.limit, 1024))
		budget := a.maxBytes
		for rows.Next() {
			var (
				m       row
				typ     string
				key     pgtype.Text
				created pgtype.Timestamptz
				stored  pgtype.Int4
				payload []byte
			)
			if err := rows.Scan(&m.ID, &typ, &key, &m.status, &m.attempts, &created, &stored, &payload); err != nil {
				return err
			}
			m.Type, m.source, m.Key = typ, a.source, key.String
			m.Attempts = int(m.attempts.Int64) // 0 when NULL
			if created.Valid && created.InfinityModifier == pgtype.Finite {
				m.CreatedAt = created.Time
			}
			switch {
			case !key.Valid:
				m.bad = "natural_key is NULL: a message needs its natural key"
			case !stored.Valid:
				m.bad = "payload is NULL"
			case payload == nil:
				m.large, m.size = true, int(stored.Int32) // loaded below, within the budget
			default:
				m.Payload, m.size = payload, len(payload)
				if m.size > a.maxBytes {
					m.bad, m.Payload = tooLarge(m.size, a.maxBytes), nil
				}
			}
			if m.bad == "" && !m.large {
				if budget -= m.size; budget < 0 && len(f.rows) > 0 {
					// Read no further: this row and the rest wait for the next batch.
					f.full, f.cut = true, true
					break
				}
			}
			f.rows = append(f.rows, m)
		}
		f.full = f.full || len(f.rows) >= a.limit
		return rows.Err()
	})
	if err := db.SendBatch(ctx, b).Close(); err != nil {
		return fetched{}, err
	}
	return f, r.loadLarge(ctx, db, &f, a.maxBytes)
}

// loadLarge loads the payloads the select left out, in id order, while the
// batch's payloads stay within maxBytes; it cuts the batch before the first
// row that would exceed it, without reading that row's payload.
func (r *repository) loadLarge(ctx context.Context, db querier, f *fetched, maxBytes int) error {
	held := 0
	kept := f.rows[:0]
	for i := range f.rows {
		m := f.rows[i]
		if m.large {
			room := maxBytes // the first row may take the whole budget
			if len(kept) > 0 {
				room = maxBytes - held
			}
			n, payload, found, err := r.loadPayload(ctx, db, m.ID, room)
			switch {
			case err != nil:
				return err
			case !found:
				continue // deleted since the select: nothing to deliver
			case n == nil:
				m.bad = "payload is NULL"
			case int(*n) > maxBytes:
				m.bad = tooLarge(int(*n), maxBytes)
			case payload == nil && int(*n) > room:
				f.rows, f.full, f.cut = kept, true, true // this row and the rest wait for the next batch
				return nil
			case payload == nil:
				m.Payload, m.size = []byte{}, 0
			default:
				m.Payload, m.size = payload, len(payload)
			}
			m.large = false
		}
		held += len(m.Payload)
		kept = append(kept, m)
	}
	f.rows = kept
	return nil
}

// payloadChunkBytes is how much of a large payload one row of payloadSQL
// carries: what pgx buffers beside the payload it assembles.
const payloadChunkBytes = 1 << 20

// loadPayload reads the payload of row id, in chunks, if it is at most room
// bytes: n is its size (nil: NULL), payload is nil when it is larger than room
// (or NULL), found is false when the row is gone.
func (r *repository) loadPayload(ctx context.Context, db querier, id int64, room int) (n *int32, payload []byte, found bool, err error) {
	rows, err := db.Query(ctx, r.payloadSQL, id, room, payloadChunkBytes)
	if err != nil {
		return nil, nil, false, err
	}
	defer rows.Close()
	var at int64
	dst := payloadChunk{n: &n, at: &at, buf: &payload}
	for rows.Next() {
		found = true
		if err := rows.Scan(&n, &at, &dst); err != nil {
			return nil, nil, false, err
		}
	}
	if err := rows.Err(); err != nil {
		return nil, nil, false, err
	}
	if payload != nil && dst.filled != len(payload) {
		return nil, nil, false, fmt.Errorf("payload of row %d: %d of %d bytes came back", id, dst.filled, len(payload))
	}
	return n, payload, found, nil
}

// payloadChunk assembles a payload from payloadSQL's chunks, straight from
// pgx's buffer into one allocation of the payload's size (pgtype.BytesScanner).
// n and at are the row's columns scanned before it.
type payloadChunk struct {
	n      **int32
	at     *int64
	buf    *[]byte
	filled int
}

func (c *payloadChunk) ScanBytes(v []byte) error {
	if v == nil {
		return nil // too large for the room, or NULL: only the size came
	}
	if *c.buf == nil {
		if *c.n == nil {
			return errors.New("a payload chunk without its size")
		}
		*c.buf = make([]byte, **c.n)
	}
	off := *c.at - 1
	if off < 0 || off+int64(len(v)) > int64(len(*c.buf)) {
		return fmt.Errorf("a payload chunk of %d bytes at %d does not fit its %d bytes", len(v), off, len(*c.buf))
	}
	c.filled += copy((*c.buf)[off:], v)
	return nil
}

func tooLarge(size, limit int) string {
	return fmt.Sprintf("payload is %d bytes, above Config.BatchBytes (%d): the relay never holds it in memory", size, limit)
}

// record writes the outcomes ds: one in its own short transaction, several in
// one statement. Each row is fenced on the state the pass read; it returns the
// ids of the rows that had moved on and were left alone.
func (r *repository) record(ctx context.Context, db querier, ds []delivery, maxAttempts, errWidth int) (stale map[int64]bool, err error) {
	if len(ds) == 1 {
		d := &ds[0]
		sql, args := r.sentSQL, []any{d.m.ID, d.m.status, d.m.attempts}
		if d.out != outcomeSent {
			sql, args = r.errorSQL, append(args, d.newAttempts(maxAttempts), d.errorText(errWidth))
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
	if allSentFresh(ds) {
		ids := make([]int64, n)
		for i := range ds {
			ids[i] = ds[i].m.ID
		}
		rows, err := db.Query(ctx, r.groupSentSQL, ids)
		if err != nil {
			return nil, err
		}
		return staleOf(rows, ids)
	}
	ids, statuses, attempts := make([]int64, n), make([]pgtype.Text, n), make([]pgtype.Int8, n)
	newStatuses, newAttempts, errs := make([]string, n), make([]int64, n), make([]*string, n)
	for i := range ds {
		d := &ds[i]
		ids[i], statuses[i], attempts[i] = d.m.ID, d.m.status, d.m.attempts
		newStatuses[i], newAttempts[i] = statusSent, d.newAttempts(maxAttempts)
		if d.out != outcomeSent {
			newStatuses[i] = statusError
			text := d.errorText(errWidth)
			errs[i] = &text
		}
	}
	rows, err := db.Query(ctx, r.groupSQL, ids, statuses, attempts, newStatuses, newAttempts, errs)
	if err != nil {
		return nil, err
	}
	return staleOf(rows, ids)
}

// staleOf reads the ids a grouped outcome returned, and returns those of ids
// it did not: the rows whose fence found them moved on.
func staleOf(rows pgx.Rows, ids []int64) (map[int64]bool, error) {
	recorded, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return nil, err
	}
	stale := make(map[int64]bool, len(ids)-len(recorded))
	done := make(map[int64]bool, len(recorded))
	for _, id := range recorded {
		done[id] = true
	}
	for _, id := range ids {
		if !done[id] {
			stale[id] = true
		}
	}
	return stale, nil
}

// allSentFresh reports whether every delivery of ds was sent from a row read
// as PENDING with no attempt: the common group, which has its own statement.
func allSentFresh(ds []delivery) bool {
	for i := range ds {
		m := ds[i].m
		if ds[i].out != outcomeSent || !m.status.Valid || m.status.String != statusPending || !m.attempts.Valid || m.attempts.Int64 != 0 {
			return false
		}
	}
	return true
}

// recordEach writes each outcome of ds in its own implicit transaction, as
// record does one, but all of them in one round trip: a pipeline with a Sync
// after each statement, so that each commits (or fails) alone. It returns the
// rows whose fence found them moved on, and the rows whose own statement
// failed (a value that does not fit, a trigger); err is for the connection
// or the pipeline as a whole, after which nothing is known.
//
// It needs named prepared statements; on a connection whose pgx mode does not
// prepare statements (configured for a transaction-pooling proxy), it writes
// them one by one.
func (r *repository) recordEach(ctx context.Context, c *pgxpool.Conn, ds []delivery, maxAttempts, errWidth int) (stale map[int64]bool, failed map[int64]error, err error) {
	stale, failed = map[int64]bool{}, map[int64]error{}
	conn := c.Conn()
	if mode := conn.Config().DefaultQueryExecMode; mode != pgx.QueryExecModeCacheStatement && mode != pgx.QueryExecModeCacheDescribe {
		for _, d := range ds {
			st, err := r.record(ctx, c, []delivery{d}, maxAttempts, errWidth)
			if err != nil {
				if sqlState(err) == "" || connectionFailed(err) {
					return nil, nil, err
				}
				failed[d.m.ID] = err
			}
			maps.Copy(stale, st)
		}
		return stale, failed, nil
	}
	sent, err := conn.Prepare(ctx, statementName(r.sentSQL), r.sentSQL)
	if err != nil {
		return nil, nil, err
	}
	failure, err := conn.Prepare(ctx, statementName(r.errorSQL), r.errorSQL)
	if err != nil {
		return nil, nil, err
	}
	text := func(v pgtype.Int8) []byte {
		if !v.Valid {
			return nil
		}
		return strconv.AppendInt(nil, v.Int64, 10)
	}
	var status []byte
	p := conn.PgConn().StartPipeline(ctx)
	for _, d := range ds {
		status = nil
		if d.m.status.Valid {
			status = []byte(d.m.status.String)
		}
		id := strconv.AppendInt(nil, d.m.ID, 10)
		if d.out == outcomeSent {
			p.SendQueryStatement(sent, [][]byte{id, status, text(d.m.attempts)}, nil, nil)
		} else {
			n := pgtype.Int8{Int64: d.newAttempts(maxAttempts), Valid: true}
			p.SendQueryStatement(failure, [][]byte{id, status, text(d.m.attempts), text(n), []byte(d.errorText(errWidth))}, nil, nil)
		}
		p.SendPipelineSync()
	}
	if err := p.Flush(); err != nil {
		p.Close()
		return nil, nil, err
	}
	for _, d := range ds {
		res, err := p.GetResults()
		if err == nil {
			rr, ok := res.(*pgconn.ResultReader)
			if !ok {
				p.Close()
				return nil, nil, fmt.Errorf("relay: pipeline: unexpected %T", res)
			}
			var tag pgconn.CommandTag
			if tag, err = rr.Close(); err == nil && tag.RowsAffected() != 1 {
				stale[d.m.ID] = true
			}
		}
		if err != nil {
			if sqlState(err) == "" || connectionFailed(err) {
				p.Close()
				return nil, nil, err
			}
			failed[d.m.ID] = err // its own transaction failed; the others are unaffected
		}
		if res, err = p.GetResults(); err != nil {
			p.Close()
			return nil, nil, err
		} else if _, ok := res.(*pgconn.PipelineSync); !ok {
			p.Close()
			return nil, nil, fmt.Errorf("relay: pipeline: want the Sync of id %d, got %T", d.m.ID, res)
		}
	}
	return stale, failed, p.Close()
}

// statementName names a statement the relay prepares itself, by its text.
func statementName(sql string) string {
	h := fnv.New64a()
	h.Write([]byte(sql))
	return fmt.Sprintf("relay_%016x", h.Sum64())
}

// rowState is a row's (status, attempts) as the table holds it now.
type rowState struct {
	status   *string
	attempts *int64
}

// states reads the current state of rows by id; a missing row is absent.
func (r *repository) states(ctx context.Context, db querier, ids []int64) (map[int64]rowState, error) {
	rows, err := db.Query(ctx, r.stateSQL, ids)
	if err != nil {
		return nil, err
	}
	out := make(map[int64]rowState, len(ids))
	var id int64
	var st rowState
	_, err = pgx.ForEachRow(rows, []any{&id, &st.status, &st.attempts}, func() error {
		out[id] = st
		return nil
	})
	return out, err
}

// poll runs the idle poll (pollSQL) for the election key.
func (r *repository) poll(ctx context.Context, db querier, maxAttempts int, types []string, key string) (readOnly, won, work bool, err error) {
	args := r.pollSQL.args(map[string]any{"max": maxAttempts, "types": types, "limit": 1, "after": int64(math.MinInt64),
		"backoff": r.backoff, "cap": r.backoffMax, "key": key})
	err = db.QueryRow(ctx, r.pollSQL.sql, args...).Scan(&readOnly, &won, &work)
	return readOnly, won, work, err
}

// tableInfo is what the relay learns of its table before the first pass.
type tableInfo struct {
	qualified string // "schema.table", as Message.IdempotencyKey names it
	errWidth  int    // characters last_error holds; 0: as many as lastErrorMax
}

// requiredColumns are the columns the pass reads and writes.
var requiredColumns = []string{"id", "direction", "type", "natural_key", "payload", "status", "attempts",
	"last_error", "created_at", "updated_at", "sent_at"}

// probe learns the table: that it exists with the columns the relay needs,
// its schema-qualified name, and the width of last_error.
func (r *repository) probe(ctx context.Context, db querier) (tableInfo, error) {
	var schema, name string
	var columns []string
	var width int32
	err := db.QueryRow(ctx, r.probeSQL, r.table).Scan(&schema, &name, &columns, &width)
	if errors.Is(err, pgx.ErrNoRows) {
		return tableInfo{}, fmt.Errorf("table %s does not exist (as the search_path resolves it): create it with relay.CreateTable or relay.SchemaSQL", r.table)
	}
	if err != nil {
		return tableInfo{}, err
	}
	var missing []string
	for _, c := range requiredColumns {
		if !slices.Contains(columns, c) {
			missing = append(missing, c)
		}
	}
	if len(missing) > 0 {
		return tableInfo{}, fmt.Errorf("table %s.%s lacks the column(s) %s that the relay reads and writes (see relay.SchemaSQL)",
			schema, name, strings.Join(missing, ", "))
	}
	return tableInfo{qualified: schema + "." + name, errWidth: int(width)}, nil
}

// ---- The producer (Enqueue) and the operator's statements (Admin) ----

// enqueue inserts one outbound PENDING row and returns its id. The payload
// goes as text cast to jsonb, which works in every pgx query mode.
//
// It first takes the key's order lock (keyOrderLockSQL) in the same statement,
// before the id is drawn: two transactions writing messages of one key get
// their ids in the order they commit.
func enqueue(ctx context.Context, q Querier, table pgx.Identifier, m Outgoing, wakeChannel string, wakeWindowDue bool) (int64, error) {
	// The NOTIFY, when there is one, rides in the same statement: it is sent
	// when the producer's transaction commits, and never if it rolls back.
	wake, args := "", []any{m.Type, m.Key, string(m.Payload), table[len(table)-1]}
	if wakeChannel != "" {
		wake, args = ", "+wakeTokenSQL, append(args, wakeChannel, wakeWindowDue)
	}
	var id int64
	err := q.QueryRow(ctx, `INSERT INTO `+table.Sanitize()+` (direction, type, natural_key, payload, status, attempts)
SELECT 'OUT', $1, $2, $3::jsonb, 'PENDING', 0
FROM (SELECT `+keyOrderLockSQL+wake+`) AS key_order
RETURNING id`, args...).Scan(&id)
	return id, err
}

// wakeTokenSQL notifies channel $5 of type $1 when this transaction takes the
// wake-up token (a transaction-scoped try-lock: one notifying transaction in
// flight at a time, so notifying commits never queue behind each other), or
// when $6, the producer's own window, says a NOTIFY is due anyway (a token
// held by a long transaction must not silence everyone else for its length).
// WakeTriggerSQL's trigger takes the same token.
//
// The token is tried first, in a CASE of its own: "try OR $6" would let the
// planner fold a true $6 and never take the token.
const wakeTokenSQL = `CASE WHEN pg_try_advisory_xact_lock(hashtext('relay:wake'), hashtext($5)) THEN pg_notify($5, $1)
  WHEN $6::bool THEN pg_notify($5, $1) END`

// keyOrderLockSQL is the lock a producer takes, in its transaction, before it
// writes a message of key $2 into table $4 (its name without schema), so that
// ids of one key are drawn in commit order. It is transaction-scoped and
// two-int, apart from the elections' one-bigint session locks. A producer that
// writes by plain SQL takes the same lock:
//
//	SELECT pg_advisory_xact_lock(hashtext('relay:' || 'mensagem_m2m'), hashtext(<key>));
const keyOrderLockSQL = `pg_advisory_xact_lock(hashtext('relay:' || $4), hashtext($2))`

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
// bits) and objid (low 32 bits). Locks of another database are not ours. With
// each, the partitions its session holds (two-int locks, partitions.go).
const lockHoldersSQL = `SELECT k.key, l.mode, l.granted, coalesce(l.pid, 0), coalesce(a.usename::text, ''),
  coalesce(a.application_name, ''), coalesce(host(a.client_addr), ''),
  a.backend_start, coalesce(a.state, ''), a.state_change, a.backend_start IS NULL, now(),
  coalesce(a.query, ''), a.query_start,
  (SELECT array_agg((p.objid::bigint & 65535)::int ORDER BY p.objid) FROM pg_locks p
    WHERE p.locktype = 'advisory' AND p.objsubid = 2 AND p.granted AND p.pid = l.pid AND p.database = l.database
      AND p.classid = (hashtext(k.key)::bigint & 4294967295)::oid AND p.objid::bigint & 65535 <> 65535),
  (SELECT min((p.objid::bigint >> 16)::int) FROM pg_locks p
    WHERE p.locktype = 'advisory' AND p.objsubid = 2 AND p.granted AND p.pid = l.pid AND p.database = l.database
      AND p.classid = (hashtext(k.key)::bigint & 4294967295)::oid AND p.objid::bigint <> 4294967295)
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
		var start, change, queryStart *time.Time
		var pid int32
		var parts []int32
		var of *int32
		err := row.Scan(&h.Key, &mode, &h.Granted, &pid, &h.User, &h.ApplicationName, &h.ClientAddr,
			&start, &h.State, &change, &h.Hidden, &h.At, &h.query, &queryStart, &parts, &of)
		for _, p := range parts {
			h.Partitions = append(h.Partitions, int(p))
		}
		if of != nil {
			h.PartitionsOf = int(*of)
		}
		if queryStart != nil {
			h.queryStart = *queryStart
		}
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

// databaseNow reads the database's clock: the one clock every replica's
// [Scheduler] agrees on, whatever their own clocks say.
func databaseNow(ctx context.Context, db querier) (time.Time, error) {
	var t time.Time
	err := db.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&t)
	return t, err
}

// ---- The partitioned election (partitions.go) ----
//
// A member's locks are two-int advisory locks beside the app's own one-bigint
// key, all with hashtext(<app key>) first, so that pg_locks tells who holds
// what with which N:
//
//	(k, n<<16 | p)      partition p of n, exclusive
//	(k, n<<16 | 65535)  the member mark of n, shared: a member with N = n
//	(k, -1)             the configuration lock, for one rebalance at a time

// markSQL takes the member mark, once, after the join, on the membership's
// backend $3 only (like every statement of the membership: a pooler that does
// not keep sessions may run it on another); its second column says where it ran.
var markSQL = electionMark + `SELECT CASE WHEN pg_backend_pid() = $3::int THEN pg_try_advisory_lock_shared(hashtext($1), ($2::int << 16) | 65535) END,
  pg_backend_pid()`

// partitionConfigSQL takes the configuration lock until the end of the
// transaction: rebalanceSQL, sent with it in one batch (one implicit
// transaction), so that two members never decide on the same state.
var partitionConfigSQL = electionMark + `SELECT pg_advisory_xact_lock(hashtext($1), -1)`

// rebalanceSQL is a member's look at the election, and its taking of free
// partitions: how many members run with @n (marks, this one among them);
// whether a partition of another count is held (foreign: then nobody of
// @n takes one); whether an exclusive request waits for the app's key (an
// operator's pause: members leave); the fewest partitions a member of @n
// holds; and the partitions this member holds after it took free ones, up to
// its share, ceil(@n / members), starting from @start so that members
// spread, and none while a member holds fewer than floor(@n / members) and
// this one does not: those are left for it. It takes nothing unless it runs
// on the membership's backend @pid; its first column says where it ran.
// pg_locks is read before any lock
// is tried (the lateral row comes first), and the CASE keeps a partition this
// session holds from being locked twice (session locks stack).
var rebalanceSQL = numbered(electionMark + `SELECT pg_backend_pid(), st.members, st.foreign_n, st.waiter, st.fewest, st.mine || coalesce((
    SELECT array_agg(x.p) FROM (
      SELECT c.p FROM (SELECT (@start::int + g) % @n::int AS p FROM generate_series(0, @n::int - 1) g) c
      WHERE CASE WHEN pg_backend_pid() <> @pid::int OR st.foreign_n IS NOT NULL OR st.waiter OR c.p = ANY(st.taken) OR c.p = ANY(st.mine) THEN false
        ELSE pg_try_advisory_lock(hashtext(@key), (@n::int << 16) | c.p) END
      LIMIT CASE WHEN cardinality(st.mine) >= @n::int / st.members AND st.fewest < @n::int / st.members THEN 0
        ELSE greatest((@n::int + st.members - 1) / st.members - cardinality(st.mine), 0) END) x), '{}')
FROM (
  WITH l AS (SELECT pid, mode, granted, objsubid, classid, objid::bigint AS objid FROM pg_locks
      WHERE locktype = 'advisory' AND database = (SELECT oid FROM pg_database WHERE datname = current_database())),
    app AS (SELECT * FROM l WHERE objsubid = 1
      AND classid = ((hashtext(@key)::bigint >> 32) & 4294967295)::oid
      AND objid = hashtext(@key)::bigint & 4294967295),
    mine AS (SELECT * FROM l WHERE granted AND objsubid = 2 AND classid = (hashtext(@key)::bigint & 4294967295)::oid
      AND objid <> 4294967295),
    marks AS (SELECT DISTINCT pid FROM mine WHERE objid & 65535 = 65535 AND objid >> 16 = @n::int
      UNION SELECT pg_backend_pid()),
    parts AS (SELECT pid, (objid >> 16)::int AS n, (objid & 65535)::int AS p FROM mine WHERE objid & 65535 <> 65535)
  SELECT (SELECT count(*)::int FROM marks) AS members,
    (SELECT min(n) FROM parts WHERE n <> @n::int) AS foreign_n,
    EXISTS (SELECT 1 FROM app WHERE NOT granted AND mode = 'ExclusiveLock') AS waiter,
    (SELECT coalesce(min(x.c), 0)::int FROM (SELECT m.pid, count(pp.p) AS c FROM marks m
      LEFT JOIN parts pp ON pp.pid = m.pid AND pp.n = @n::int GROUP BY m.pid) x) AS fewest,
    (SELECT coalesce(array_agg(p), '{}') FROM parts WHERE n = @n::int AND pid <> pg_backend_pid()) AS taken,
    (SELECT coalesce(array_agg(p ORDER BY p), '{}') FROM parts WHERE n = @n::int AND pid = pg_backend_pid()) AS mine
  OFFSET 0) st`)

// releasePartitionsSQL lets go of the partitions @release of @n, and of the
// member mark too when @leave; false if this session did not hold one of them.
// It lets go of nothing unless it runs on the membership's backend @pid; its
// second column says where it ran.
var releasePartitionsSQL = numbered(electionMark + `SELECT CASE WHEN pg_backend_pid() = @pid::int THEN
    (NOT @leave::bool OR pg_advisory_unlock_shared(hashtext(@key), (@n::int << 16) | 65535))
      AND coalesce(bool_and(pg_advisory_unlock(hashtext(@key), (@n::int << 16) | p)), true) END,
  pg_backend_pid()
FROM unnest(CASE WHEN pg_backend_pid() = @pid::int THEN @release::int[] END) p`)

// partitionState is what a member learned at rebalanceSQL.
type partitionState struct {
	members  int  // members running with this N: this one among them
	foreignN int  // 0, or the count of partitions held with another N
	waiter   bool // an exclusive request waits for the app's key
	fewest   int  // the fewest partitions a member holds
	held     []int
	excluded bool // (join) an exclusive holder keeps this replica out
}

// rebalanceStatement takes the configuration lock and runs rebalanceSQL, in
// one round trip and one transaction.
func rebalanceStatement(ctx context.Context, db querier, key string, n, start int, pid uint32) (partitionState, error) {
	var st partitionState
	var foreign *int32
	var held []int32
	var ran uint32
	b := &pgx.Batch{}
	b.Queue(partitionConfigSQL, key)
	b.Queue(rebalanceSQL.sql, rebalanceSQL.args(map[string]any{"key": key, "n": n, "start": start, "pid": pid})...).
		QueryRow(func(row pgx.Row) error {
			return row.Scan(&ran, &st.members, &foreign, &st.waiter, &st.fewest, &held)
		})
	if err := db.SendBatch(ctx, b).Close(); err != nil {
		return partitionState{}, err
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

// releasePartitionsStatement releases the partitions release of n, and the
// member mark when leave.
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

// markStatement takes the member mark of n.
func markStatement(ctx context.Context, db querier, key string, n int, pid uint32) (bool, error) {
	var ok *bool
	var ran uint32
	err := db.QueryRow(ctx, markSQL, key, n, pid).Scan(&ok, &ran)
	switch {
	case err != nil:
		return false, err
	case ran != pid:
		return false, sessionMoved("the member mark", pid, ran)
	}
	return ok != nil && *ok, nil
}
