package store

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// This file finds which of the relay's partial indexes (schema.sql) a table
// lacks: a table made by the JVM service, or by hand, has none, and a pass
// beside a large SENT, dead or foreign history then reads the whole table.
// The Outbox says so once, at WARN, before its first pass (outbox.go);
// Admin's Overview (relayctl status, the console) says so too
// (relay.MissingIndex).

// MissingIndex is an index of SchemaSQL that the table lacks
// (relay.MissingIndex).
type MissingIndex struct {
	Name      string // its name in SchemaSQL
	Purpose   string // what the pass loses without it
	Statement string // SchemaSQL's statement that adds it (CONCURRENTLY is up to the operator)
}

// relayIndex is one partial index of schema.sql: its name's suffix, its key
// columns, and what its predicate must name (an index under another name
// counts when it has the same columns and a predicate on that).
type relayIndex struct {
	suffix, purpose string
	columns         []string
	pred            string
}

var relayIndexes = []relayIndex{
	{"_outbox", "the live rows (PENDING and ERROR) apart from the SENT history", []string{"id"}, "status"},
	{"_outbox_pending", "each type's waiting rows apart from the other apps' backlog", []string{"type", "id"}, "status"},
	{"_outbox_error", "failed rows below the ceiling apart from the dead ones", []string{"type", "attempts", "id"}, "status"},
	{"_outbox_retry", "per-key order under RetryBackoff", []string{"natural_key", "id"}, "status"},
	// The failed rows' index does not stand for it: a paused type's waiting
	// rows must be found by key too.
	{"_outbox_key", "each key's live rows: while a type is paused, the other types' selects keep each key's order " +
		"(without it, a paused type's rows take the other types' places in each batch)", []string{"natural_key", "id"}, "PENDING"},
}

type tableIndex struct {
	Name  string   `json:"name"`
	Cols  []string `json:"cols"`
	Pred  string   `json:"pred"`
	Valid bool     `json:"valid"`
}

// MissingIndexes reads table's indexes and returns those of schema.sql it
// lacks. An index counts as present when it has SchemaSQL's name, or the same
// key columns in the same order with a predicate on status (a partial index
// of the live rows made under another name); an invalid one (a failed CREATE
// INDEX CONCURRENTLY) does not count.
func MissingIndexes(ctx context.Context, db Querier, table string) ([]MissingIndex, error) {
	id, err := ParseTable(table)
	if err != nil {
		return nil, err
	}
	doc, err := TableIndexesStatement(ctx, db, table)
	if err != nil {
		return nil, fmt.Errorf("read the indexes of %s: %w", table, err)
	}
	var have []tableIndex
	if err := json.Unmarshal(doc, &have); err != nil {
		return nil, fmt.Errorf("read the indexes of %s: %w", table, err)
	}
	stmts, err := indexStatements(table)
	if err != nil {
		return nil, err
	}
	name := id[len(id)-1]
	var missing []MissingIndex
	for _, want := range relayIndexes {
		wantName := strings.Trim(IndexName(name, want.suffix), `"`)
		found := slices.ContainsFunc(have, func(h tableIndex) bool {
			return h.Valid && (h.Name == wantName || slices.Equal(h.Cols, want.columns) && strings.Contains(h.Pred, want.pred))
		})
		if !found {
			missing = append(missing, MissingIndex{Name: wantName, Purpose: want.purpose, Statement: stmts[wantName]})
		}
	}
	return missing, nil
}

// indexstatements maps each index name of SchemaSQL(table) to its statement.
func indexStatements(table string) (map[string]string, error) {
	ddl, err := SchemaSQL(table)
	if err != nil {
		return nil, err
	}
	out := make(map[string]string)
	for stmt := range strings.SplitSeq(ddl, ";") {
		var lines []string
		for line := range strings.SplitSeq(stmt, "\n") {
			if t := strings.TrimSpace(line); t != "" && !strings.HasPrefix(t, "--") {
				lines = append(lines, t)
			}
		}
		s := strings.Join(lines, " ")
		at := strings.Index(s, "CREATE INDEX IF NOT EXISTS ") // perhaps inside a DO block: the statement alone
		if at < 0 {
			continue
		}
		s = s[at:]
		n, _, _ := strings.Cut(strings.TrimPrefix(s, "CREATE INDEX IF NOT EXISTS "), " ")
		out[strings.ReplaceAll(strings.Trim(n, `"`), `""`, `"`)] = s + ";"
	}
	return out, nil
}
