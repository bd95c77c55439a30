package relay

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/stretchr/testify/require"
)

// sqlRecorder is a querier that records every statement sent through it, with
// its arguments, and answers each with errRecorded.
type sqlRecorder struct{ calls *[]recordedCall }

type recordedCall struct {
	sql  string
	args []any
}

var errRecorded = errors.New("recorded")

func (q sqlRecorder) add(sql string, args []any) {
	*q.calls = append(*q.calls, recordedCall{sql, args})
}

func (q sqlRecorder) Exec(_ context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	q.add(sql, args)
	return pgconn.CommandTag{}, errRecorded
}

func (q sqlRecorder) Query(_ context.Context, sql string, args ...any) (pgx.Rows, error) {
	q.add(sql, args)
	return nil, errRecorded
}

func (q sqlRecorder) QueryRow(_ context.Context, sql string, args ...any) pgx.Row {
	q.add(sql, args)
	return recordedRow{}
}

func (q sqlRecorder) SendBatch(_ context.Context, b *pgx.Batch) pgx.BatchResults {
	for _, qq := range b.QueuedQueries {
		q.add(qq.SQL, qq.Arguments)
	}
	return recordedBatch{}
}

func (q sqlRecorder) Begin(context.Context) (pgx.Tx, error) { return recordedTx{q: q}, nil }

type recordedRow struct{}

func (recordedRow) Scan(...any) error { return errRecorded }

type recordedBatch struct{ pgx.BatchResults }

func (recordedBatch) Close() error { return errRecorded }

// recordedTx is a transaction whose statements succeed, so that CreateTable
// reaches its DDL.
type recordedTx struct {
	pgx.Tx
	q sqlRecorder
}

func (t recordedTx) Exec(_ context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	t.q.add(sql, args)
	return pgconn.CommandTag{}, nil
}
func (recordedTx) Commit(context.Context) error   { return nil }
func (recordedTx) Rollback(context.Context) error { return nil }

var placeholder = regexp.MustCompile(`\$([0-9]+)`)

// TestSQLFiles checks the SQL layer: every statement of sql/*.sql is used,
// lists only parameters it has, and every statement the package sends gets
// exactly its parameters, $1 to $n.
func TestSQLFiles(t *testing.T) {
	t.Parallel()

	t.Run("every statement is used", func(t *testing.T) {
		used := map[string]bool{}
		goUse := regexp.MustCompile(`(?:statements\.(?:text|named|positional)|cutAtTable)\("([A-Za-z0-9]+)"`)
		sqlUse := regexp.MustCompile(`\{\{template "([A-Za-z0-9]+)"`)
		for pattern, use := range map[string]*regexp.Regexp{"*.go": goUse, "sql/*.sql": sqlUse} {
			paths, err := filepath.Glob(pattern)
			require.NoError(t, err)
			for _, path := range paths {
				if strings.HasSuffix(path, "_test.go") {
					continue
				}
				src, err := os.ReadFile(path)
				require.NoError(t, err)
				for _, m := range use.FindAllStringSubmatch(string(src), -1) {
					require.Contains(t, statements.files, m[1], "%s uses a statement no file has", path)
					used[m[1]] = true
				}
			}
		}
		for name, file := range statements.files {
			require.True(t, used[name], "statement %s of %s is never used", name, file)
		}
	})

	t.Run("listed parameters are the statement's", func(t *testing.T) {
		for name, params := range statements.params {
			for _, d := range sqlVariants() {
				text := statements.text(name, d)
				for _, p := range params {
					require.Contains(t, text, "@"+p, "statement %s lists @%s but does not use it (%+v)", name, p, d)
				}
				n := statements.named(name, d)
				require.Equal(t, params, n.names[:len(params)], "%s: the listed parameters come first", name)
				require.NotRegexp(t, `@[a-z]`, n.sql, "%s: a parameter left unnumbered", name)
				require.NotContains(t, n.sql, "{{", name)
			}
		}
	})

	t.Run("every statement gets exactly its parameters", func(t *testing.T) {
		var calls []recordedCall
		q := sqlRecorder{&calls}
		built := exerciseStatements(t, q)
		seen := map[string]bool{}
		for _, c := range calls {
			seen[c.sql] = true
			n := 0
			for _, m := range placeholder.FindAllStringSubmatch(c.sql, -1) {
				i, _ := strconv.Atoi(m[1])
				n = max(n, i)
			}
			for i := 1; i <= n; i++ {
				require.Contains(t, c.sql, "$"+strconv.Itoa(i), "placeholders are $1 to $%d:\n%s", n, c.sql)
			}
			require.Len(t, c.args, n, "arguments of:\n%s", c.sql)
		}
		for _, sql := range built {
			require.True(t, seen[sql], "a built statement the test never sent:\n%s", sql)
		}
	})
}

