package store

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// This file is the outbox as a pass reads and writes it (internal/pass's
// Outbox): the select of a batch with its retry, the table learned before the
// first pass and again when an outcome did not fit it, the one warning of the
// indexes it lacks, the outcomes' writes, and the pooled connections they are
// written on. The relay builds one, in New, and hands it to the pass: a
// message's path goes from the pass to here without a return to the root.

// fetchTimeout bounds the select of a batch, connection included, so an
// unreachable database fails the pass instead of hanging the loop; and the
// reading of the table's definition before the first pass.
const fetchTimeout = 30 * time.Second

// Query is what one select of a pass asks for (sql/pass.sql, fetch): which
// lanes, from where, and what holds a key's later rows back. The Outbox adds
// the relay's bounds (MaxAttempts, BatchSize, BatchBytes) and what it learned
// of the table.
type Query struct {
	Preflight bool // the pass's first: ask whether the server is writable
	// StartEpoch starts an epoch: every lane from the start, and the table's
	// highest id read first (Batch.Epoch). Epoch is the current one's.
	StartEpoch bool
	Epoch      int64
	Parts      []int // only rows of these partitions; nil: all
	// Types are the lanes to select, each past its After, at most its Width
	// rows (a probing lane's is one).
	Types []string
	After []int64
	Width []int32
	// All are the relay's types, whose older live rows of a key hold back
	// its later ones; Later those that cannot send in this pass.
	All, Later []string
	// Keyed says the table has the key index (each lane its share of the
	// batch, rows probed by key).
	Keyed bool
}

// OutboxConfig is what an Outbox reads of the relay's configuration.
type OutboxConfig struct {
	Table       string // as configured, for the operator's messages
	MaxAttempts int
	BatchSize   int
	BatchBytes  int
	Partitions  int // Config.Partitions: a select of some partitions names them of this many
	Logger      *slog.Logger
	// Yielded are the types this relay yields to another app now (decision
	// 0043): every select leaves them out. nil: none.
	Yielded func() []string
}

// Conn is a pooled connection a pass holds for a while (*pgxpool.Conn):
// the outcomes of a worker's sends are written on it.
type Conn interface {
	Querier
	Release()
	Conn() *pgx.Conn
}

// Outbox is the relay's table as a pass reads and writes it, over its pool.
// It is safe for concurrent use.
type Outbox struct {
	pool *pgxpool.Pool
	t    *Table
	cfg  OutboxConfig

	mu             sync.Mutex
	info           TableInfo // what Learn learned
	learned        bool      // info holds; false: the next Learn reads the table again
	indexesChecked bool      // the missing indexes were looked for (once)
}

// NewOutbox returns the outbox of table t, on pool.
func NewOutbox(pool *pgxpool.Pool, t *Table, cfg OutboxConfig) *Outbox {
	return &Outbox{pool: pool, t: t, cfg: cfg}
}

// Fetch selects one batch, outside any transaction, on a connection it takes
// for the select alone. A connection that died in a failover fails its first
// statement: the select, which changes nothing, is tried once more on another.
func (o *Outbox) Fetch(ctx context.Context, q Query) (Batch, error) {
	fctx, cancel := context.WithTimeout(ctx, fetchTimeout)
	defer cancel()
	table := o.Info()
	q = o.deliverable(q)
	if len(q.Types) == 0 {
		// Every type asked for is another app's now. An epoch this starts
		// probes every row (decision 0041): nothing says which were drawn.
		return Batch{Epoch: math.MinInt64}, nil
	}
	args := FetchArgs{
		MaxAttempts: o.cfg.MaxAttempts, Types: q.Types, After: q.After, Width: q.Width, All: q.All, Later: q.Later,
		Epoch: q.Epoch, StartEpoch: q.StartEpoch, Keyed: q.Keyed, Limit: o.cfg.BatchSize, MaxBytes: o.cfg.BatchBytes,
		Preflight: q.Preflight, Source: table.Qualified, Headers: table.Headers,
	}
	if q.Parts != nil {
		args.Partitions, args.Parts = o.cfg.Partitions, q.Parts
	}
	once := func() (Batch, error) {
		c, err := Acquire(fctx, o.pool, "select a batch")
		if err != nil {
			return Batch{}, err
		}
		defer c.Release()
		return o.t.Fetch(fctx, c, args)
	}
	f, err := once()
	if err != nil && ConnectionFailed(err) && fctx.Err() == nil {
		f, err = once()
	}
	if err == nil && f.HeadersAdded {
		// The table was given the headers column since the relay learnt it:
		// learn it again, and select again, with the headers.
		o.Relearn()
		if err = o.Learn(fctx); err == nil {
			args.Headers = o.Info().Headers
			f, err = once()
		}
	}
	if err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (%w)", context.Cause(ctx), err)
		}
		return Batch{}, fmt.Errorf("relay: select a batch from %s: %w", o.cfg.Table, err)
	}
	return f, nil
}

