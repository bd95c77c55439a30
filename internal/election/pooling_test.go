package election

import (
	"context"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/xadm/relay/internal/session"
	"github.com/xadm/relay/internal/store"
	"github.com/xadm/relay/internal/testkit/pgserver"
)

// TestMain gets a real PostgreSQL (RELAY_TEST_DATABASE_URL, or the local
// binaries): the elections are tested against the server's own locks.
func TestMain(m *testing.M) { os.Exit(pgserver.Run(m, "RELAY_TEST_DATABASE_URL")) }

// endingTracer ends the backend of the first statement that contains
// endAt, just before pgx sends it, and keeps every statement's text.
type endingTracer struct {
	url   string
	endAt string

	mu    sync.Mutex
	ended uint32
	sent  []string
	err   error
}

func (e *endingTracer) TraceQueryStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.sent = append(e.sent, data.SQL)
	if e.ended != 0 || !strings.Contains(data.SQL, e.endAt) {
		return ctx
	}
	e.ended = conn.PgConn().PID()
	other, err := pgx.Connect(ctx, e.url)
	if err != nil {
		e.err = err
		return ctx
	}
	defer other.Close(ctx)
	// Ended, and gone: the server has sent the session its FATAL and closed it.
	_, e.err = other.Exec(ctx, `SELECT pg_terminate_backend($1::int, 60000)`, e.ended)
	return ctx
}

func (e *endingTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (e *endingTracer) statements(containing string) (n int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, s := range e.sent {
		if strings.Contains(s, containing) {
			n++
		}
	}
	return n
}

// TestLockStatementOfAnEndedSessionLetsGoOfNothing: the lock statement of an
// election that meets the server ending its session (FATAL, as when another
// replica ends a pooler's server connection that strands a lock) took
// nothing, and the election lets go of nothing on the backend its pid
// question was answered from. Behind a pooler that does not keep sessions
// that backend may be another replica's session: letting go of its locks
// there (issue 22's CheckMissed fleets met it, one run in ten or twenty
// under load) let two replicas deliver one key at once.
func TestLockStatementOfAnEndedSessionLetsGoOfNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgserver.Shared().URL
	tr := &endingTracer{url: url, endAt: "pg_try_advisory_lock("}
	cfg, err := pgxpool.ParseConfig(url)
	require.NoError(t, err)
	cfg.ConnConfig.Tracer = tr
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer pool.Close()
	key := pgserver.Name(t)

	// Pooled (not direct): the pid is asked, as behind a pooler.
	conn, locked, sess, err := tryElection(ctx, pool, key, store.LockSQL, false)
	tr.mu.Lock()
	require.NoError(t, tr.err)
	require.NotZero(t, tr.ended, "the first lock statement's session was ended")
	tr.mu.Unlock()
	require.NoError(t, err, "the lock is tried again on another connection")
	require.NotNil(t, locked)
	require.True(t, *locked)
	require.NotEqual(t, tr.ended, sess.pid)
	require.NoError(t, releaseElection(ctx, conn, key, sess, store.UnlockSQL))

	require.Equal(t, 2, tr.statements("pg_try_advisory_lock("), "two lock statements, the first ended")
	require.Zero(t, tr.statements("pg_advisory_unlock_all"), "nothing was let go of on the ended statement's backend, which took nothing")
}

// sharedConn is a connection of its own to the shared server, closed at the
// test's end.
func sharedConn(t *testing.T) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), pgserver.Shared().URL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

func TestLockTookNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn, other := sharedConn(t), sharedConn(t)

	_, err := conn.Exec(ctx, "SELECT 1/0")
	require.Error(t, err)
	require.False(t, lockTookNothing(err), "an ERROR: the statement ran, and may have taken a lock before it")

	_, err = other.Exec(ctx, `SELECT pg_terminate_backend($1::int, 60000)`, conn.PgConn().PID())
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "SELECT 1")
	var pe *pgconn.PgError
	require.ErrorAs(t, err, &pe)
	require.Equal(t, "57P01", pe.Code)
	require.True(t, lockTookNothing(err), "the server ended the session: %v", err)

	require.False(t, lockTookNothing(context.DeadlineExceeded), "no answer: the statement may have run")
	require.True(t, lockTookNothing(&pgconn.PgError{Severity: "ERROR", Code: "26000"}), "a pooler's server connection without the prepared statement: it never ran")
}

// TestPresenceReleaseLetsGoOfItsOwnLocksOnly: the presence release lets go of
// the presence locks and of nothing else the session holds (behind a pooler
// that does not keep sessions, a server connection may hold another
// replica's election), and of nothing on another backend than its own.
func TestPresenceReleaseLetsGoOfItsOwnLocksOnly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	conn := sharedConn(t)
	app := pgserver.Name(t)
	p := session.NewPresence(app, "outbox", 10, 1, []string{"a", "b"})
	pid, err := p.Take(ctx, conn)
	require.NoError(t, err)
	key := app + "_relay_m2m"
	var locked bool
	require.NoError(t, conn.QueryRow(ctx, "SELECT pg_try_advisory_lock(hashtext($1))", key).Scan(&locked))
	require.True(t, locked)
	held := func() (presence, others int) {
		require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FILTER (WHERE objsubid = 2), count(*) FILTER (WHERE objsubid = 1)
			FROM pg_locks WHERE locktype = 'advisory' AND pid = $1`, pid).Scan(&presence, &others))
		return presence, others
	}
	presence, others := held()
	require.Equal(t, 7, presence, "app, replica, max attempts, partitions, two types and the table")
	require.Equal(t, 1, others)

	released, err := store.PresenceReleaseStatement(ctx, conn, p.Args(), pid+1)
	require.NoError(t, err)
	require.False(t, released, "another backend's: nothing let go of")
	presence, others = held()
	require.Equal(t, 7, presence)
	require.Equal(t, 1, others)

	released, err = store.PresenceReleaseStatement(ctx, conn, p.Args(), pid)
	require.NoError(t, err)
	require.True(t, released)
	presence, others = held()
	require.Zero(t, presence)
	require.Equal(t, 1, others, "the election's lock is not presence's to let go of")
}
