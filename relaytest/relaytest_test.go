package relaytest_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/xadm/relay"
	"github.com/xadm/relay/relaytest"
)

func TestMain(m *testing.M) { relaytest.Main(m) }

// TestNothingSentWhileAnotherReplicaHoldsTheLock is the README's test: the
// guard, proved from an adopter's suite.
func TestNothingSentWhileAnotherReplicaHoldsTheLock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := relaytest.Database(t)
	relaytest.CreateTable(t, pool, relay.TableDefault)
	relaytest.Enqueue(t, pool, relay.TableDefault, "order", "order-1", map[string]int{"id": 1})
	orders := relaytest.NewRecorder("order")
	cfg := relay.DefaultConfig()
	cfg.AppName = "billing"
	r, err := relay.New(pool, cfg, orders)
	require.NoError(t, err)

	release := relaytest.HoldElection(t, pool, cfg.AppName) // another replica, or the JVM relay
	ran, err := r.RunIfElected(ctx)
	require.NoError(t, err)
	require.False(t, ran, "coalesced: another replica holds the election")
	require.Empty(t, orders.Messages(), "nothing is sent")

	release()
	ran, err = r.RunIfElected(ctx)
	require.NoError(t, err)
	require.True(t, ran)
	require.Len(t, orders.Messages(), 1)
	require.Equal(t, "order-1", orders.Messages()[0].Key)
}

func TestDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("EachCallIsAFreshDatabase", func(t *testing.T) {
		t.Parallel()
		a, b := relaytest.Database(t), relaytest.Database(t)
		require.NotEqual(t, currentDatabase(t, a), currentDatabase(t, b))
		require.True(t, strings.HasPrefix(currentDatabase(t, a), "relaytest_"))
		var tables int
		require.NoError(t, a.QueryRow(ctx, `SELECT count(*) FROM pg_tables WHERE schemaname = 'public'`).Scan(&tables))
		require.Zero(t, tables, "an empty database")
		require.GreaterOrEqual(t, a.Config().MaxConns, int32(2), "room for a relay and its election")
	})

	t.Run("DroppedWhenTheTestEnds", func(t *testing.T) {
		t.Parallel()
		var name string
		t.Run("Inner", func(t *testing.T) {
			pool := relaytest.Database(t)
			name = currentDatabase(t, pool)
			// A session left open, as by a relay nobody stopped, does not keep it alive.
			_, err := pgx.ConnectConfig(ctx, pool.Config().ConnConfig.Copy())
			require.NoError(t, err)
		})
		other := relaytest.Database(t)
		var exists bool
		require.NoError(t, other.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&exists))
		require.False(t, exists, "database %s was dropped", name)
	})

	t.Run("LongTestNamesMakeValidNames", func(t *testing.T) {
		t.Parallel()
		t.Run(strings.Repeat("Very Long-Name ", 10), func(t *testing.T) {
			name := currentDatabase(t, relaytest.Database(t))
			require.LessOrEqual(t, len(name), 63)
			require.Regexp(t, `^relaytest_[a-z0-9_]+_[0-9a-f]{8}$`, name)
		})
	})
}

func currentDatabase(t testing.TB, q interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) string {
	t.Helper()
	var name string
	require.NoError(t, q.QueryRow(context.Background(), "SELECT current_database()").Scan(&name))
	return name
}

func TestCreateTable(t *testing.T) {
	t.Parallel()
	pool := relaytest.Database(t)
	relaytest.CreateTable(t, pool, "outbox")
	relaytest.CreateTable(t, pool, "outbox") // idempotent
	id := relaytest.Enqueue(t, pool, "outbox", "order", "o-1", json.RawMessage(`{"id": 1}`))
	require.Positive(t, id)

	ft := &fakeT{TB: t}
	ft.run(func() { relaytest.CreateTable(ft, pool, "no such; table") })
	require.Len(t, ft.failures, 1)
	require.Contains(t, ft.failures[0], "relaytest: ")
}

func TestEnqueue(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := relaytest.Database(t)
	relaytest.CreateTable(t, pool, relay.TableDefault)
	id := relaytest.Enqueue(t, pool, relay.TableDefault, "order", "o-1", struct {
		ID    int    `json:"id"`
		Total string `json:"total"`
	}{7, "9.90"})
	var payload, status string
	require.NoError(t, pool.QueryRow(ctx, "SELECT payload::text, status FROM mensagem_m2m WHERE id = $1", id).Scan(&payload, &status))
	require.JSONEq(t, `{"id": 7, "total": "9.90"}`, payload)
	require.Equal(t, "PENDING", status)

	for name, call := range map[string]func(t testing.TB){
		"Unmarshallable": func(t testing.TB) { relaytest.Enqueue(t, pool, relay.TableDefault, "order", "o-2", func() {}) },
		"EmptyKey":       func(t testing.TB) { relaytest.Enqueue(t, pool, relay.TableDefault, "order", "", 1) },
	} {
		ft := &fakeT{TB: t}
		ft.run(func() { call(ft) })
		require.Len(t, ft.failures, 1, name)
		require.Contains(t, ft.failures[0], "relaytest: ", name)
	}
}

