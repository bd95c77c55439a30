// Package harness is what the tests that drive a whole Relay against
// PostgreSQL share, wherever they live: the root's tests of the public API and
// the tests beside each mechanism (an external test package such as pass_test
// may import the root). A test's world (Bundle: its own pool, table and app
// name, so tests run in parallel without seeing each other's rows or
// elections), a recording Sender, the JVM's way of taking the election, and
// the probes of the locks.
//
// The package's test binary must have a TestMain that runs pgserver.Run (or
// pgserver.Main): Server is its shared server.
package harness

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/xadm/relay"
	"github.com/xadm/relay/internal/testkit/pgserver"
)

// WaitTimeout bounds a test's wait: generous, because the machine may be
// busy; the tests wait on conditions, never for a duration.
const WaitTimeout = 30 * time.Second

// TakeoverBound is the field-faults issue's target: another replica delivers
// within this long of the leader going silent. The guard's lease gives 10s
// (idle_session_timeout) plus the standby's Interval.
const TakeoverBound = 15 * time.Second

// Server is the test binary's throwaway PostgreSQL (pgserver.Shared).
func Server() *pgserver.Server { return pgserver.Shared() }

// Bundle is one test's world: its own pool, table and app name.
type Bundle struct {
	Pool  *pgxpool.Pool
	Table string
	// Config is a relay's configuration for Table, with the test's name as
	// its app: Interval 20ms, no retry backoff, SendTimeout 5s, a logger
	// that writes to the test's log.
	Config relay.Config
}

// Setup makes the test's Bundle: a pool of 8 connections, the table (dropped
// at the test's end) and its configuration.
func Setup(t *testing.T) *Bundle {
	t.Helper()
	name := pgserver.Name(t)
	b := &Bundle{Pool: NewPool(t, 8), Table: name}
	ctx := context.Background()
	require.NoError(t, relay.CreateTable(ctx, b.Pool, b.Table))
	t.Cleanup(func() {
		_, _ = b.Pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+pgx.Identifier{b.Table}.Sanitize()+", "+
			pgx.Identifier{b.Table + "_types"}.Sanitize())
	})
	b.Config = relay.DefaultConfig()
	b.Config.AppName = name
	b.Config.Table = name
	b.Config.Interval = 20 * time.Millisecond
	b.Config.RetryBackoff = 0
	b.Config.SendTimeout = 5 * time.Second
	b.Config.Logger = TestLogger(t)
	return b
}

// NewPool is a pool of at most maxConns connections to Server, its
// application_name the test's name, closed at the test's end.
func NewPool(t testing.TB, maxConns int32) *pgxpool.Pool {
	t.Helper()
	return pgserver.Pool(t, Server().URL, pgserver.Name(t), maxConns)
}

// NewRelay is relay.New on the Bundle's pool; an error fails the test.
func (b *Bundle) NewRelay(t *testing.T, cfg relay.Config, senders ...relay.Sender) *relay.Relay {
	t.Helper()
	r, err := relay.New(b.Pool, cfg, senders...)
	require.NoError(t, err)
	return r
}

// Insert writes outbound rows of typ with keys as plain SQL would, in order.
func (b *Bundle) Insert(t testing.TB, typ string, keys ...string) []int64 {
	t.Helper()
	ids := make([]int64, 0, len(keys))
	for _, k := range keys {
		var id int64
		err := b.Pool.QueryRow(context.Background(),
			"INSERT INTO "+pgx.Identifier{b.Table}.Sanitize()+" (type, natural_key, payload) VALUES ($1, $2, $3) RETURNING id",
			typ, k, fmt.Sprintf(`{"key": %q}`, k)).Scan(&id)
		require.NoError(t, err)
		ids = append(ids, id)
	}
	return ids
}

// Exec runs sql with the table's quoted name in its %s.
func (b *Bundle) Exec(t testing.TB, sql string, args ...any) {
	t.Helper()
	_, err := b.Pool.Exec(context.Background(), fmt.Sprintf(sql, pgx.Identifier{b.Table}.Sanitize()), args...)
	require.NoError(t, err)
}

// State is a row as the table holds it.
type State struct {
	Status    string
	Attempts  int
	LastError *string
	SentAt    *time.Time
}

// State reads the row id.
func (b *Bundle) State(t testing.TB, id int64) State {
	t.Helper()
	var s State
	err := b.Pool.QueryRow(context.Background(),
		"SELECT status, attempts, last_error, sent_at FROM "+pgx.Identifier{b.Table}.Sanitize()+" WHERE id = $1", id).
		Scan(&s.Status, &s.Attempts, &s.LastError, &s.SentAt)
	require.NoError(t, err)
	return s
}

