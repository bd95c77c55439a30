// Package sqltest records the statements the relay sends, for the tests
// that check each gets exactly its parameters (no database needed).
package sqltest

import (
	"context"
	"errors"
	"regexp"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

// Recorder is a querier (store.Querier, and a Beginner) that records every
// statement sent through it, with its arguments, and answers each with
// ErrRecorded; a transaction it begins answers its statements with success.
type Recorder struct{ Calls *[]Call }

// Call is one statement sent, and its arguments.
type Call struct {
	SQL  string
	Args []any
}

// ErrRecorded is every recorded statement's answer.
var ErrRecorded = errors.New("recorded")

func (q Recorder) add(sql string, args []any) {
	*q.Calls = append(*q.Calls, Call{sql, args})
}

func (q Recorder) Exec(_ context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	q.add(sql, args)
	return pgconn.CommandTag{}, ErrRecorded
}

func (q Recorder) Query(_ context.Context, sql string, args ...any) (pgx.Rows, error) {
	q.add(sql, args)
	return nil, ErrRecorded
}

func (q Recorder) QueryRow(_ context.Context, sql string, args ...any) pgx.Row {
	q.add(sql, args)
	return recordedRow{}
}

func (q Recorder) SendBatch(_ context.Context, b *pgx.Batch) pgx.BatchResults {
	for _, qq := range b.QueuedQueries {
		q.add(qq.SQL, qq.Arguments)
	}
	return recordedBatch{}
}

func (q Recorder) Begin(context.Context) (pgx.Tx, error) { return recordedTx{q: q}, nil }

type recordedRow struct{}

func (recordedRow) Scan(...any) error { return ErrRecorded }

type recordedBatch struct{ pgx.BatchResults }

func (recordedBatch) Close() error { return ErrRecorded }

// recordedTx is a transaction whose statements succeed, so that a DDL
// reaches its statements.
type recordedTx struct {
	pgx.Tx
	q Recorder
}

func (t recordedTx) Exec(_ context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	t.q.add(sql, args)
	return pgconn.CommandTag{}, nil
}
func (recordedTx) Commit(context.Context) error   { return nil }
func (recordedTx) Rollback(context.Context) error { return nil }

var placeholder = regexp.MustCompile(`\$([0-9]+)`)

// Check fails t unless every call got exactly its statement's parameters,
// $1 to $n, and every statement of built was sent.
func Check(t *testing.T, calls []Call, built []string) {
	t.Helper()
	seen := map[string]bool{}
	for _, c := range calls {
		seen[c.SQL] = true
		n := 0
		for _, m := range placeholder.FindAllStringSubmatch(c.SQL, -1) {
			i, _ := strconv.Atoi(m[1])
			n = max(n, i)
		}
		for i := 1; i <= n; i++ {
			require.Contains(t, c.SQL, "$"+strconv.Itoa(i), "placeholders are $1 to $%d:\n%s", n, c.SQL)
		}
		require.Len(t, c.Args, n, "arguments of:\n%s", c.SQL)
	}
	for _, sql := range built {
		require.True(t, seen[sql], "a built statement the test never sent:\n%s", sql)
	}
}
