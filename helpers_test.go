package relay_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/xadm/relay"
	"github.com/xadm/relay/internal/testkit/pgserver"
	"github.com/xadm/relay/internal/testkit/testlog"
)

// TestMain gets a real PostgreSQL (RELAY_TEST_DATABASE_URL, a container, or the
// local binaries) and fails, never skips, when none can be had. After the tests
// it checks that no goroutine was left behind.
func TestMain(m *testing.M) { os.Exit(pgserver.Run(m, "RELAY_TEST_DATABASE_URL")) }

// server is the package's throwaway PostgreSQL.
func server() *pgserver.Server { return pgserver.Shared() }

// bundle is one test's world: its own pool, table and app name, so tests run
// in parallel without seeing each other's rows or elections.
type bundle struct {
	pool  *pgxpool.Pool
	table string
	cfg   relay.Config
}

func setup(t *testing.T) *bundle {
	t.Helper()
	name := pgserver.Name(t)
	b := &bundle{pool: newPool(t, 8), table: name}
	ctx := context.Background()
	require.NoError(t, relay.CreateTable(ctx, b.pool, b.table))
	t.Cleanup(func() {
		_, _ = b.pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+pgx.Identifier{b.table}.Sanitize()+", "+
			pgx.Identifier{b.table + "_types"}.Sanitize())
	})
	b.cfg = relay.DefaultConfig()
	b.cfg.AppName = name
	b.cfg.Table = name
	b.cfg.Interval = 20 * time.Millisecond
	b.cfg.RetryBackoff = 0
	b.cfg.SendTimeout = 5 * time.Second
	b.cfg.Logger = testLogger(t)
	return b
}

func newPool(t testing.TB, maxConns int32) *pgxpool.Pool {
	t.Helper()
	return pgserver.Pool(t, server().URL, pgserver.Name(t), maxConns)
}

func (b *bundle) newRelay(t *testing.T, cfg relay.Config, senders ...relay.Sender) *relay.Relay {
	t.Helper()
	r, err := relay.New(b.pool, cfg, senders...)
	require.NoError(t, err)
	return r
}

// insert writes outbound rows of typ with keys as plain SQL would, in order.
func (b *bundle) insert(t testing.TB, typ string, keys ...string) []int64 {
	t.Helper()
	ids := make([]int64, 0, len(keys))
	for _, k := range keys {
		var id int64
		err := b.pool.QueryRow(context.Background(),
			"INSERT INTO "+pgx.Identifier{b.table}.Sanitize()+" (type, natural_key, payload) VALUES ($1, $2, $3) RETURNING id",
			typ, k, fmt.Sprintf(`{"key": %q}`, k)).Scan(&id)
		require.NoError(t, err)
		ids = append(ids, id)
	}
	return ids
}

func (b *bundle) exec(t testing.TB, sql string, args ...any) {
	t.Helper()
	_, err := b.pool.Exec(context.Background(), fmt.Sprintf(sql, pgx.Identifier{b.table}.Sanitize()), args...)
	require.NoError(t, err)
}

// state is a row as the table holds it.
type state struct {
	Status    string
	Attempts  int
	LastError *string
	SentAt    *time.Time
}

func (b *bundle) state(t testing.TB, id int64) state {
	t.Helper()
	var s state
	err := b.pool.QueryRow(context.Background(),
		"SELECT status, attempts, last_error, sent_at FROM "+pgx.Identifier{b.table}.Sanitize()+" WHERE id = $1", id).
		Scan(&s.Status, &s.Attempts, &s.LastError, &s.SentAt)
	require.NoError(t, err)
	return s
}

func (b *bundle) countStatus(t testing.TB, status string) int {
	t.Helper()
	var n int
	err := b.pool.QueryRow(context.Background(),
		"SELECT count(*) FROM "+pgx.Identifier{b.table}.Sanitize()+" WHERE status = $1", status).Scan(&n)
	require.NoError(t, err)
	return n
}

// deadCount counts the rows at or above the ceiling.
func (b *bundle) deadCount(t testing.TB, ceiling int) int {
	t.Helper()
	var n int
	err := b.pool.QueryRow(context.Background(),
		"SELECT count(*) FROM "+pgx.Identifier{b.table}.Sanitize()+" WHERE status = 'ERROR' AND attempts >= $1", ceiling).Scan(&n)
	require.NoError(t, err)
	return n
}

