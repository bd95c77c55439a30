package store

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/xadm/relay/internal/headers"
)

// The pass's reads; their statements are in sql/pass.sql, and those of the
// outcomes in sql/outcomes.sql (outcomes.go).

// execer and querier are what the statements run on (internal/store).
type (
	execer  = Execer
	querier = Querier
)

// inlinePayloadMax is the stored size (pg_column_size, perhaps compressed) up
// to which a payload comes with its row; a larger one is loaded on its own,
// after its size was checked, so a batch never holds more than BatchBytes.
const inlinePayloadMax = 8 << 10

// Table holds the statements of one table, built once by NewTable.
type Table struct {
	table string // quoted
	name  string // as configured, for to_regclass
	// fetchSQL is the select, by whether it is of this replica's partitions
	// only, reads the optional headers column, has the key index, and takes
	// one lane's rows only.
	fetchSQL     [2][2][2][2]NamedSQL
	epochSQL     string
	pollSQL      NamedSQL
	partWorkSQL  NamedSQL // the partitioned member's check for work, in its rebalance's round trip
	payloadSQL   string
	sentSQL      string
	errorSQL     string
	groupSQL     string
	groupSentSQL string
	stateSQL     string
	probeSQL     string
	backoff      float64 // seconds; 0 = no backoff
	backoffMax   float64

	headersAddedSQL string
}

// preflightSQL is sent with the first select of a pass (sql/pass.sql).
var preflightSQL = Statements.Positional("preflight", Data{})

// genericPlansSQL is sent first with every select (sql/pass.sql).
var genericPlansSQL = Statements.Positional("genericPlans", Data{})

// NewTable builds the statements of the pass and its outcomes for
// table, once: the select with and without partitions, the idle poll, the
// fenced outcomes with or without AsyncCommit.
func NewTable(table string, backoff, backoffMax time.Duration, asyncCommit bool) (*Table, error) {
	id, err := ParseTable(table)
	if err != nil {
		return nil, err
	}
	t := id.Sanitize()
	r := &Table{table: t, name: t, backoff: backoff.Seconds(), backoffMax: backoffMax.Seconds()}
	d := Data{Table: t, Backoff: r.backoff != 0, Async: asyncCommit, InlinePayloadMax: inlinePayloadMax}
	for _, parts := range []bool{false, true} {
		for _, hdrs := range []bool{false, true} {
			for _, keyed := range []bool{false, true} {
				for _, one := range []bool{false, true} {
					v := d
					v.Partitioned, v.Headers, v.Keyed, v.OneLane = parts, hdrs, keyed, one
					r.fetchSQL[b2i(parts)][b2i(hdrs)][b2i(keyed)][b2i(one)] = Statements.Named("fetch", v)
				}
			}
		}
	}
	part := d
	part.Partitioned = true
	r.headersAddedSQL = Statements.Positional("headersAdded", d)
	r.epochSQL = Statements.Positional("epoch", d)
	r.pollSQL = Statements.Named("poll", d)
	r.partWorkSQL = Statements.Named("partitionWork", part)
	r.payloadSQL = Statements.Positional("payload", d)
	r.probeSQL = Statements.Positional("probe", d)
	r.sentSQL = Statements.Positional("outcomeSent", d)
	r.errorSQL = Statements.Positional("outcomeError", d)
	r.groupSQL = Statements.Positional("outcomeGroup", d)
	r.groupSentSQL = Statements.Positional("outcomeGroupSent", d)
	r.stateSQL = Statements.Positional("rowStates", d)
	return r, nil
}

