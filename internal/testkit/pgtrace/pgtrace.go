// Package pgtrace is a pgx tracer that counts the statements and connections
// of a pool: the tests that bound a relay's round trips (internal/loop's idle
// cost) and the measuring tools (internal/tools/benchkit) share it.
package pgtrace

import (
	"context"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
)

// Tracer is a pgx tracer that counts what a pool's connections send:
// queries, batches and prepares, and the connections the pool opens. Each
// query and each batch is one round trip (a cached prepared statement is one
// Bind/Execute/Sync). OnQuery, if set, is called at the start of every query,
// OnBatch at the start of every batch.
type Tracer struct {
	Queries, Batches, Prepares, Connects atomic.Int64

	OnQuery func(pgx.TraceQueryStartData)
	OnBatch func()
}

// Statements is how many queries and batches the pool sent.
func (t *Tracer) Statements() int64 { return t.Queries.Load() + t.Batches.Load() }

func (t *Tracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	t.Queries.Add(1)
	if t.OnQuery != nil {
		t.OnQuery(d)
	}
	return ctx
}
func (t *Tracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}
func (t *Tracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	t.Batches.Add(1)
	if t.OnBatch != nil {
		t.OnBatch()
	}
	return ctx
}
func (t *Tracer) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (t *Tracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}
func (t *Tracer) TracePrepareStart(ctx context.Context, _ *pgx.Conn, _ pgx.TracePrepareStartData) context.Context {
	t.Prepares.Add(1)
	return ctx
}
func (t *Tracer) TracePrepareEnd(context.Context, *pgx.Conn, pgx.TracePrepareEndData) {}
func (t *Tracer) TraceConnectStart(ctx context.Context, _ pgx.TraceConnectStartData) context.Context {
	t.Connects.Add(1)
	return ctx
}
func (t *Tracer) TraceConnectEnd(context.Context, pgx.TraceConnectEndData) {}