func TestHoldElection(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("TheRelaysOwnGuardCoalesces", func(t *testing.T) {
		t.Parallel()
		pool := relaytest.Database(t)
		relaytest.HoldElection(t, pool, "billing")
		ran, err := relay.NewPostgresGuard(pool).TryRun(ctx, "billing"+relay.LockKeySuffix, func(context.Context) error {
			t.Error("the job ran while another session held the election")
			return nil
		})
		require.NoError(t, err)
		require.False(t, ran)
		ran, err = relay.NewPostgresGuard(pool).TryRun(ctx, "shipping"+relay.LockKeySuffix, func(context.Context) error { return nil })
		require.NoError(t, err)
		require.True(t, ran, "another app is not blocked")
	})

	t.Run("TheSameStatementAsTheJVM", func(t *testing.T) {
		t.Parallel()
		pool := relaytest.Database(t)
		release := relaytest.HoldElection(t, pool, "billing")
		var got bool
		// The JVM relay's own statement, literally.
		require.NoError(t, pool.QueryRow(ctx, "SELECT pg_try_advisory_lock(hashtext('billing_relay_m2m'))").Scan(&got))
		require.False(t, got)
		release()
		conn, err := pool.Acquire(ctx)
		require.NoError(t, err)
		defer conn.Release()
		require.NoError(t, conn.QueryRow(ctx, "SELECT pg_try_advisory_lock(hashtext('billing_relay_m2m'))").Scan(&got))
		require.True(t, got)
		_, err = conn.Exec(ctx, "SELECT pg_advisory_unlock(hashtext('billing_relay_m2m'))")
		require.NoError(t, err)
	})

	t.Run("FailsTheTestWhenAlreadyHeld", func(t *testing.T) {
		t.Parallel()
		pool := relaytest.Database(t)
		relaytest.HoldElection(t, pool, "billing")
		ft := &fakeT{TB: t}
		ft.run(func() { relaytest.HoldElection(ft, pool, "billing") })
		require.Len(t, ft.failures, 1)
		require.Contains(t, ft.failures[0], `the election "billing_relay_m2m" is held by another session already`)
	})

	t.Run("ReleaseIsIdempotentAndRunsAtCleanup", func(t *testing.T) {
		t.Parallel()
		pool := relaytest.Database(t)
		release := relaytest.HoldElection(t, pool, "billing")
		release()
		release()
		t.Run("HeldUntilTheEnd", func(t *testing.T) {
			relaytest.HoldElection(t, pool, "billing") // never released by the test
		})
		relaytest.HoldElection(t, pool, "billing") // free again: the cleanup released it
		require.Equal(t, 1, heldSessions(t, pool), "one session holds it: the last one")
	})

	t.Run("ElectionsArePerDatabase", func(t *testing.T) {
		t.Parallel()
		// Advisory locks belong to one database: parallel tests, each on its
		// own database, may use the same app name without seeing each other.
		a, b := relaytest.Database(t), relaytest.Database(t)
		relaytest.HoldElection(t, a, "billing")
		relaytest.HoldElection(t, b, "billing")
	})
}

// heldSessions counts the sessions holding an advisory lock on pool's database.
func heldSessions(t testing.TB, pool interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_locks
		WHERE locktype = 'advisory' AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&n))
	return n
}

func TestRecorder(t *testing.T) {
	t.Parallel()
	rec := relaytest.NewRecorder("order")
	require.Equal(t, "order", rec.Type())
	require.Empty(t, rec.Messages())
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Go(func() {
			require.NoError(t, rec.Send(context.Background(), relay.Message{ID: int64(i), Type: "order"}))
		})
	}
	wg.Wait()
	msgs := rec.Messages()
	require.Len(t, msgs, 50)
	msgs[0].ID = -1
	require.NotEqual(t, int64(-1), rec.Messages()[0].ID, "Messages returns a copy")
}