// FetchArgs are what one select asks for.
type FetchArgs struct {
	MaxAttempts int
	// Types are the lanes the select takes rows of, each past its After, at
	// most its Width (nil: Limit each).
	Types []string
	After []int64
	Width []int32
	// All are the relay's types: an older live row of a key of any of them
	// holds its later rows back (Row.Held); Later are those of them that cannot
	// send in this pass (paused, or failed in it).
	All, Later []string
	// Epoch is the highest id when the epoch began: a row above it is probed
	// for an older row of its key that committed late. StartEpoch has the
	// select start one (every lane from the start) and read it (Batch.Epoch).
	Epoch      int64
	StartEpoch bool
	// Keyed says the table has the key index: each lane has its share of the
	// batch, and rows are probed by key (Row.Held); without it, the batch is
	// the lowest ids of all lanes.
	Keyed      bool
	Limit      int
	MaxBytes   int
	Partitions int    // Config.Partitions, when parts is set
	Parts      []int  // only rows of these partitions; nil: every row
	Preflight  bool   // the pass's first select: ask whether the server is writable
	Headers    bool   // the table has the headers column: read it
	Source     string // the schema-qualified table, for Message.IdempotencyKey
}

// fetch selects one batch, outside any transaction, and loads its large
// payloads within maxBytes: the batch is cut short before the row that would
// exceed it (the rest wait for the next batch), and a row whose payload alone
// exceeds it comes back marked bad.
func (r *Table) Fetch(ctx context.Context, db querier, a FetchArgs) (Batch, error) {
	var f Batch
	sql := r.fetchSQL[b2i(a.Parts != nil)][b2i(a.Headers)][b2i(a.Keyed)][b2i(len(a.Types) == 1)]
	limit := a.Limit
	if a.Keyed {
		limit = max(limit, len(a.Types)) // a turn for every lane
	}
	epoch := a.Epoch
	if a.StartEpoch {
		epoch = math.MaxInt64 // a select from the start has no row behind a cursor
	}
	later := a.Later
	if later == nil {
		later = []string{}
	}
	width := a.Width
	if width == nil {
		width = make([]int32, len(a.Types))
		for i := range width {
			width[i] = int32(limit)
		}
	}
	args := sql.Args(map[string]any{"max": a.MaxAttempts, "types": a.Types, "after": a.After, "all": a.All, "later": later,
		"epoch": epoch, "limit": limit, "width": width, "backoff": r.backoff, "cap": r.backoffMax, "n": a.Partitions, "parts": a.Parts})
	b := &pgx.Batch{}
	b.Queue(genericPlansSQL)
	if a.Preflight {
		b.Queue(preflightSQL).QueryRow(func(row pgx.Row) error { return row.Scan(&f.ReadOnly, &f.Now) })
		if !a.Headers {
			b.Queue(r.headersAddedSQL, r.name).QueryRow(func(row pgx.Row) error { return row.Scan(&f.HeadersAdded) })
		}
	}
	if a.StartEpoch {
		b.Queue(r.epochSQL).QueryRow(func(row pgx.Row) error { return row.Scan(&f.Epoch) })
	}
	b.Queue(sql.sql, args...).Query(func(rows pgx.Rows) error {
		f.Rows = make([]Row, 0, min(limit, 1024))
		budget := a.MaxBytes
		// The scan's targets, once per batch: handed to Scan as pointers, they
		// live on the heap, and a row's own copy goes into f.rows (pgx gives
		// each row's bytes a slice of their own).
		var (
			m       Row
			typ     pgtype.DriverBytes // valid until the next row: interned
			status  pgtype.DriverBytes
			texts   = interned{}
			key     pgtype.Text
			created pgtype.Timestamptz
			stored  pgtype.Int4
			payload []byte
			hdrs    []byte
			held    int32
			more    bool
		)
		dest := []any{&m.ID, &typ, &key, &status, &m.ReadAttempts, &created, &held, &more, &stored, &payload, &hdrs}
		if !a.Headers {
			dest = dest[:len(dest)-1]
		}
		for rows.Next() {
			m, created, hdrs = Row{}, pgtype.Timestamptz{}, nil
			if err := rows.Scan(dest...); err != nil {
				return err
			}
			m.Type, m.Source, m.Key, m.Held = texts.of(typ), a.Source, key.String, Held(held)
			m.Status = pgtype.Text{String: texts.of(status), Valid: status != nil}
			if more && (len(f.More) == 0 || f.More[len(f.More)-1] != m.Type) {
				f.More = append(f.More, m.Type) // compacted below
			}
			m.Attempts = int(m.ReadAttempts.Int64) // 0 when NULL
			if created.Valid && created.InfinityModifier == pgtype.Finite {
				m.CreatedAt = created.Time
			}
			var headersErr error
			m.Headers, headersErr = headers.Decode(hdrs)
			switch {
			case !key.Valid:
				m.Bad = "natural_key is NULL: a message needs its natural key"
			case headersErr != nil:
				m.Bad = headersErr.Error()
			case !stored.Valid:
				m.Bad = "payload is NULL"
			case payload == nil:
				m.Large, m.Size = true, int(stored.Int32) // loaded below, within the budget
			default:
				m.Payload, m.Size = payload, len(payload)
				if m.Size > a.MaxBytes {
					m.Bad, m.Payload = tooLarge(m.Size, a.MaxBytes), nil
				}
			}
			if m.Bad == "" && !m.Large {
				if budget -= m.Size; budget < 0 && len(f.Rows) > 0 {
					// Read no further: this row and the rest wait for the next batch.
					f.Full, f.Cut = true, true
					break
				}
			}
			f.Rows = append(f.Rows, m)
		}
		if !a.Keyed && len(f.Rows) >= limit {
			// The lowest ids of all lanes filled the batch: a lane that got
			// none of it may have rows past them.
			f.More = append(f.More, a.Types...)
		}
		slices.Sort(f.More)
		f.More = slices.Compact(f.More)
		f.Full = f.Full || len(f.More) > 0
		return rows.Err()
	})
	if err := db.SendBatch(ctx, b).Close(); err != nil {
		return Batch{}, err
	}
	return f, r.LoadLarge(ctx, db, &f, a.MaxBytes)
}

