package relay

import (
	"context"

	"github.com/xadm/relay/internal/store"
)

// This file is which of the relay's partial indexes (schema.sql) a table
// lacks, as Admin's Overview (relayctl status, the console) shows it; the
// finding, and the relay's one warning before its first pass, are
// internal/store's (indexes.go, outbox.go).

// MissingIndex is an index of [SchemaSQL] that the table lacks.
type MissingIndex struct {
	Name      string // its name in SchemaSQL
	Purpose   string // what the pass loses without it
	Statement string // SchemaSQL's statement that adds it (CONCURRENTLY is up to the operator)
}

// missingIndexes reads table's indexes and returns those of schema.sql it
// lacks (store.MissingIndexes).
func missingIndexes(ctx context.Context, db store.Querier, table string) ([]MissingIndex, error) {
	ms, err := store.MissingIndexes(ctx, db, table)
	if err != nil || ms == nil {
		return nil, err
	}
	out := make([]MissingIndex, len(ms))
	for i, m := range ms {
		out[i] = MissingIndex(m)
	}
	return out, nil
}
