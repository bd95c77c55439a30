package inbox

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// errOwnTx is what apply's tx.Commit and tx.Rollback return: the inbox ends
// the transaction, with the message's record in it.
var errOwnTx = errors.New("inbox: the inbox commits or rolls back the transaction, not apply: return nil or an error instead")

// tx is the transaction apply gets: a pgx.Tx on the connection whose
// transaction the inbox began in the same round trip as its claim (a batch of
// BEGIN and the claim), so that the inbox costs its receiver no round trip of
// its own. Statements run on the connection; Commit and Rollback are the
// inbox's, and return errOwnTx to apply.
//
// A nested Begin (a savepoint) and LargeObjects need a pgx transaction of
// pgx's own making: the first call makes one on the open transaction, with an
// empty statement, one round trip.
type tx struct {
	conn *pgx.Conn
	own  pgx.Tx // pgx's own handle on the transaction; nil until needed
}

var _ pgx.Tx = (*tx)(nil)

// pgxTx returns pgx's own handle on the open transaction, making it first.
func (t *tx) pgxTx(ctx context.Context) (pgx.Tx, error) {
	if t.own == nil {
		own, err := t.conn.BeginTx(ctx, pgx.TxOptions{BeginQuery: ";"})
		if err != nil {
			return nil, err
		}
		t.own = own
	}
	return t.own, nil
}

// Begin starts a pseudo nested transaction, a savepoint, as pgx's does.
func (t *tx) Begin(ctx context.Context) (pgx.Tx, error) {
	own, err := t.pgxTx(ctx)
	if err != nil {
		return nil, err
	}
	return own.Begin(ctx)
}

// Commit returns an error: the inbox commits, once apply returned nil.
func (t *tx) Commit(context.Context) error { return errOwnTx }

// Rollback returns an error: the inbox rolls back, when apply returned an error.
func (t *tx) Rollback(context.Context) error { return errOwnTx }

func (t *tx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	return t.conn.CopyFrom(ctx, table, columns, src)
}

func (t *tx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	return t.conn.SendBatch(ctx, b)
}

// LargeObjects returns the large objects of the transaction. Should making
// pgx's handle fail (the connection broken), the value it returns panics on
// use, which apply's recover turns into a retry.
func (t *tx) LargeObjects() pgx.LargeObjects {
	own, err := t.pgxTx(context.Background())
	if err != nil {
		return pgx.LargeObjects{}
	}
	return own.LargeObjects()
}

func (t *tx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	return t.conn.Prepare(ctx, name, sql)
}

func (t *tx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return t.conn.Exec(ctx, sql, args...)
}

func (t *tx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return t.conn.Query(ctx, sql, args...)
}

func (t *tx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return t.conn.QueryRow(ctx, sql, args...)
}

func (t *tx) Conn() *pgx.Conn { return t.conn }