// loadLarge loads the payloads the select left out, in id order, while the
// batch's payloads stay within maxBytes; it cuts the batch before the first
// row that would exceed it, without reading that row's payload.
func (r *Table) LoadLarge(ctx context.Context, db querier, f *Batch, maxBytes int) error {
	held := 0
	kept := f.Rows[:0]
	for i := range f.Rows {
		m := f.Rows[i]
		if m.Large {
			room := maxBytes // the first row may take the whole budget
			if len(kept) > 0 {
				room = maxBytes - held
			}
			n, payload, found, err := r.LoadPayload(ctx, db, m.ID, room)
			switch {
			case err != nil:
				return err
			case !found:
				continue // deleted since the select: nothing to deliver
			case n == nil:
				m.Bad = "payload is NULL"
			case int(*n) > maxBytes:
				m.Bad = tooLarge(int(*n), maxBytes)
			case payload == nil && int(*n) > room:
				f.Rows, f.Full, f.Cut = kept, true, true // this row and the rest wait for the next batch
				return nil
			case payload == nil:
				m.Payload, m.Size = []byte{}, 0
			default:
				m.Payload, m.Size = payload, len(payload)
			}
			m.Large = false
		}
		held += len(m.Payload)
		kept = append(kept, m)
	}
	f.Rows = kept
	return nil
}

// payloadChunkBytes is how much of a large payload one row of payloadSQL
// carries: what pgx buffers beside the payload it assembles.
const payloadChunkBytes = 1 << 20

