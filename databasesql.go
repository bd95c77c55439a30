package relay

import (
	"context"
	"database/sql"
	"strings"

	"github.com/jackc/pgx/v5"
)

// SQLQuerier is what [FromSQL] writes through: database/sql's *sql.Tx,
// *sql.DB and *sql.Conn satisfy it, with any driver of PostgreSQL (pgx's
// stdlib, lib/pq), and so do the handles of the libraries built on
// database/sql: GORM's tx.Statement.ConnPool, sqlx's *sqlx.Tx, the DBTX of
// sqlc's database/sql code, Bun's bun.Tx.Tx (the *sql.Tx inside: bun.Tx's own
// QueryRowContext formats the arguments into the statement, for Bun's ?
// placeholders, and sends none).
type SQLQuerier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// FromSQL is q as a [Querier], so that a service on database/sql writes its
// messages with [Enqueue] and [EnqueueMany] in the transaction of its
// business data:
//
//	tx, err := db.BeginTx(ctx, nil)
//	...
//	id, err := relay.Enqueue(ctx, relay.FromSQL(tx), relay.TableDefault, m)
//	...
//	err = tx.Commit()
//
// Everything Enqueue says holds through it: the same checks and errors, the
// key's order lock, the wake-up on commit. A nil q, or a nil *sql.Tx,
// *sql.DB or *sql.Conn, is a nil Querier, which Enqueue refuses.
func FromSQL(q SQLQuerier) Querier {
	switch v := q.(type) {
	case nil:
		return nil
	case *sql.Tx:
		if v == nil {
			return nil
		}
	case *sql.DB:
		if v == nil {
			return nil
		}
	case *sql.Conn:
		if v == nil {
			return nil
		}
	}
	return sqlQuerier{q}
}

// sqlQuerier is a SQLQuerier as a Querier.
type sqlQuerier struct{ q SQLQuerier }

// QueryRow sends sql through database/sql. Drivers take no Go slices as
// arguments (lib/pq refuses them), so EnqueueMany's arrays go as PostgreSQL
// array literals, which its statement casts to text[].
func (s sqlQuerier) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	for i, a := range args {
		if v, ok := a.([]string); ok {
			args[i] = arrayLiteral(v)
		}
	}
	return s.q.QueryRowContext(ctx, sql, args...)
}

// arrayLiteral is ss as a PostgreSQL array literal of text, every element
// quoted ("NULL" stays a string), with its backslashes and double quotes
// escaped.
func arrayLiteral(ss []string) string {
	n := 2
	for _, s := range ss {
		n += len(s) + 3
	}
	var b strings.Builder
	b.Grow(n)
	b.WriteByte('{')
	for i, s := range ss {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('"')
		for j := 0; j < len(s); j++ {
			if c := s[j]; c == '"' || c == '\\' {
				b.WriteByte('\\')
			}
			b.WriteByte(s[j])
		}
		b.WriteByte('"')
	}
	b.WriteByte('}')
	return b.String()
}
