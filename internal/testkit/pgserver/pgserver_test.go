package pgserver

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
)

func TestMain(m *testing.M) { Main(m) }

// connect opens a pgx connection to url that the test closes at its end.
func connect(t *testing.T, url string, mode pgx.QueryExecMode) *pgx.Conn {
	t.Helper()
	cfg, err := pgx.ParseConfig(url)
	require.NoError(t, err)
	cfg.DefaultQueryExecMode = mode
	conn, err := pgx.ConnectConfig(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// query runs a one-value query on conn.
func query[T any](t *testing.T, conn *pgx.Conn, sql string) T {
	t.Helper()
	var v T
	require.NoError(t, conn.QueryRow(t.Context(), sql).Scan(&v))
	return v
}

func TestSharedServerAnswers(t *testing.T) {
	t.Parallel()
	conn := connect(t, Shared().URL, pgx.QueryExecModeCacheStatement)
	require.Equal(t, 1, query[int](t, conn, "SELECT 1"))
}

func TestHaltResumeStop(t *testing.T) {
	t.Parallel()
	// A cluster of its own, so that halting it disturbs no other test.
	binDir := findBinDir(t.Context())
	require.NotEmpty(t, binDir, "local PostgreSQL binaries")
	s, err := startLocal(t.Context(), binDir)
	require.NoError(t, err)
	t.Cleanup(func() { s.Stop() })
	require.True(t, s.Local())
	require.Equal(t, "local", s.Kind)
	require.FileExists(t, filepath.Join(s.BinDir(), "pgbench"+exe))

	conn := connect(t, s.URL, pgx.QueryExecModeCacheStatement)
	_, err = conn.Exec(t.Context(), "CREATE TABLE kept (v int); INSERT INTO kept VALUES (7)")
	require.NoError(t, err)

	require.NoError(t, s.Halt())
	_, err = conn.Exec(t.Context(), "SELECT 1")
	require.Error(t, err, "a connection from before the outage")
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	_, err = pgx.Connect(ctx, s.URL)
	require.Error(t, err, "a new connection during the outage")

	require.NoError(t, s.Resume(t.Context()))
	conn = connect(t, s.URL, pgx.QueryExecModeCacheStatement)
	require.Equal(t, 7, query[int](t, conn, "SELECT v FROM kept"), "the data survives the outage")
	conn.Close(t.Context())

	require.NoError(t, s.Stop())
	require.NoError(t, s.Stop(), "second Stop")
	require.NoDirExists(t, s.local.dir)
	_, err = pgx.Connect(ctx, s.URL)
	require.Error(t, err, "the server is gone")
	require.Error(t, s.Halt())
	require.Error(t, s.Resume(t.Context()))
}

func TestEnvServerIsNotControlled(t *testing.T) {
	t.Setenv("PGSERVER_TEST_URL", "postgres://u@127.0.0.1:1/db")
	s, err := Start(t.Context(), "PGSERVER_TEST_URL")
	require.NoError(t, err)
	require.Equal(t, "env", s.Kind)
	require.Equal(t, "postgres://u@127.0.0.1:1/db", s.URL)
	require.False(t, s.Local())
	require.Empty(t, s.BinDir())
	require.Error(t, s.Halt())
	require.Error(t, s.Resume(t.Context()))
	require.NoError(t, s.Stop())
}

func TestName(t *testing.T) {
	t.Parallel()
	ident := regexp.MustCompile(`^[a-z_][a-z0-9_]*$`)
	a, b := Name(t), Name(t)
	require.NotEqual(t, a, b)
	require.Regexp(t, ident, a)
	require.True(t, strings.HasPrefix(a, "testname_"), a)
	t.Run(strings.Repeat("Very-Long ", 10), func(t *testing.T) {
		n := Name(t)
		require.Regexp(t, ident, n)
		require.LessOrEqual(t, len(n), 63)
	})
}

func TestPgBouncerSessionMode(t *testing.T) {
	t.Parallel()
	RequirePgBouncer(t)
	b, err := StartPgBouncer(t.Context(), Shared(), "session")
	require.NoError(t, err)
	t.Cleanup(func() { b.Stop() })

	// A client keeps its server connection for its whole session.
	conn := connect(t, b.URL, pgx.QueryExecModeCacheStatement)
	pid := query[int32](t, conn, "SELECT pg_backend_pid()")
	require.Equal(t, pid, query[int32](t, conn, "SELECT pg_backend_pid()"))
	other := connect(t, b.URL, pgx.QueryExecModeCacheStatement)
	require.NotEqual(t, pid, query[int32](t, other, "SELECT pg_backend_pid()"))
	conn.Close(t.Context())
	other.Close(t.Context())

	require.NoError(t, b.Stop())
	require.NoError(t, b.Stop(), "second Stop")
	require.NoDirExists(t, b.dir)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	_, err = pgx.Connect(ctx, b.URL)
	require.Error(t, err, "pgbouncer is gone")
}

// TestPgBouncerTransactionModeAdvisoryLocks records what a session advisory lock taken
// through pgbouncer in transaction mode does: it belongs to whichever server
// connection ran the statement, not to the client. Pgbouncer hands out the most
// recently used idle server connection first, which makes the steps below exact.
func TestPgBouncerTransactionModeAdvisoryLocks(t *testing.T) {
	t.Parallel()
	RequirePgBouncer(t)
	b, err := StartPgBouncer(t.Context(), Shared(), "transaction")
	require.NoError(t, err)
	t.Cleanup(func() { b.Stop() })
	direct := connect(t, Shared().URL, pgx.QueryExecModeCacheStatement)
	const lockSQL, unlockSQL = "SELECT pg_try_advisory_lock(42)", "SELECT pg_advisory_unlock(42)"
	holders := func() []int32 { // the backends holding advisory lock 42
		return query[[]int32](t, direct, "SELECT coalesce(array_agg(pid), '{}') FROM pg_locks "+
			"WHERE locktype = 'advisory' AND classid = 0 AND objid = 42 AND objsubid = 1 AND granted")
	}

	a := connect(t, b.URL, pgx.QueryExecModeSimpleProtocol)
	other := connect(t, b.URL, pgx.QueryExecModeSimpleProtocol)
	require.True(t, query[bool](t, a, lockSQL))
	server := holders()
	require.Len(t, server, 1, "a server connection holds the lock")

	// Another client whose statements land on that server connection "has" the lock too.
	require.True(t, query[bool](t, other, lockSQL), "the other client takes A's lock")
	require.Equal(t, server, holders())
	require.True(t, query[bool](t, other, unlockSQL))
	require.Equal(t, server, holders(), "still held once, for A")

	// While another client's transaction holds that server connection, A's unlock runs
	// on a different one: it returns false and the lock stays where it was.
	tx, err := other.Begin(t.Context())
	require.NoError(t, err)
	require.Equal(t, server[0], query[int32](t, other, "SELECT pg_backend_pid()"))
	require.False(t, query[bool](t, a, unlockSQL), "A's unlock during the other transaction")
	require.Equal(t, server, holders())
	require.NoError(t, tx.Commit(t.Context()))

	// Once that connection is idle again A's next statement gets it and the unlock works.
	require.True(t, query[bool](t, a, unlockSQL))
	require.Empty(t, holders())

	// A lock outlives the client that took it: the server connection goes back to the pool.
	require.True(t, query[bool](t, a, lockSQL))
	a.Close(t.Context())
	require.Len(t, holders(), 1, "the lock after A disconnected")
	require.False(t, query[bool](t, direct, lockSQL), "a direct client cannot take it")
	require.True(t, query[bool](t, other, unlockSQL), "a pgbouncer client can release it")
	require.Empty(t, holders())
}

// TestPgBouncerTransactionModeStatementCache records that pgx's default statement
// cache does not survive transaction pooling (pgbouncer before 1.21 does not track
// prepared statements); QueryExecModeExec and QueryExecModeSimpleProtocol do.
func TestPgBouncerTransactionModeStatementCache(t *testing.T) {
	t.Parallel()
	RequirePgBouncer(t)
	b, err := StartPgBouncer(t.Context(), Shared(), "transaction")
	require.NoError(t, err)
	t.Cleanup(func() { b.Stop() })
	const sql = "SELECT $1::int"

	var n int
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
		for range 2 {
			require.NoError(t, connect(t, b.URL, mode).QueryRow(t.Context(), sql, 1).Scan(&n), mode)
		}
	}
	first := connect(t, b.URL, pgx.QueryExecModeCacheStatement)
	require.NoError(t, first.QueryRow(t.Context(), sql, 1).Scan(&n))
	err = connect(t, b.URL, pgx.QueryExecModeCacheStatement).QueryRow(t.Context(), sql, 1).Scan(&n)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr, "a second client's cached statement")
	require.Equal(t, "42P05", pgErr.Code, "duplicate_prepared_statement")
}

