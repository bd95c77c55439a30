package store

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/stretchr/testify/require"

	"github.com/xadm/relay/internal/lease"
	"github.com/xadm/relay/internal/testkit/sqltest"
)

// TestSQLFiles checks the SQL layer: every statement of sql/*.sql is used,
// lists only parameters it has, and every statement the package sends gets
// exactly its parameters, $1 to $n.
func TestSQLFiles(t *testing.T) {
	t.Parallel()

	t.Run("every statement is used", func(t *testing.T) {
		used := map[string]bool{}
		goUse := regexp.MustCompile(`(?:Statements\.(?:Text|Named|Positional)|cutAtTable)\("([A-Za-z0-9]+)"`)
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
					require.Contains(t, Statements.Files(), m[1], "%s uses a statement no file has", path)
					used[m[1]] = true
				}
			}
		}
		for name, file := range Statements.Files() {
			require.True(t, used[name], "statement %s of %s is never used", name, file)
		}
	})

	t.Run("listed parameters are the statement's", func(t *testing.T) {
		for name, params := range Statements.Params() {
			for _, d := range sqlVariants() {
				text := Statements.Text(name, d)
				for _, p := range params {
					require.Contains(t, text, "@"+p, "statement %s lists @%s but does not use it (%+v)", name, p, d)
				}
				n := Statements.Named(name, d)
				require.Equal(t, params, n.Names()[:len(params)], "%s: the listed parameters come first", name)
				require.NotRegexp(t, `@[a-z]`, n.SQL(), "%s: a parameter left unnumbered", name)
				require.NotContains(t, n.SQL(), "{{", name)
			}
		}
	})

	t.Run("every statement gets exactly its parameters", func(t *testing.T) {
		var calls []sqltest.Call
		built := exerciseStatements(t, sqltest.Recorder{Calls: &calls})
		sqltest.Check(t, calls, built)
	})
}

// sqlVariants are the options a statement is built with.
func sqlVariants() []Data {
	var ds []Data
	for i := range 32 {
		ds = append(ds, Data{Table: `"s"."t"`, Backoff: i&1 != 0, Async: i&2 != 0, Partitioned: i&4 != 0, Wake: i&8 != 0, Headers: i&8 != 0, Keyed: i&16 != 0, OneLane: i&16 != 0,
			Alias: "m", Attempts: "true", Lock: "f", Unlock: "f", Function: `"f"`, Channel: `'c'`, Since: "s", InlinePayloadMax: 1})
	}
	return ds
}

