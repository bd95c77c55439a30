package store

import (
	"context"
	"fmt"
	"hash/fnv"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5"
)

// The outbox table's DDL; its statements are in sql/schema.sql.

// identifierRE is what a part of Config.Table may be: a plain SQL identifier.
var identifierRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,62}$`)

// ParseTable validates a possibly schema-qualified table name and returns it as
// an identifier, so that it is always quoted and never pasted into SQL as given.
func ParseTable(name string) (pgx.Identifier, error) {
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

// schemaLockSQL serialises the replicas that create a table's DDL at once.
var schemaLockSQL = Statements.Positional("schemaLock", Data{})

// SchemaSQL returns the outbox table's DDL for table (optionally schema-qualified),
// for adopters who keep it in their own migrations. It is idempotent.
func SchemaSQL(table string) (string, error) {
	id, err := ParseTable(table)
	if err != nil {
		return "", fmt.Errorf("relay: %w", err)
	}
	name := id[len(id)-1]
	return Statements.Text("schema", Data{
		Table:        id.Sanitize(),
		OutboxIndex:  IndexName(name, "_outbox"),
		PendingIndex: IndexName(name, "_outbox_pending"),
		ErrorIndex:   IndexName(name, "_outbox_error"),
		RetryIndex:   IndexName(name, "_outbox_retry"),
		KeyIndex:     IndexName(name, "_outbox_key"),
		Registry:     RegistryName(id),
	}) + "\n", nil // a script ends its last line
}

// IndexName is table+suffix. Past PostgreSQL's 63 bytes, the table's part is
// cut and a hash of the whole name keeps it apart from another long table with
// the same beginning: two tables never share an index name (with IF NOT
// EXISTS, the second would silently get no index).
func IndexName(table, suffix string) string {
	if len(table)+len(suffix) > 63 {
		h := fnv.New32a()
		h.Write([]byte(table))
		tag := fmt.Sprintf("_%08x", h.Sum32())
		table = table[:63-len(suffix)-len(tag)] + tag
	}
	return pgx.Identifier{table + suffix}.Sanitize()
}

// Beginner is what CreateTable and CreateWakeTrigger run their DDL on
// (relay.Beginner): *pgxpool.Pool, *pgx.Conn, pgx.Tx.
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
		if _, err := tx.Exec(ctx, schemaLockSQL, "relay_schema:"+table); err != nil {
			return fmt.Errorf("relay: create table %s: %w", table, err)
		}
		if _, err := tx.Exec(ctx, ddl); err != nil {
			return fmt.Errorf("relay: create table %s: %w", table, err)
		}
		return nil
	})
}