func TestRemoveStale(t *testing.T) {
	old := time.Now().Add(-2 * staleAfter)
	mk := func(pid string) string {
		dir, err := os.MkdirTemp("", "pgserver-")
		require.NoError(t, err)
		t.Cleanup(func() { os.RemoveAll(dir) })
		if pid != "" {
			require.NoError(t, os.MkdirAll(filepath.Join(dir, "data"), 0o700))
			require.NoError(t, os.WriteFile(filepath.Join(dir, "data", "postmaster.pid"), []byte(pid+"\n/x\n"), 0o600))
		}
		return dir
	}
	deadOld, aliveOld, deadYoung := mk("999999999"), mk(fmt.Sprint(os.Getpid())), mk("999999999")
	for _, d := range []string{deadOld, aliveOld} {
		require.NoError(t, os.Chtimes(d, old, old))
	}
	removeStale()
	require.NoDirExists(t, deadOld, "an old directory whose server is gone is removed")
	require.DirExists(t, aliveOld, "a directory whose postmaster still runs is kept")
	require.DirExists(t, deadYoung, "a young directory may be a cluster being set up: kept")
}

func TestBinDirVersion(t *testing.T) {
	t.Parallel()
	for dir, want := range map[string]float64{
		"/usr/lib/postgresql/15/bin":                               15,
		"/opt/homebrew/opt/postgresql@16/bin":                      16,
		"/Applications/Postgres.app/Contents/Versions/17/bin":      17,
		"/Applications/Postgres.app/Contents/Versions/latest/bin":  0,
		filepath.Join("Program Files", "PostgreSQL", "9.6", "bin"): 9.6,
	} {
		require.Equal(t, want, binDirVersion(filepath.FromSlash(dir)), dir)
	}
}