// CountStatus counts the rows of status.
func (b *Bundle) CountStatus(t testing.TB, status string) int {
	t.Helper()
	var n int
	err := b.Pool.QueryRow(context.Background(),
		"SELECT count(*) FROM "+pgx.Identifier{b.Table}.Sanitize()+" WHERE status = $1", status).Scan(&n)
	require.NoError(t, err)
	return n
}

// DeadCount counts the rows at or above the ceiling.
func (b *Bundle) DeadCount(t testing.TB, ceiling int) int {
	t.Helper()
	var n int
	err := b.Pool.QueryRow(context.Background(),
		"SELECT count(*) FROM "+pgx.Identifier{b.Table}.Sanitize()+" WHERE status = 'ERROR' AND attempts >= $1", ceiling).Scan(&n)
	require.NoError(t, err)
	return n
}

// StatusOfKey is the status of the one row of key.
func (b *Bundle) StatusOfKey(t testing.TB, key string) string {
	t.Helper()
	var s string
	err := b.Pool.QueryRow(context.Background(),
		"SELECT status FROM "+pgx.Identifier{b.Table}.Sanitize()+" WHERE natural_key = $1", key).Scan(&s)
	require.NoError(t, err)
	return s
}

// HoldLikeJVM takes the election from a separate session exactly as the JVM
// relay does, and returns a func that releases it.
func HoldLikeJVM(t testing.TB, app string) (release func()) {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), Server().URL)
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

// LockFree reports whether another session can take app's election right now.
func LockFree(t testing.TB, app string) bool {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), Server().URL)
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

// AdvisoryLocksHeldBy counts the advisory locks held by the pool's sessions.
func AdvisoryLocksHeldBy(t testing.TB, pool *pgxpool.Pool) int {
	t.Helper()
	var pids []uint32
	for _, c := range pool.AcquireAllIdle(context.Background()) {
		pids = append(pids, c.Conn().PgConn().PID())
		c.Release()
	}
	conn, err := pgx.Connect(context.Background(), Server().URL)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	var n int
	require.NoError(t, conn.QueryRow(context.Background(),
		"SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = ANY($1::int[])", pids).Scan(&n))
	return n
}

// ElectionHolders returns the backends holding app's election, as seen from a
// direct session.
func ElectionHolders(t testing.TB, app string) []int32 {
	t.Helper()
	pids, err := HoldersOf(context.Background(), app)
	require.NoError(t, err)
	return pids
}

// HoldersOf is ElectionHolders for a sender's goroutine, where require cannot
// stop the test.
func HoldersOf(ctx context.Context, app string) ([]int32, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, Server().URL)
	if err != nil {
		return nil, err
	}
	defer conn.Close(ctx)
	var pids []int32
	err = conn.QueryRow(ctx, `SELECT coalesce(array_agg(pid ORDER BY pid), '{}') FROM pg_locks
		WHERE locktype = 'advisory' AND objsubid = 1 AND granted
		  AND classid = ((hashtext($1)::bigint >> 32) & 4294967295)::oid
		  AND objid = (hashtext($1)::bigint & 4294967295)::oid`, app+relay.LockKeySuffix).Scan(&pids)
	return pids, err
}

// DistinctKeys returns n natural keys, all different, so that Concurrency
// applies to all: prefix-000 and up.
func DistinctKeys(prefix string, n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("%s-%03d", prefix, i)
	}
	return keys
}

// Recorder is a Sender that records what it was asked to send.
type Recorder struct {
	typ string
	fn  func(ctx context.Context, m relay.Message) error

	mu sync.Mutex
	// Sent are the messages sent, in the order their Sends returned; read
	// it once the sends are over.
	Sent     []relay.Message
	inFlight int
	maxIn    int
}

// NewRecorder is a Recorder of typ whose Send calls fn, if not nil, and
// records the message.
func NewRecorder(typ string, fn func(ctx context.Context, m relay.Message) error) *Recorder {
	return &Recorder{typ: typ, fn: fn}
}

// Type is the type given to NewRecorder.
func (r *Recorder) Type() string { return r.typ }

// Send calls the function given to NewRecorder and records m.
func (r *Recorder) Send(ctx context.Context, m relay.Message) error {
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
	r.Sent = append(r.Sent, m)
	r.mu.Unlock()
	return err
}

// IDs are the ids of the messages sent so far, in order.
func (r *Recorder) IDs() []int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	ids := make([]int64, len(r.Sent))
	for i, m := range r.Sent {
		ids[i] = m.ID
	}
	return ids
}

// Count is the number of messages sent so far.
func (r *Recorder) Count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.Sent)
}

// MaxInFlight is the most Sends that were running at once.
func (r *Recorder) MaxInFlight() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.maxIn
}

// TestLogger logs through t.Log until the test ends, and drops lines after
// that (a pass still unwinding must not log into a finished test).
func TestLogger(t testing.TB) *slog.Logger {
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
