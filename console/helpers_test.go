package console_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/xadm/relay"
	"github.com/xadm/relay/console"
	"github.com/xadm/relay/internal/testkit/pgserver"
	"github.com/xadm/relay/internal/testkit/testlog"
)

// TestMain gets a real PostgreSQL (RELAY_TEST_DATABASE_URL, or the local
// binaries) and checks that no goroutine was left behind.
func TestMain(m *testing.M) { os.Exit(pgserver.Run(m, "RELAY_TEST_DATABASE_URL")) }

// ceiling is the tests' MaxAttempts.
const ceiling = 3

// world is one test's app and table, and a console over them.
type world struct {
	pool  *pgxpool.Pool
	app   string
	table string
	cfg   relay.Config
	admin *relay.Admin
	logs  *logBuffer
}

func setup(t *testing.T) *world {
	t.Helper()
	name := pgserver.Name(t)
	w := &world{pool: pgserver.Pool(t, pgserver.Shared().URL, name, 8), app: name, table: name, logs: &logBuffer{}}
	require.NoError(t, relay.CreateTable(context.Background(), w.pool, name))
	t.Cleanup(func() {
		_, _ = w.pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+pgx.Identifier{name}.Sanitize())
	})
	w.cfg = relay.DefaultConfig()
	w.cfg.AppName, w.cfg.Table, w.cfg.MaxAttempts = name, name, ceiling
	w.cfg.Logger = w.logs.Logger()
	var err error
	w.admin, err = relay.NewAdmin(w.pool, w.cfg, relay.AdminAllTypes())
	require.NoError(t, err)
	return w
}

// exec runs sql with the table's quoted name for %s.
func (w *world) exec(t testing.TB, sql string, args ...any) {
	t.Helper()
	_, err := w.pool.Exec(context.Background(), fmt.Sprintf(sql, pgx.Identifier{w.table}.Sanitize()), args...)
	require.NoError(t, err)
}

// rows writes n outbound rows of typ in status with attempts, written age ago,
// and returns the first id.
func (w *world) rows(t testing.TB, typ string, n int, status string, attempts int, age time.Duration) int64 {
	t.Helper()
	var first int64
	err := w.pool.QueryRow(context.Background(), fmt.Sprintf(`WITH ins AS (
		INSERT INTO %s (type, natural_key, payload, status, attempts, last_error, created_at, updated_at, sent_at)
		SELECT $1, $1 || '-' || g, jsonb_build_object('order', g, 'note', 'a payload of ' || $1), $3, $4,
			CASE WHEN $3 = 'ERROR' THEN 'PUT http://' || $1 || '.internal/' || $1 || '/' || g || ': 422 Unprocessable Entity: {"error":"field total is required"}' END,
			now() - make_interval(secs => $5), now() - make_interval(secs => $5 / 2),
			CASE WHEN $3 = 'SENT' THEN now() - make_interval(secs => $5 / 2) END
		FROM generate_series(1, $2) g RETURNING id)
		SELECT coalesce(min(id), 0) FROM ins`, pgx.Identifier{w.table}.Sanitize()), typ, n, status, attempts, age.Seconds()).Scan(&first)
	require.NoError(t, err)
	return first
}

func (w *world) status(t testing.TB, id int64) (status string, attempts int) {
	t.Helper()
	require.NoError(t, w.pool.QueryRow(context.Background(),
		fmt.Sprintf("SELECT status, attempts FROM %s WHERE id = $1", pgx.Identifier{w.table}.Sanitize()), id).Scan(&status, &attempts))
	return status, attempts
}

// countDead counts w's dead rows.
func (w *world) countDead(t testing.TB) int {
	t.Helper()
	var n int
	require.NoError(t, w.pool.QueryRow(context.Background(), fmt.Sprintf("SELECT count(*) FROM %s WHERE status = 'ERROR' AND attempts >= $1",
		pgx.Identifier{w.table}.Sanitize()), ceiling).Scan(&n))
	return n
}

// holdLikeJVM takes w's election from a session of its own, as a JVM relay
// does, until the test ends, and returns its pid.
func (w *world) holdLikeJVM(t testing.TB) uint32 {
	t.Helper()
	ctx := context.Background()
	cc, err := pgx.ParseConfig(pgserver.Shared().URL)
	require.NoError(t, err)
	cc.RuntimeParams["application_name"] = "PostgreSQL JDBC Driver"
	conn, err := pgx.ConnectConfig(ctx, cc)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	var ok bool
	var pid uint32
	require.NoError(t, conn.QueryRow(ctx, "SELECT pg_try_advisory_lock(hashtext($1 || '_relay_m2m')), pg_backend_pid()", w.app).Scan(&ok, &pid))
	require.True(t, ok)
	return pid
}

// users is the tests' Authorize: the "user" cookie names who asks; "admin"
// may act, "viewer" may only see, anyone else may not see.
func users(r *http.Request) (who string, canSee, canAct bool) {
	ck, err := r.Cookie("user")
	if err != nil {
		return "nobody", false, false
	}
	switch ck.Value {
	case "admin":
		return "admin", true, true
	case "viewer":
		return "viewer", true, false
	}
	return ck.Value, false, false
}

// serve starts a console for opts (its Logger and, if unset, its Sources
// filled in from w) on a test server and returns the server.
func (w *world) serve(t *testing.T, opts console.Options) *httptest.Server {
	t.Helper()
	if opts.Sources == nil {
		opts.Sources = []console.Source{{Admin: w.admin}}
	}
	opts.Logger = w.logs.Logger()
	c, err := console.New(opts)
	require.NoError(t, err)
	srv := httptest.NewServer(c)
	t.Cleanup(srv.Close)
	return srv
}

// logBuffer collects log lines for assertions.
type logBuffer = testlog.Buffer

// recorder is a Sender of one type that records the ids it delivered.
type recorder struct {
	typ string
	mu  sync.Mutex
	ids []int64
}

func (r *recorder) Type() string { return r.typ }

func (r *recorder) Send(_ context.Context, m relay.Message) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ids = append(r.ids, m.ID)
	return nil
}

func (r *recorder) delivered() []int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]int64(nil), r.ids...)
}
