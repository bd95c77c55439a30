package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/xadm/relay"
	"github.com/xadm/relay/internal/tools/benchkit"
)

// The grouped ceiling (ceiling-g100, ceiling-g1000): the relay's own grouped
// statements — its select of a batch and its grouped SENT update, captured from
// a relay by a tracer, so that they are exactly what it sends — replayed by
// plain pgx in a loop, with no relay in between. Like the engine, it selects
// the next batch past the last one on one connection while the last one's
// update runs on another. The gap between a gN drain and its ceiling is the
// relay's own cost; the ceiling itself is the server's.

// grouped are the statements captured from a relay's pass.
type grouped struct {
	selectSQL  string
	selectArgs []any
	after      int // the index in selectArgs of the one lane's cursor, the id its select starts after
	updateSQL  string
	genericSQL string // sent before each select, in its round trip: its generic plan (sql/pass.sql, genericPlans)
}

// captureTracer keeps the first select of a batch and the first grouped update
// a pool sends.
type captureTracer struct {
	mu sync.Mutex
	g  grouped
}

func (t *captureTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.g.updateSQL == "" && strings.HasPrefix(d.SQL, "UPDATE") && strings.Contains(d.SQL, "RETURNING") {
		t.g.updateSQL = d.SQL
	}
	return ctx
}

func (t *captureTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (t *captureTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

func (t *captureTracer) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.g.genericSQL == "" && strings.Contains(d.SQL, "plan_cache_mode") {
		t.g.genericSQL = d.SQL
	}
	if t.g.selectSQL != "" || !strings.Contains(d.SQL, "WITH g AS") {
		return
	}
	t.g.selectSQL, t.g.selectArgs, t.g.after = d.SQL, d.Args, -1
	for i, a := range d.Args {
		if v, ok := a.([]int64); ok && len(v) == 1 && v[0] == math.MinInt64 {
			t.g.after = i // a lane's cursor, at the start of the pass
		}
	}
}

func (t *captureTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

// captureGrouped runs one pass of a relay with GroupOutcomes and BatchSize n
// on a small table and returns the statements it sent.
func captureGrouped(ctx context.Context, url string, admin *pgxpool.Pool, n int) (grouped, error) {
	if err := freshTable(ctx, admin, benchTable, 2*n, "PENDING"); err != nil {
		return grouped{}, err
	}
	tr := &captureTracer{}
	pool, err := benchkit.Pool(ctx, url, "relaybench", 4, benchkit.Traced(tr))
	if err != nil {
		return grouped{}, err
	}
	defer pool.Close()
	cfg := relay.DefaultConfig()
	cfg.AppName, cfg.Table = benchApp, benchTable
	cfg.BatchSize, cfg.GroupOutcomes = n, n
	cfg.Logger = slog.New(slog.DiscardHandler)
	r, err := relay.New(pool, cfg, sender{})
	if err != nil {
		return grouped{}, err
	}
	if _, err := r.Run(ctx); err != nil {
		return grouped{}, err
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if tr.g.selectSQL == "" || tr.g.updateSQL == "" || tr.g.genericSQL == "" || tr.g.after < 0 {
		return grouped{}, errors.New("relaybench: the relay's grouped statements were not captured")
	}
	return tr.g, nil
}

// rawGrouped drains the table's n rows with the captured statements: one
// connection selects batch after batch past the last id, another updates each.
func rawGrouped(ctx context.Context, url string, g grouped, n int) (float64, error) {
	pool, err := benchkit.Pool(ctx, url, "relaybench", 2)
	if err != nil {
		return 0, err
	}
	defer pool.Close()
	batches := make(chan []int64, 1)
	var updated int
	var updateErr error
	done := make(chan struct{})
	start := time.Now()
	go func() {
		defer close(done)
		for ids := range batches {
			if updateErr != nil {
				continue
			}
			rows, err := pool.Query(ctx, g.updateSQL, ids)
			if err == nil {
				for rows.Next() {
					updated++
				}
				rows.Close()
				err = rows.Err()
			}
			updateErr = err
		}
	}()
	// The captured select is the pass's first, which starts an epoch: its
	// rows count as written before the epoch began (sql/pass.sql), as the
	// relay's drain's rows do at its later selects; none is probed.
	args := append([]any(nil), g.selectArgs...)
	var selectErr error
	for {
		// As the relay sends it: in one round trip after the statement that
		// makes it run on its generic plan.
		b := &pgx.Batch{}
		b.Queue(g.genericSQL)
		b.Queue(g.selectSQL, args...)
		br := pool.SendBatch(ctx, b)
		if _, err := br.Exec(); err != nil {
			selectErr = errors.Join(err, br.Close())
			break
		}
		rows, err := br.Query()
		if err != nil {
			selectErr = errors.Join(err, br.Close())
			break
		}
		var ids []int64
		for rows.Next() {
			vals, err := rows.Values()
			if err != nil {
				selectErr = err
				break
			}
			ids = append(ids, vals[0].(int64))
		}
		rows.Close()
		if selectErr = errors.Join(selectErr, rows.Err(), br.Close()); selectErr != nil || len(ids) == 0 {
			break
		}
		args[g.after] = []int64{ids[len(ids)-1]}
		batches <- ids
	}
	close(batches)
	<-done
	elapsed := time.Since(start)
	if err := errors.Join(selectErr, updateErr); err != nil {
		return 0, err
	}
	if updated != n {
		return 0, fmt.Errorf("relaybench: the grouped ceiling updated %d rows of %d", updated, n)
	}
	return float64(n) / elapsed.Seconds(), nil
}