func (b *bundle) statusOfKey(t testing.TB, key string) string {
	t.Helper()
	var s string
	err := b.pool.QueryRow(context.Background(),
		"SELECT status FROM "+pgx.Identifier{b.table}.Sanitize()+" WHERE natural_key = $1", key).Scan(&s)
	require.NoError(t, err)
	return s
}

// holdLikeJVM takes the election from a separate session exactly as the JVM
// relay does, and returns a func that releases it.
func holdLikeJVM(t testing.TB, app string) (release func()) {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), server().URL)
	require.NoError(t, err)
	var ok bool
	require.NoError(t, conn.QueryRow(context.Background(),
		"SELECT pg_try_advisory_lock(hashtext('"+app+"_relay_m2m'))").Scan(&ok))
	require.True(t, ok, "the JVM-style session must get the lock")
	var once sync.Once
	release = func() {
		once.Do(func() {
			var unlocked bool
			require.NoError(t, conn.QueryRow(context.Background(),
				"SELECT pg_advisory_unlock(hashtext('"+app+"_relay_m2m'))").Scan(&unlocked))
			require.True(t, unlocked)
			require.NoError(t, conn.Close(context.Background()))
		})
	}
	t.Cleanup(release)
	return release
}

// lockFree reports whether another session can take app's election right now.
func lockFree(t testing.TB, app string) bool {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), server().URL)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	var ok bool
	require.NoError(t, conn.QueryRow(context.Background(),
		"SELECT pg_try_advisory_lock(hashtext($1))", app+"_relay_m2m").Scan(&ok))
	if ok {
		_, err = conn.Exec(context.Background(), "SELECT pg_advisory_unlock(hashtext($1))", app+"_relay_m2m")
		require.NoError(t, err)
	}
	return ok
}

// advisoryLocksHeldBy counts the advisory locks held by the pool's sessions.
func advisoryLocksHeldBy(t testing.TB, pool *pgxpool.Pool) int {
	t.Helper()
	var pids []uint32
	for _, c := range pool.AcquireAllIdle(context.Background()) {
		pids = append(pids, c.Conn().PgConn().PID())
		c.Release()
	}
	conn, err := pgx.Connect(context.Background(), server().URL)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	var n int
	require.NoError(t, conn.QueryRow(context.Background(),
		"SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = ANY($1::int[])", pids).Scan(&n))
	return n
}

// recorder is a Sender that records what it was asked to send.
type recorder struct {
	typ string
	fn  func(ctx context.Context, m relay.Message) error

	mu       sync.Mutex
	sent     []relay.Message
	inFlight int
	maxIn    int
}

func newRecorder(typ string, fn func(ctx context.Context, m relay.Message) error) *recorder {
	return &recorder{typ: typ, fn: fn}
}

func (r *recorder) Type() string { return r.typ }

func (r *recorder) Send(ctx context.Context, m relay.Message) error {
	r.mu.Lock()
	r.inFlight++
	r.maxIn = max(r.maxIn, r.inFlight)
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		r.inFlight--
		r.mu.Unlock()
	}()
	var err error
	if r.fn != nil {
		err = r.fn(ctx, m)
	}
	r.mu.Lock()
	r.sent = append(r.sent, m)
	r.mu.Unlock()
	return err
}

func (r *recorder) ids() []int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	ids := make([]int64, len(r.sent))
	for i, m := range r.sent {
		ids[i] = m.ID
	}
	return ids
}

func (r *recorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.sent)
}

func (r *recorder) maxInFlight() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.maxIn
}

// testLogger logs through t.Log until the test ends, and drops lines after that
// (a pass still unwinding must not log into a finished test).
func testLogger(t testing.TB) *slog.Logger {
	w := &testWriter{t: t}
	t.Cleanup(func() {
		w.mu.Lock()
		w.done = true
		w.mu.Unlock()
	})
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type testWriter struct {
	mu   sync.Mutex
	t    testing.TB
	done bool
}

func (w *testWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.done {
		w.t.Log(strings.TrimSpace(string(p)))
	}
	return len(p), nil
}

// logBuffer collects log lines for assertions.
type logBuffer = testlog.Buffer
