package pgserver

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// orphanChildEnv names, in the child process of TestServerDiesWithItsProcess,
// the orphanModes entry to run.
const orphanChildEnv = "PGSERVER_TEST_ORPHAN_MODE"

// TestServerDiesWithItsProcess kills a process (SIGKILL; TerminateProcess on
// Windows) that started a local cluster, and a pgbouncer when one is installed,
// without any chance to clean up, and checks that neither server outlives it,
// for each way this OS has (orphanModes).
func TestServerDiesWithItsProcess(t *testing.T) {
	if mode := os.Getenv(orphanChildEnv); mode != "" {
		serveUntilKilled(t, mode)
		return
	}
	t.Parallel()
	require.NotEmpty(t, findBinDir(t.Context()), "local PostgreSQL binaries")
	for mode := range orphanModes {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			testServerDiesWithItsProcess(t, mode)
		})
	}
}

func testServerDiesWithItsProcess(t *testing.T, mode string) {
	cmd := exec.Command(os.Args[0], "-test.run=^TestServerDiesWithItsProcess$", "-test.v", "-test.timeout=5m")
	// The child's TestMain takes the shared server from the environment instead
	// of starting one; the cluster under test is the one the test function starts.
	cmd.Env = append(os.Environ(), orphanChildEnv+"="+mode, "RELAY_TEST_DATABASE_URL="+Shared().URL)
	cmd.SysProcAttr = sysProcAttr(nil)
	dieWithParent(cmd.SysProcAttr, syscall.SIGKILL) // the child never outlives this test, where the OS allows
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	killed := false
	reported, drained := make(chan struct{}), make(chan struct{})
	t.Cleanup(func() {
		if !killed {
			_ = cmd.Process.Kill()
			<-drained
			_ = cmd.Wait()
		}
	})

	found := map[string]string{}
	go func() {
		defer close(drained)
		lines := bufio.NewScanner(stdout)
		for found["DONE"] == "" && lines.Scan() {
			if k, v, ok := strings.Cut(lines.Text(), "="); ok && strings.ToUpper(k) == k {
				found[k] = v
			}
		}
		close(reported)
		_, _ = io.Copy(io.Discard, stdout) // the rest, until the child dies
	}()
	select {
	case <-reported:
	case <-drained:
	case <-time.After(5 * time.Minute):
		t.Fatal("the child did not report its servers")
	}
	require.NotEmpty(t, found["URL"], "the child reported its cluster")
	urls := []string{found["URL"]}
	if found["BOUNCER"] != "" {
		urls = append(urls, found["BOUNCER"])
	}
	for _, u := range urls {
		require.True(t, reachable(u), "%s runs before the kill", u)
	}

	t.Cleanup(func() {
		if t.Failed() { // do not leave the survivor running
			killPostmaster(found["DIR"])
		}
	})
	require.NoError(t, cmd.Process.Kill()) // no Stop, no cleanup: the process just ends
	killed = true
	<-drained
	_ = cmd.Wait()
	for _, u := range urls {
		require.Eventually(t, func() bool { return !listening(t, u) }, time.Minute, 50*time.Millisecond,
			"%s outlived the process that started it", u)
	}
	// Their directories are what such a process leaves behind (removeStale takes
	// them hours later); tidy them.
	for _, k := range []string{"DIR", "BOUNCER_DIR"} {
		if dir := found[k]; dir != "" {
			require.Equal(t, filepath.Clean(os.TempDir()), filepath.Dir(dir))
			// Windows may keep a dead process's files locked for a moment.
			require.Eventually(t, func() bool { return os.RemoveAll(dir) == nil }, time.Minute, 50*time.Millisecond,
				"remove %s", dir)
		}
	}
}

// killPostmaster kills the postmaster of the cluster in dir, if it runs.
func killPostmaster(dir string) {
	pidFile, err := os.ReadFile(filepath.Join(dir, "data", "postmaster.pid"))
	if err != nil {
		return
	}
	first, _, _ := strings.Cut(string(pidFile), "\n")
	if pid, err := strconv.Atoi(strings.TrimSpace(first)); err == nil {
		if p, err := os.FindProcess(pid); err == nil {
			_ = p.Kill()
		}
	}
}

// serveUntilKilled is the child of TestServerDiesWithItsProcess: it starts a
// cluster and, when installed, a pgbouncer in front of it, in the given
// orphanModes way, reports them and waits to be killed.
func serveUntilKilled(t *testing.T, mode string) {
	prepare, ok := orphanModes[mode]
	require.True(t, ok, "orphan mode %q", mode)
	prepare()
	ctx := context.Background()
	s, err := startLocal(ctx, findBinDir(ctx))
	require.NoError(t, err)
	fmt.Printf("URL=%s\nDIR=%s\n", s.URL, s.local.dir)
	if findPgBouncer() != "" {
		b, err := StartPgBouncer(ctx, s, "session")
		require.NoError(t, err)
		fmt.Printf("BOUNCER=%s\nBOUNCER_DIR=%s\n", b.URL, b.dir)
	}
	fmt.Println("DONE=1")
	select {}
}

// listening reports whether something listens on url's TCP port. Unlike a
// failed connection, which a starved server also gives, a refused TCP
// connection proves the server is gone: the kernel completes the handshake of
// a listening socket whether or not its process gets to run.
func listening(t *testing.T, url string) bool {
	cfg, err := pgx.ParseConfig(url)
	require.NoError(t, err)
	conn, err := net.DialTimeout("tcp", net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))), 5*time.Second)
	if err != nil {
		return false
	}
	conn.Close()
	return true
}

// reachable reports whether a pgx connection to url can be opened within two seconds.
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
