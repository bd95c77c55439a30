package inbox

import (
	"context"
	"fmt"
	"hash/fnv"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/xadm/relay"
)

// identifierRE is what a part of Config.Table may be: a plain SQL identifier.
var identifierRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

// names are the inbox's objects, each quoted for SQL.
type names struct {
	table    string // the messages received
	keys     string // each key's last applied id
	received string // the index on received_at
}

// tableNames validates a possibly schema-qualified table name and derives the
// names of the inbox's objects from it, so that none is pasted into SQL as
// given.
func tableNames(table string) (names, error) {
	parts := strings.Split(table, ".")
	if len(parts) > 2 {
		return names{}, fmt.Errorf("table %q: want name or schema.name", table)
	}
	for _, p := range parts {
		if !identifierRE.MatchString(p) {
			return names{}, fmt.Errorf("table %q: %q is not an identifier of at most 63 letters, digits and underscores, starting with a letter or underscore", table, p)
		}
	}
	id := pgx.Identifier(parts)
	name := id[len(id)-1]
	keys := append(pgx.Identifier(nil), id...)
	keys[len(keys)-1] = derivedName(name, "_keys")
	return names{
		table:    id.Sanitize(),
		keys:     keys.Sanitize(),
		received: pgx.Identifier{derivedName(name, "_received_at")}.Sanitize(),
	}, nil
}

// derivedName is table+suffix. Past PostgreSQL's 63 bytes, the table's part
// is cut and a hash of the whole name keeps it apart from another long table
// with the same beginning.
func derivedName(table, suffix string) string {
	if len(table)+len(suffix) > 63 {
		h := fnv.New32a()
		h.Write([]byte(table))
		tag := fmt.Sprintf("_%08x", h.Sum32())
		table = table[:63-len(suffix)-len(tag)] + tag
	}
	return table + suffix
}

// SchemaSQL returns the DDL of the inbox's tables for table (optionally
// schema-qualified, as [Config.Table]), for adopters who keep it in their own
// migrations. It is idempotent.
func SchemaSQL(table string) (string, error) {
	n, err := tableNames(table)
	if err != nil {
		return "", fmt.Errorf("inbox: %w", err)
	}
	return schemaSQL(n), nil
}

// CreateTable creates the inbox's tables for table (as [Config.Table]) and
// their index if they do not exist. Replicas may call it at the same time on
// start-up: it serialises them on a transaction-scoped advisory lock.
func CreateTable(ctx context.Context, db relay.Beginner, table string) error {
	n, err := tableNames(table)
	if err != nil {
		return fmt.Errorf("inbox: %w", err)
	}
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, schemaLockSQL, "relay_inbox_schema:"+table); err != nil {
			return fmt.Errorf("inbox: create table %s: %w", table, err)
		}
		if _, err := tx.Exec(ctx, schemaSQL(n)); err != nil {
			return fmt.Errorf("inbox: create table %s: %w", table, err)
		}
		return nil
	})
}