// exerciseStatements sends every statement the package builds and sends
// through q, as the package sends it, and returns the texts it built.
// Admin's and Enqueue's, which the relay sends, the relay's tests send.
func exerciseStatements(t *testing.T, q sqltest.Recorder) (built []string) {
	ctx := context.Background()
	var named func(f reflect.Value)
	named = func(f reflect.Value) { // a NamedSQL, or arrays of them
		if f.Kind() == reflect.Array {
			for j := range f.Len() {
				named(f.Index(j))
			}
			return
		}
		built = append(built, f.Field(0).String())
	}
	texts := func(v any) {
		rv := reflect.ValueOf(v).Elem()
		for i := range rv.NumField() {
			switch f := rv.Field(i); {
			case f.Type() == reflect.TypeFor[NamedSQL]() || f.Kind() == reflect.Array:
				named(f)
			case f.Kind() == reflect.String && strings.HasSuffix(rv.Type().Field(i).Name, "SQL"):
				built = append(built, f.String())
			}
		}
	}
	built = append(built, preflightSQL, schemaLockSQL, LockSQL, LockSharedSQL, SessionLocksHeldSQL,
		UnlockSQL, UnlockSharedSQL, markSQL, partitionConfigSQL, partitionLookSQL, rebalanceSQL.sql, releasePartitionsSQL.sql, databaseNowSQL, wakeProbeSQL,
		presenceTakeSQL, presenceBeatSQL, presenceReleaseSQL, presenceStrandedSQL, replicasSQL, otherReplicasSQL, hasColumnSQL, tableIndexesSQL, privilegesSQL)
	_, _, _, _ = Privileges(ctx, q, "s.t", []string{"status"})
	pending, zero := pgtype.Text{String: StatusPending, Valid: true}, pgtype.Int8{Valid: true}
	failedState, three := pgtype.Text{String: StatusError, Valid: true}, pgtype.Int8{Int64: 3, Valid: true}
	for _, table := range []string{"outbox", "billing." + strings.Repeat("x", 63)} {
		id, err := ParseTable(table)
		require.NoError(t, err)
		require.NoError(t, CreateTable(ctx, q, table))
		require.NoError(t, CreateWakeTrigger(ctx, q, table))
		_ = id
		for _, backoff := range []time.Duration{0, time.Second} {
			for _, async := range []bool{false, true} {
				r, err := NewTable(table, backoff, time.Hour, async)
				require.NoError(t, err)
				texts(r)
				for _, parts := range [][]int{nil, {1}} {
					for _, headers := range []bool{false, true} {
						for _, keyed := range []bool{false, true} {
							for _, types := range [][]string{{"t"}, {"t", "v"}} {
								_, _ = r.Fetch(ctx, q, FetchArgs{MaxAttempts: 3, Types: types, After: make([]int64, len(types)), All: []string{"t", "u", "v"},
									Later: []string{"u"}, Keyed: keyed, StartEpoch: keyed, Limit: 10, MaxBytes: 100, Partitions: 2, Parts: parts,
									Preflight: true, Headers: headers})
							}
						}
					}
				}
				_ = r.LoadLarge(ctx, q, &Batch{Rows: []Row{{ID: 1, Large: true}}}, 100)
				sent := Update{ID: 1, Status: pending, ReadAttempts: zero, Sent: true}
				failed := Update{ID: 2, Status: failedState, ReadAttempts: three, NewAttempts: 4, LastError: "e"}
				for _, ds := range [][]Update{{sent}, {failed}, {sent, sent}, {sent, failed}} {
					_, _ = r.Record(ctx, q, ds)
				}
				_, _ = r.States(ctx, q, []int64{1})
				_, _, _, _, _ = r.Poll(ctx, q, "", 3, []string{"t"}, "app")
				_, _ = RebalanceStatement(ctx, q, "app", 4, 1, 7, r.PartitionWork(3, []string{"t"}, 4, []int{1}))
				_, _, _ = IdleLookStatement(ctx, q, "", r.PartitionWork(3, []string{"t"}, 4, []int{1}), "app", 4)
				_, _ = r.Probe(ctx, q)
			}
		}
		for _, requeued := range []bool{false, true} {
			a, err := NewAdminSQL(table, requeued)
			require.NoError(t, err)
			_ = a // relay.Admin sends them (TestAdminStatements)
		}
		_, _ = TableIndexesStatement(ctx, q, table)
	}
	for _, stmt := range []string{LockSQL, LockSharedSQL} {
		_, _, _ = LockStatement(ctx, q, stmt, "app", 7)
	}
	for _, stmt := range []string{UnlockSQL, UnlockSharedSQL} {
		_, _, _, _ = UnlockStatement(ctx, q, stmt, "app", nil, 7)
	}
	_ = LetGoStatement(ctx, q, "app", 7)
	_, _ = RebalanceStatement(ctx, q, "app", 4, 1, 7, nil)
	_, _ = ReleasePartitionsStatement(ctx, q, "app", 4, []int{1}, true, 7)
	_, _ = MarkStatement(ctx, q, "app", 4, 7)
	_, _ = DatabaseNow(ctx, q)
	_, _ = SessionLocksHeld(ctx, q, 1)
	_ = WakeProbe(ctx, q, "c", "p")
	args := []any{"app", int32(7), 10, 1, []string{"t"}, "outbox"} // app, replica, MaxAttempts, Partitions, types, table
	_, _, _ = PresenceTakeStatement(ctx, q, "", args, lease.Server)
	_, _ = PresenceBeatStatement(ctx, q, "")
	_, _ = PresenceReleaseStatement(ctx, q, args, 7)
	_ = PresenceStrandedStatement(ctx, q, "app", 7, 7)
	_, _ = ReplicasStatement(ctx, q, "app", []string{"t"})
	_, _ = OtherReplicasStatement(ctx, q, "app", []string{"t"}, "t")
	_, _ = HasColumn(ctx, q, "outbox", "requeued_at")
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
	n := s.Named("a", Data{})
	require.Equal(t, "SELECT $2, $1, $3", n.sql)
	require.Equal(t, []string{"y", "x", "z"}, n.names)
	require.Equal(t, "SELECT 2", s.Text("b", Data{}))
}
