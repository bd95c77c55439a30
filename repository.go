package relay

import (
	"context"

	"github.com/jackc/pgx/v5"

	"github.com/xadm/relay/internal/pass"
	"github.com/xadm/relay/internal/store"
)

// This file is the outbox table as the relay sees it: its DDL (SchemaSQL,
// CreateTable), what a table made elsewhere must have, and the runner built
// once, in New, over internal/store's Outbox (the table as the pass reads and
// writes it).
//
// A table made by another migration (the JVM's: nullable columns, varchar,
// timestamp, no defaults, no indexes) works: the relay needs the columns of
// requiredColumns, reads every one as nullable, and learns the table's
// schema-qualified name, the width of last_error and its optional headers
// column before its first pass (internal/store, Probe). The indexes of
// SchemaSQL keep each pass on the live rows of its own types; a table that
// lacks them is drained all the same, and the relay says which it lacks
// (indexes.go).

// newRunner is the relay's pass runner, over senders by type.
func (r *Relay) newRunner(senders map[string]Sender) *pass.Runner {
	ss := make(map[string]pass.Sender, len(senders))
	for typ, s := range senders {
		ss[typ] = r.sender(s)
	}
	c := r.cfg
	return pass.New(pass.Config{
		Table: c.Table, BatchSize: c.BatchSize, MaxAttempts: c.MaxAttempts, GroupOutcomes: c.GroupOutcomes,
		PauseAfter: c.PauseAfter, Concurrency: c.Concurrency, Workers: r.workers(), SendTimeout: c.SendTimeout, Interval: c.Interval,
		PauseMax: c.PauseMax, StuckSendsMax: c.StuckSendsMax,
	}, r.types, pass.Deps{Outbox: r.outbox, Senders: ss, Logger: r.logger, Report: r.report})
}

// workers is how many workers a pass runs at most: Concurrency, unless the
// pool is too small to give each its connection next to the election's and
// the select's (New warns of it).
func (r *Relay) workers() int {
	return min(r.cfg.Concurrency, max(1, r.maxConns-2))
}

// SchemaSQL returns the outbox table's DDL for table (optionally schema-qualified),
// for adopters who keep it in their own migrations. It is idempotent.
func SchemaSQL(table string) (string, error) { return store.SchemaSQL(table) }

// Beginner starts a transaction: *pgxpool.Pool, *pgx.Conn and pgx.Tx satisfy it.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// CreateTable creates the outbox table and its indexes if they do not exist.
// Replicas may call it at the same time on start-up: it serialises them on a
// transaction-scoped advisory lock.
func CreateTable(ctx context.Context, db Beginner, table string) error {
	return store.CreateTable(ctx, db, table)
}