// loadPayload reads the payload of row id, in chunks, if it is at most room
// bytes: n is its size (nil: NULL), payload is nil when it is larger than room
// (or NULL), found is false when the row is gone.
func (r *Table) LoadPayload(ctx context.Context, db querier, id int64, room int) (n *int32, payload []byte, found bool, err error) {
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
// comment, which pg_stat_activity.query must go on showing (internal/election).
func (r *Table) Poll(ctx context.Context, db querier, mark string, maxAttempts int, types []string, key string) (readOnly, won, work bool, pid uint32, err error) {
	args := r.pollSQL.Args(map[string]any{"max": maxAttempts, "types": types, "limit": 1, "after": int64(math.MinInt64),
		"backoff": r.backoff, "cap": r.backoffMax, "key": key})
	err = db.QueryRow(ctx, mark+r.pollSQL.sql, args...).Scan(&readOnly, &won, &work, &pid)
	return readOnly, won, work, pid, err
}

// partitionWork is the check, sent in a member's rebalance round trip, for
// rows to deliver in the partitions parts of n.
func (r *Table) PartitionWork(maxAttempts int, types []string, n int, parts []int) *WorkCheck {
	return &WorkCheck{sql: r.partWorkSQL.sql, args: r.partWorkSQL.Args(map[string]any{"max": maxAttempts, "types": types,
		"limit": 1, "after": int64(math.MinInt64), "backoff": r.backoff, "cap": r.backoffMax, "n": n, "parts": parts})}
}

// TableInfo is what the relay learns of its table before the first pass.
type TableInfo struct {
	Qualified string // "schema.table", as Message.IdempotencyKey names it
	ErrWidth  int    // characters last_error holds; 0: as many as lastErrorMax
	Headers   bool   // it has the optional headers column (a JVM-made table has not)
	KeyIndex  bool   // an index leads with (natural_key, id) over the live rows: selects may leave types out
	IDCache   int64  // the CACHE of the id's sequence (1 when it has none)
}

// interned holds one string per text that a batch's rows repeat (their
// types, their statuses), so that a row's costs no allocation of its own.
type interned map[string]string

// of is b's text, made once per batch.
func (in interned) of(b []byte) string {
	if s, ok := in[string(b)]; ok {
		return s
	}
	s := string(b)
	in[s] = s
	return s
}

// requiredColumns are the columns the pass reads and writes.
var requiredColumns = []string{"id", "direction", "type", "natural_key", "payload", "status", "attempts",
	"last_error", "created_at", "updated_at", "sent_at"}

// probe learns the table: that it exists with the columns the relay needs,
// its schema-qualified name, and the width of last_error.
func (r *Table) Probe(ctx context.Context, db querier) (TableInfo, error) {
	var schema, name string
	var columns []string
	var width int32
	var keyIndex bool
	var idCache int64
	err := db.QueryRow(ctx, r.probeSQL, r.table).Scan(&schema, &name, &columns, &width, &keyIndex, &idCache)
	if errors.Is(err, pgx.ErrNoRows) {
		return TableInfo{}, fmt.Errorf("table %s does not exist (as the search_path resolves it): create it with relay.CreateTable or relay.SchemaSQL", r.table)
	}
	if err != nil {
		return TableInfo{}, err
	}
	var missing []string
	for _, c := range requiredColumns {
		if !slices.Contains(columns, c) {
			missing = append(missing, c)
		}
	}
	if len(missing) > 0 {
		return TableInfo{}, fmt.Errorf("table %s.%s lacks the column(s) %s that the relay reads and writes (see relay.SchemaSQL)",
			schema, name, strings.Join(missing, ", "))
	}
	return TableInfo{Qualified: schema + "." + name, ErrWidth: int(width), Headers: slices.Contains(columns, headers.Column),
		KeyIndex: keyIndex, IDCache: idCache}, nil
}

// b2i is 1 for true, 0 for false: an index into the statements' variants.
func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// FetchSQL is the select of a batch of at most limit rows of types from the
// start, on a table with the key index, with its arguments, as a pass sends
// it (for EXPLAIN).
func (r *Table) FetchSQL(maxAttempts int, types []string, limit int) (string, []any) {
	q := r.fetchSQL[0][0][1][b2i(len(types) == 1)]
	after, width := make([]int64, len(types)), make([]int32, len(types))
	for i := range after {
		after[i], width[i] = math.MinInt64, int32(limit)
	}
	return q.sql, q.Args(map[string]any{"max": maxAttempts, "types": types, "after": after, "width": width, "all": types,
		"later": []string{}, "epoch": int64(math.MaxInt64), "limit": limit, "backoff": r.backoff, "cap": r.backoffMax})
}