// TestServerDiesWithTheTestBinary kills, with SIGKILL, a test binary that
// started its own server and never called Main, and checks that the server
// does not outlive it.
func TestServerDiesWithTheTestBinary(t *testing.T) {
	if os.Getenv(childEnv) == "1" {
		serveUntilKilled(t)
		return
	}
	t.Parallel()
	cmd := exec.Command(os.Args[0], "-test.run=^TestServerDiesWithTheTestBinary$", "-test.v",
		"-test.timeout="+(startTimeout+time.Minute).String())
	cmd.Env = append(withoutEnv(os.Environ(), relaytest.EnvDatabaseURL), childEnv+"=1")
	dieWithThisTest(cmd)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	reported, drained := make(chan struct{}), make(chan struct{})
	killed := false
	t.Cleanup(func() {
		if !killed {
			_ = cmd.Process.Kill()
			<-drained
			_ = cmd.Wait()
		}
	})

	var url, dataDir string
	go func() {
		defer close(drained)
		lines := bufio.NewScanner(stdout)
		for (url == "" || dataDir == "") && lines.Scan() {
			if v, ok := strings.CutPrefix(lines.Text(), "URL="); ok {
				url = v
			}
			if v, ok := strings.CutPrefix(lines.Text(), "DATA="); ok {
				dataDir = v
			}
		}
		close(reported)
		_, _ = io.Copy(io.Discard, stdout) // the rest, until the child dies
	}()
	select {
	case <-reported:
	case <-drained:
	case <-time.After(startTimeout):
		t.Fatal("the child did not report its server")
	}
	require.NotEmpty(t, url, "the child reported its server")
	require.True(t, reachable(url), "the child's server runs")

	require.NoError(t, cmd.Process.Kill()) // no Main, no cleanup: the process just ends
	killed = true
	<-drained
	_ = cmd.Wait()
	// A local cluster gets SIGQUIT from the kernel at once; a container is
	// removed by testcontainers' reaper a few seconds later.
	require.Eventually(t, func() bool { return !reachable(url) }, time.Minute, 100*time.Millisecond,
		"the server outlived the test binary")

	// A local cluster's directory is what a test binary without Main leaves behind; tidy it.
	if dir := filepath.Dir(dataDir); strings.HasPrefix(filepath.Base(dir), "pgserver-") && filepath.Dir(dir) == filepath.Clean(os.TempDir()) {
		require.NoError(t, os.RemoveAll(dir))
	}
}

const childEnv = "RELAYTEST_CHILD"

// startTimeout bounds how long the child may take to start its server.
const startTimeout = 5 * time.Minute

// serveUntilKilled is the child of TestServerDiesWithTheTestBinary: it starts
// a server, reports it and waits to be killed.
func serveUntilKilled(t *testing.T) {
	pool := relaytest.Database(t)
	var dataDir string
	_ = pool.QueryRow(context.Background(), "SHOW data_directory").Scan(&dataDir)
	fmt.Printf("URL=%s\nDATA=%s\n", pool.Config().ConnString(), dataDir)
	select {}
}

func reachable(url string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return false
	}
	conn.Close(ctx)
	return true
}

func withoutEnv(env []string, name string) []string {
	out := env[:0:0]
	for _, kv := range env {
		if !strings.HasPrefix(kv, name+"=") {
			out = append(out, kv)
		}
	}
	return out
}

// fakeT stands in for a test's testing.TB to observe how the kit fails a
// test: it records Fatal and Error calls, and Fatal ends the function run
// runs, as it ends a test. Everything else goes to the real TB.
type fakeT struct {
	testing.TB
	mu       sync.Mutex
	failures []string
}

func (f *fakeT) Errorf(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failures = append(f.failures, fmt.Sprintf(format, args...))
}

func (f *fakeT) Fatalf(format string, args ...any) {
	f.Errorf(format, args...)
	runtime.Goexit()
}

// run runs fn on a goroutine of its own, as a test runs, and waits for it.
func (f *fakeT) run(fn func()) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		fn()
	}()
	<-done
}

// exampleT stands in, in the examples, for the *testing.T of the test you
// would write: relaytest needs only its Helper, Name, Cleanup and Fatalf.
type exampleT struct {
	testing.TB // nil: the methods below are all the examples use
	cleanups   []func()
}

func newExampleT() *exampleT { return &exampleT{} }

func (e *exampleT) Helper()                           {}
func (e *exampleT) Name() string                      { return "Example" }
func (e *exampleT) Cleanup(f func())                  { e.cleanups = append(e.cleanups, f) }
func (e *exampleT) Logf(string, ...any)               {}
func (e *exampleT) Errorf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }
func (e *exampleT) Fatalf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }

// finish runs the cleanups, last registered first, as a test's end does.
func (e *exampleT) finish() {
	for i := len(e.cleanups) - 1; i >= 0; i-- {
		e.cleanups[i]()
	}
}
