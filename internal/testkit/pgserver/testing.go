package pgserver

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"regexp"
	"runtime"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/xadm/relay/internal/testkit/testcerts"
)

// shared is the server Main started.
var shared *Server

// Main is for TestMain: os.Exit(Run(m, "RELAY_TEST_DATABASE_URL")).
func Main(m *testing.M) { os.Exit(Run(m, "RELAY_TEST_DATABASE_URL")) }

// Run is the body of a TestMain: it starts a server with Start(ctx, envVar),
// exposes it through Shared, runs the tests, stops the server and then checks
// that no goroutine was left behind. It returns the exit code. If no server can
// be started it prints why to stderr and returns 1: tests never skip because no
// database was found.
func Run(m *testing.M, envVar string) int {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	s, err := Start(ctx, envVar)
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	shared = s
	code := m.Run()
	noteSkips(pgBouncerSkips.Load(), testing.Verbose(), os.Stderr, openTerminal)
	if err := s.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "pgserver: stopping the shared server:", err)
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutines left behind by the tests:", err)
			code = 1
		}
	}
	return code
}

// Shared returns the server Main started. It panics if TestMain did not call Main.
func Shared() *Server {
	if shared == nil {
		panic("pgserver.Shared: call pgserver.Main(m) in TestMain first")
	}
	return shared
}

var notIdent = regexp.MustCompile(`[^a-z0-9]+`)

// Name returns a unique, valid, lowercase SQL identifier of at most 63 bytes made of
// t.Name() and a random suffix, for per-test tables and keys in parallel tests.
func Name(t testing.TB) string {
	suffix := fmt.Sprintf("_%08x", rand.Uint32())
	base := strings.Trim(notIdent.ReplaceAllString(strings.ToLower(t.Name()), "_"), "_")
	if base == "" || base[0] >= '0' && base[0] <= '9' {
		base = "t_" + base
	}
	if n := 63 - len(suffix); len(base) > n {
		base = strings.TrimRight(base[:n], "_")
	}
	return base + suffix
}

// RequirePgBouncer skips t, saying what to install, when pgbouncer is not
// installed: the library's own tests need only PostgreSQL on a fresh machine.
// With RELAY_TEST_REQUIRE_PGBOUNCER set (CI sets it) a missing pgbouncer fails t.
func RequirePgBouncer(t testing.TB) {
	t.Helper()
	if findPgBouncer() != "" {
		return
	}
	const msg = "pgbouncer is not installed: the pooler tests need it (Debian: apt-get install -y pgbouncer)"
	if os.Getenv("RELAY_TEST_REQUIRE_PGBOUNCER") != "" {
		t.Fatal(msg)
	}
	pgBouncerSkips.Add(1)
	t.Skip(msg)
}

// pgBouncerSkips counts the tests RequirePgBouncer skipped, for noteSkips.
var pgBouncerSkips atomic.Int64

// noteSkips tells, after the tests, how many RequirePgBouncer skipped (n), in
// one line. go test ./... shows nothing a passing package prints unless -v is
// given, so without -v the line goes to the terminal that runs go test, and to
// stderr only when there is none (CI, a pipe), where -v shows it.
func noteSkips(n int64, verbose bool, stderr io.Writer, terminal func() (io.WriteCloser, error)) {
	if n == 0 {
		return
	}
	pkg := "pgserver"
	if bi, ok := debug.ReadBuildInfo(); ok {
		pkg = strings.TrimSuffix(bi.Path, ".test")
	}
	tests := "tests"
	if n == 1 {
		tests = "test"
	}
	line := fmt.Sprintf("%s: %d %s skipped: pgbouncer is not installed (Debian: apt-get install -y pgbouncer)\n", pkg, n, tests)
	if !verbose {
		if tty, err := terminal(); err == nil {
			_, err = io.WriteString(tty, line)
			_ = tty.Close()
			if err == nil {
				return
			}
		}
	}
	_, _ = io.WriteString(stderr, line)
}

// openTerminal opens the controlling terminal for writing.
func openTerminal() (io.WriteCloser, error) {
	name := "/dev/tty"
	if runtime.GOOS == "windows" {
		name = "CONOUT$"
	}
	return os.OpenFile(name, os.O_WRONLY, 0)
}

// Pool opens a pool of maxConns connections on url for t, closed when t ends.
// A non-empty app becomes the sessions' application_name, so that a test can
// find them in pg_stat_activity and pg_locks; configure changes anything else.
func Pool(t testing.TB, url, app string, maxConns int32, configure ...func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	pc.MaxConns = maxConns
	if app != "" {
		pc.ConnConfig.RuntimeParams["application_name"] = app
	}
	for _, c := range configure {
		c(pc)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closePool(t, pool, app) })
	return pool
}

// poolCloseWait bounds how long a test's cleanup waits for its pool's Close,
// which waits for every acquired connection to be given back: a connection
// that never is, a leak, fails the test that leaked it and names the count,
// instead of hanging the package until its timeout.
const poolCloseWait = time.Minute

func closePool(t testing.TB, pool *pgxpool.Pool, app string) {
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		pool.Close()
	}()
	select {
	case <-closed:
	case <-time.After(poolCloseWait):
		t.Errorf("pgserver: pool %q: %d connection(s) still acquired %s after its Close began: a connection was never given back",
			app, pool.Stat().AcquiredConns(), poolCloseWait)
	}
}

// StartTLS starts, for t, a local cluster of its own that accepts TCP over
// TLS only, serving a certificate of ca, a CA made for t; the server's URL
// verifies it (sslmode=verify-full, sslrootcert ca). The cluster is removed
// when t ends.
func StartTLS(t testing.TB) (*Server, *testcerts.CA) {
	t.Helper()
	ca, err := testcerts.NewCA(t.Name() + " CA")
	if err != nil {
		t.Fatal(err)
	}
	pair, err := ca.Server()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	s, err := StartLocal(ctx, Options{TLS: &TLS{CertPEM: pair.CertPEM, KeyPEM: pair.KeyPEM, CAPEM: ca.CertPEM}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Stop(); err != nil {
			t.Errorf("pgserver: stopping the TLS server: %v", err)
		}
	})
	return s, ca
}