// sqlVariants are the options a statement is built with.
func sqlVariants() []sqlData {
	var ds []sqlData
	for i := range 16 {
		ds = append(ds, sqlData{Table: `"s"."t"`, Backoff: i&1 != 0, Async: i&2 != 0, Partitioned: i&4 != 0, Wake: i&8 != 0, Headers: i&8 != 0,
			Alias: "m", Attempts: "true", Lock: "f", Unlock: "f", Function: `"f"`, Channel: `'c'`, Since: "s", InlinePayloadMax: 1})
	}
	return ds
}

// exerciseStatements sends every statement the package builds through q, as
// the package sends it, and returns the texts it built.
func exerciseStatements(t *testing.T, q sqlRecorder) (built []string) {
	ctx := context.Background()
	texts := func(v any) {
		rv := reflect.ValueOf(v).Elem()
		for i := range rv.NumField() {
			switch f := rv.Field(i); {
			case f.Type() == reflect.TypeFor[namedSQL]():
				built = append(built, f.Field(0).String())
			case f.Kind() == reflect.String && strings.HasSuffix(rv.Type().Field(i).Name, "SQL"):
				built = append(built, f.String())
			}
		}
	}
	built = append(built, preflightSQL, schemaLockSQL, purgeCutoffSQL, serverStateSQL, lockHoldersSQL, lockSQL, lockSharedSQL, sessionLocksHeldSQL,
		unlockSQL, unlockSharedSQL, markSQL, partitionConfigSQL, partitionLookSQL, rebalanceSQL.sql, releasePartitionsSQL.sql, databaseNowSQL, wakeProbeSQL,
		presenceTakeSQL, presenceBeatSQL, presenceReleaseSQL, presenceStrandedSQL, replicasSQL, otherReplicasSQL, hasColumnSQL, tableIndexesSQL)
	pending, zero := pgtype.Text{String: statusPending, Valid: true}, pgtype.Int8{Valid: true}
	failedState, three := pgtype.Text{String: statusError, Valid: true}, pgtype.Int8{Int64: 3, Valid: true}
	for _, table := range []string{"outbox", "billing." + strings.Repeat("x", 63)} {
		id, err := parseTable(table)
		require.NoError(t, err)
		require.NoError(t, CreateTable(ctx, q, table))
		require.NoError(t, CreateWakeTrigger(ctx, q, table))
		for _, channel := range []string{"", wakeChannel(id)} {
			for _, headers := range []map[string]string{nil, {"traceparent": "t"}} {
				_, _, _ = enqueue(ctx, q, id, Outgoing{Type: "t", Key: "k", Payload: []byte(`{}`), Headers: headers}, channel, false)
			}
		}
		for _, backoff := range []time.Duration{0, time.Second} {
			for _, async := range []bool{false, true} {
				r, err := newRepository(table, backoff, async)
				require.NoError(t, err)
				texts(r)
				for _, parts := range [][]int{nil, {1}} {
					for _, headers := range []bool{false, true} {
						_, _ = r.fetch(ctx, q, fetchArgs{maxAttempts: 3, types: []string{"t"}, limit: 10, maxBytes: 100, partitions: 2, parts: parts, preflight: true, headers: headers})
					}
				}
				_ = r.loadLarge(ctx, q, &fetched{rows: []row{{Message: Message{ID: 1}, large: true}}}, 100)
				sent := delivery{m: &row{Message: Message{ID: 1}, status: pending, attempts: zero}, out: outcomeSent}
				failed := delivery{m: &row{Message: Message{ID: 2, Attempts: 3}, status: failedState, attempts: three}, out: outcomeFailed, sendErr: errors.New("e")}
				for _, ds := range [][]delivery{{sent}, {failed}, {sent, sent}, {sent, failed}} {
					_, _ = r.record(ctx, q, ds, 10, 0)
				}
				_, _ = r.states(ctx, q, []int64{1})
				_, _, _, _, _ = r.poll(ctx, q, "", 3, []string{"t"}, "app")
				_, _ = rebalanceStatement(ctx, q, "app", 4, 1, 7, r.partitionWork(3, []string{"t"}, 4, []int{1}))
				_, _, _ = idleLookStatement(ctx, q, "", r.partitionWork(3, []string{"t"}, 4, []int{1}), "app", 4)
				_, _ = r.probe(ctx, q)
			}
		}
		for _, requeued := range []bool{false, true} {
			a, err := newAdminRepository(table, requeued)
			require.NoError(t, err)
			texts(a)
			cut := time.Now()
			all, some := writeScope{}, writeScope{types: []string{"t"}, exclude: []string{"u"}}
			_, _ = a.countByStatus(ctx, q, 3)
			_, _ = a.deadPage(ctx, q, 3, DeadQuery{Limit: 1})
			_, _ = a.deadPage(ctx, q, 3, DeadQuery{Limit: 1, Type: "t"})
			_, _ = a.deadRows(ctx, q, 3, []int64{1})
			_, _ = a.requeueAll(ctx, q, 3, some)
			_, _ = a.requeueType(ctx, q, 3, "t")
			_, _ = a.requeueIDs(ctx, q, 3, []int64{1}, all)
			_, _ = a.cutoff(ctx, q, time.Hour)
			_, _ = a.purgeChunk(ctx, q, cut, 10, all)
			_, _ = tableIndexesStatement(ctx, q, table)
			_, _ = a.estimatePurge(ctx, q, cut, all)
			_, _ = a.purgeCounts(ctx, q, cut, 0, all)
			_, _ = a.purgeCounts(ctx, q, cut, 50_000, some)
			_, _ = a.history(ctx, q, 3, time.Second, time.Hour, time.Minute, true)
			_, _ = a.history(ctx, q, 3, 0, time.Hour, time.Minute, false)
			_, _ = a.liveGroups(ctx, q, 3, time.Second)
			_, _ = a.sentByType(ctx, q)
			_, _ = a.server(ctx, q)
			_, _ = a.sampleSent(ctx, q, 10)
			_, _ = a.estimate(ctx, q, a.estimateSentSQL)
			_, _ = a.lockHolders(ctx, q, []string{"app"})
		}
		_, _ = hasColumn(ctx, q, table, "requeued_at")
	}
	for _, stmt := range []string{lockSQL, lockSharedSQL} {
		_, _, _ = lockStatement(ctx, q, stmt, "app", 7)
	}
	for _, stmt := range []string{unlockSQL, unlockSharedSQL} {
		_, _, _, _ = unlockStatement(ctx, q, stmt, "app", nil, 7)
	}
	_ = letGoStatement(ctx, q, "app", 7)
	_, _ = rebalanceStatement(ctx, q, "app", 4, 1, 7, nil)
	_, _ = releasePartitionsStatement(ctx, q, "app", 4, []int{1}, true, 7)
	_, _ = markStatement(ctx, q, "app", 4, 7)
	_, _ = databaseNow(ctx, q)
	_, _ = sessionLocksHeld(ctx, q, 1)
	_ = wakeProbe(ctx, q, "c", "p")
	p := newPresence(DefaultConfig(), []string{"t"})
	_, _, _ = presenceTakeStatement(ctx, q, "", p.args, presenceLease)
	_, _ = presenceBeatStatement(ctx, q, "")
	_, _ = presenceReleaseStatement(ctx, q, p.args, 7)
	_ = presenceStrandedStatement(ctx, q, "app", 7, 7)
	_, _ = replicasStatement(ctx, q, "app", []string{"t"})
	_, _ = otherReplicasStatement(ctx, q, "app", []string{"t"}, "s.t")
	return built
}

func TestParseSQLRefuses(t *testing.T) {
	t.Parallel()
	for want, file := range map[string]string{
		"is also in":       "-- name: a\nSELECT 1\n-- name: a\nSELECT 2\n",
		"malformed marker": "-- name: a b\nSELECT 1\n",
		"is empty":         "-- name: a\n-- only a comment\n",
		"statement b":      "-- name: b\nSELECT {{.Table\n",
	} {
		_, err := parseSQL(fstest.MapFS{"sql/x.sql": {Data: []byte(file)}})
		require.ErrorContains(t, err, want)
	}
	s, err := parseSQL(fstest.MapFS{"sql/x.sql": {Data: []byte("-- header\n\n-- name: a @y @x\n-- doc\nSELECT @x, @y, @z\n\n-- next section\n\n-- name: b\nSELECT 2\n")}})
	require.NoError(t, err)
	n := s.named("a", sqlData{})
	require.Equal(t, "SELECT $2, $1, $3", n.sql)
	require.Equal(t, []string{"y", "x", "z"}, n.names)
	require.Equal(t, "SELECT 2", s.text("b", sqlData{}))
}