// deliverable is q without the types yielded to another app: they join the
// types that cannot send in this pass, whose older live rows of a key hold its
// later ones back (decision 0041), when the table has the key index that
// check needs.
func (o *Outbox) deliverable(q Query) Query {
	if o.cfg.Yielded == nil {
		return q
	}
	ys := o.cfg.Yielded()
	if len(ys) == 0 {
		return q
	}
	d := q
	d.Types, d.After, d.Width = nil, nil, nil
	for i, t := range q.Types {
		if !slices.Contains(ys, t) {
			d.Types, d.After, d.Width = append(d.Types, t), append(d.After, q.After[i]), append(d.Width, q.Width[i])
		}
	}
	if q.Keyed {
		d.Later = slices.Clone(q.Later)
		for _, y := range ys {
			if !slices.Contains(d.Later, y) {
				d.Later = append(d.Later, y)
			}
		}
	}
	return d
}

// Learn learns the table before the first pass, and again after Relearn: its
// schema-qualified name, the width of last_error, its optional columns and
// indexes (TableInfo); it refuses a role that lacks a grant the pass needs.
// The first time, it says at WARN which of the relay's indexes the table
// lacks, and whether its id's sequence caches ids.
func (o *Outbox) Learn(ctx context.Context) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.learned {
		return nil
	}
	pctx, cancel := context.WithTimeout(ctx, fetchTimeout)
	defer cancel()
	c, err := Acquire(pctx, o.pool, "read the table's definition")
	if err != nil {
		return err
	}
	defer c.Release()
	info, err := o.t.Probe(pctx, c)
	if err != nil {
		return fmt.Errorf("relay: %w", err)
	}
	if err := CheckGrants(pctx, c, info.Qualified); err != nil {
		return err
	}
	o.info, o.learned = info, true
	if !o.indexesChecked {
		o.indexesChecked = true
		o.warnMissingIndexes(pctx, c)
		if info.IDCache > 1 {
			o.cfg.Logger.LogAttrs(pctx, slog.LevelWarn, "relay: the sequence of the table's id caches ids: each session draws a block of its own, "+
				"so two messages of one key can get ids in the other order than their commits, and be delivered so; "+
				"set its CACHE to 1 (ALTER SEQUENCE ... CACHE 1) to keep each key's order (decision 0041)",
				slog.String("table", o.cfg.Table), slog.Int64("cache", info.IDCache))
		}
	}
	return nil
}

// warnMissingIndexes says once, at WARN, which of the relay's partial
// indexes the table lacks (indexes.go), with the statements that add them.
func (o *Outbox) warnMissingIndexes(ctx context.Context, db Querier) {
	missing, err := MissingIndexes(ctx, db, o.cfg.Table)
	if err != nil {
		o.cfg.Logger.LogAttrs(ctx, slog.LevelDebug, "relay: could not read the table's indexes", slog.String("error", err.Error()))
		return
	}
	if len(missing) == 0 {
		return
	}
	var names, stmts []string
	for _, m := range missing {
		names = append(names, m.Name)
		stmts = append(stmts, m.Statement)
	}
	o.cfg.Logger.LogAttrs(ctx, slog.LevelWarn, "relay: the table lacks indexes the pass relies on: each pass reads past the SENT, dead and "+
		"other apps' rows, which costs more as they accumulate; add them (CREATE INDEX CONCURRENTLY on a busy table)",
		slog.String("table", o.cfg.Table), slog.Any("missing", names), slog.String("sql", strings.Join(stmts, "\n")))
}

// Info is what Learn learned (the zero TableInfo before it did).
func (o *Outbox) Info() TableInfo {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.info
}

// Keyed says the table has the key index, as Learn learned it.
func (o *Outbox) Keyed() bool { return o.Info().KeyIndex }

// ErrWidth is how many characters last_error holds; 0: as many as
// LastErrorMax.
func (o *Outbox) ErrWidth() int { return o.Info().ErrWidth }

// Relearn makes the next Learn read the table again (a value did not fit a
// column whose width changed; the headers column was added).
func (o *Outbox) Relearn() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.learned = false
}

// Acquire takes the connection a pass's outcomes are written on, within
// AcquireTimeout (ErrPoolExhausted).
func (o *Outbox) Acquire(ctx context.Context) (Conn, error) {
	c, err := Acquire(ctx, o.pool, "record an outcome")
	if err != nil {
		return nil, err // not a typed nil
	}
	return c, nil
}

// Starved reports whether the pool has no idle connection and may open no more.
func (o *Outbox) Starved() bool {
	st := o.pool.Stat()
	return st.IdleConns() == 0 && st.TotalConns() >= st.MaxConns()
}

// Record writes outcomes: one in its own short transaction, several in one
// statement, each fenced on the state the pass read. It returns the ids of
// the rows that had moved on and were left alone.
func (o *Outbox) Record(ctx context.Context, db Querier, outs []Update) (stale map[int64]bool, err error) {
	return o.t.Record(ctx, db, outs)
}

// RecordEach writes each outcome in its own transaction, in one round trip;
// failed are the rows whose own statement failed.
func (o *Outbox) RecordEach(ctx context.Context, c Conn, outs []Update) (stale map[int64]bool, failed map[int64]error, err error) {
	return o.t.RecordEach(ctx, c, outs)
}

// States reads the current state of rows by id.
func (o *Outbox) States(ctx context.Context, db Querier, ids []int64) (map[int64]State, error) {
	return o.t.States(ctx, db, ids)
}
