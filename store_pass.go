package relay

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// The pass's reads; their statements are in sql/pass.sql, and those of the
// outcomes in sql/outcomes.sql (store_outcomes.go).

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
	behind   bool        // an earlier failed row of its key lies behind the select's start
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
	partWorkSQL  namedSQL // the partitioned member's check for work, in its rebalance's round trip
	payloadSQL   string
	sentSQL      string
	errorSQL     string
	groupSQL     string
	groupSentSQL string
	stateSQL     string
	probeSQL     string
	backoff      float64 // seconds; 0 = no backoff
	backoffMax   float64

	// fetchSQL and fetchPartSQL, with the optional headers column
	fetchHeadersSQL, fetchPartHeadersSQL namedSQL
	headersAddedSQL                      string
}

// preflightSQL is sent with the first select of a pass (sql/pass.sql).
var preflightSQL = statements.positional("preflight", sqlData{})

// genericPlansSQL is sent first with every select (sql/pass.sql).
var genericPlansSQL = statements.positional("genericPlans", sqlData{})

// newRepository builds the statements of the pass and its outcomes for
// table, once: the select with and without partitions, the idle poll, the
// fenced outcomes with or without AsyncCommit.
func newRepository(table string, backoff time.Duration, asyncCommit bool) (*repository, error) {
	id, err := parseTable(table)
	if err != nil {
		return nil, err
	}
	t := id.Sanitize()
	r := &repository{table: t, name: t, backoff: backoff.Seconds(), backoffMax: retryBackoffMax.Seconds()}
	d := sqlData{Table: t, Backoff: r.backoff != 0, Async: asyncCommit, InlinePayloadMax: inlinePayloadMax}
	part := d
	part.Partitioned = true
	r.fetchSQL, r.fetchPartSQL = statements.named("fetch", d), statements.named("fetch", part)
	d.Headers, part.Headers = true, true
	r.fetchHeadersSQL, r.fetchPartHeadersSQL = statements.named("fetch", d), statements.named("fetch", part)
	d.Headers = false
	r.headersAddedSQL = statements.positional("headersAdded", d)
	r.pollSQL = statements.named("poll", d)
	part.Headers = false
	r.partWorkSQL = statements.named("partitionWork", part)
	r.payloadSQL = statements.positional("payload", d)
	r.probeSQL = statements.positional("probe", d)
	r.sentSQL = statements.positional("outcomeSent", d)
	r.errorSQL = statements.positional("outcomeError", d)
	r.groupSQL = statements.positional("outcomeGroup", d)
	r.groupSentSQL = statements.positional("outcomeGroupSent", d)
	r.stateSQL = statements.positional("rowStates", d)
	return r, nil
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
	headers     bool   // the table has the headers column: read it
	source      string // the schema-qualified table, for Message.IdempotencyKey
}

// fetched is one select's answer.
type fetched struct {
	rows     []row
	full     bool      // the select filled its limit, or was cut short by the byte bound: more may wait
	cut      bool      // the select was cut short by the byte bound (BatchBytes), before its limit
	readOnly bool      // the server cannot record an outcome: send nothing (preflight only)
	now      time.Time // the database's clock at the select (preflight only)

	headersAdded bool // the table has the headers column, which the select did not read (preflight only)
}

// fetch selects one batch, outside any transaction, and loads its large
// payloads within maxBytes: the batch is cut short before the row that would
// exceed it (the rest wait for the next batch), and a row whose payload alone
// exceeds it comes back marked bad.
func (r *repository) fetch(ctx context.Context, db querier, a fetchArgs) (fetched, error) {
	var f fetched
	sql := r.fetchSQL
	switch {
	case a.parts != nil && a.headers:
		sql = r.fetchPartHeadersSQL
	case a.parts != nil:
		sql = r.fetchPartSQL
	case a.headers:
		sql = r.fetchHeadersSQL
	}
	args := sql.args(map[string]any{"max": a.maxAttempts, "types": a.types, "limit": a.limit, "after": a.after,
		"backoff": r.backoff, "cap": r.backoffMax, "n": a.partitions, "parts": a.parts})
	b := &pgx.Batch{}
	b.Queue(genericPlansSQL)
	if a.preflight {
		b.Queue(preflightSQL).QueryRow(func(row pgx.Row) error { return row.Scan(&f.readOnly, &f.now) })
		if !a.headers {
			b.Queue(r.headersAddedSQL, r.name).QueryRow(func(row pgx.Row) error { return row.Scan(&f.headersAdded) })
		}
	}
	b.Queue(sql.sql, args...).Query(func(rows pgx.Rows) error {
		f.rows = make([]row, 0, min(a.limit, 1024))
		budget := a.maxBytes
		// The scan's targets, once per batch: handed to Scan as pointers, they
		// live on the heap, and a row's own copy goes into f.rows (pgx gives
		// each row's bytes a slice of their own).
		var (
			m       row
			typ     string
			key     pgtype.Text
			created pgtype.Timestamptz
			stored  pgtype.Int4
			payload []byte
			headers []byte
		)
		dest := []any{&m.ID, &typ, &key, &m.status, &m.attempts, &created, &m.behind, &stored, &payload, &headers}
		if !a.headers {
			dest = dest[:len(dest)-1]
		}
		for rows.Next() {
			m, created, headers = row{}, pgtype.Timestamptz{}, nil
			if err := rows.Scan(dest...); err != nil {
				return err
			}
			m.Type, m.source, m.Key = typ, a.source, key.String
			m.Attempts = int(m.attempts.Int64) // 0 when NULL
			if created.Valid && created.InfinityModifier == pgtype.Finite {
				m.CreatedAt = created.Time
			}
			var headersErr error
			m.Headers, headersErr = decodeHeaders(headers)
			switch {
			case !key.Valid:
				m.bad = "natural_key is NULL: a message needs its natural key"
			case headersErr != nil:
				m.bad = headersErr.Error()
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

// poll runs the idle poll (pollSQL) for the election key.
//
// mark starts the statement: on the relay's own session, the presence
// comment, which pg_stat_activity.query must go on showing (presence.go).
func (r *repository) poll(ctx context.Context, db querier, mark string, maxAttempts int, types []string, key string) (readOnly, won, work bool, pid uint32, err error) {
	args := r.pollSQL.args(map[string]any{"max": maxAttempts, "types": types, "limit": 1, "after": int64(math.MinInt64),
		"backoff": r.backoff, "cap": r.backoffMax, "key": key})
	err = db.QueryRow(ctx, mark+r.pollSQL.sql, args...).Scan(&readOnly, &won, &work, &pid)
	return readOnly, won, work, pid, err
}

// partitionWork is the check, sent in a member's rebalance round trip, for
// rows to deliver in the partitions parts of n.
func (r *repository) partitionWork(maxAttempts int, types []string, n int, parts []int) *workCheck {
	return &workCheck{sql: r.partWorkSQL.sql, args: r.partWorkSQL.args(map[string]any{"max": maxAttempts, "types": types,
		"limit": 1, "after": int64(math.MinInt64), "backoff": r.backoff, "cap": r.backoffMax, "n": n, "parts": parts})}
}

// tableInfo is what the relay learns of its table before the first pass.
type tableInfo struct {
	qualified string // "schema.table", as Message.IdempotencyKey names it
	errWidth  int    // characters last_error holds; 0: as many as lastErrorMax
	headers   bool   // it has the optional headers column (a JVM-made table has not)
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
	return tableInfo{qualified: schema + "." + name, errWidth: int(width), headers: slices.Contains(columns, headersColumn)}, nil
}
