package pgserver

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// cluster is a throwaway PostgreSQL cluster run from the local binaries. Its temporary
// directory holds the data directory, the Unix socket and the server log.
type cluster struct {
	binDir string
	dir    string
	port   int
	user   *osUser // the postgres OS user when running as root on Unix, else nil
	pg     *child  // the running postmaster; nil while halted
	// settings are the server settings, each passed as -c.
	settings []string
	// tls says the cluster serves TCP over TLS only (setupTLS).
	tls bool
}

// findBinDir returns the directory of the local PostgreSQL server binaries, looking at
// $PG_BIN, pg_config --bindir, the directories where the OS's packages put them
// (binDirGlobs, highest version first) and PATH, or "" if there are none.
func findBinDir(ctx context.Context) string {
	var dirs []string
	dirs = append(dirs, os.Getenv("PG_BIN"))
	if out, err := exec.CommandContext(ctx, "pg_config", "--bindir").Output(); err == nil {
		dirs = append(dirs, strings.TrimSpace(string(out)))
	}
	var packaged []string
	for _, pattern := range binDirGlobs() {
		found, _ := filepath.Glob(pattern)
		packaged = append(packaged, found...)
	}
	sort.SliceStable(packaged, func(i, j int) bool { return binDirVersion(packaged[i]) > binDirVersion(packaged[j]) })
	dirs = append(dirs, packaged...)
	if p, err := exec.LookPath("postgres"); err == nil {
		dirs = append(dirs, filepath.Dir(p))
	}
	for _, dir := range dirs {
		if isFile(filepath.Join(dir, "postgres"+exe)) && isFile(filepath.Join(dir, "initdb"+exe)) {
			return dir
		}
	}
	return ""
}

// binDirGlobs are the patterns of the directories where the usual packages of
// this OS put PostgreSQL's server binaries, one directory per major version.
func binDirGlobs() []string {
	switch runtime.GOOS {
	case "darwin":
		return []string{
			"/opt/homebrew/opt/postgresql@*/bin", // Homebrew on Apple silicon
			"/usr/local/opt/postgresql@*/bin",    // Homebrew on Intel
			"/Applications/Postgres.app/Contents/Versions/*/bin",
		}
	case "windows":
		if pf := os.Getenv("ProgramFiles"); pf != "" {
			return []string{filepath.Join(pf, "PostgreSQL", "*", "bin")} // the EDB installer
		}
		return nil
	}
	return []string{"/usr/lib/postgresql/*/bin"} // Debian, Ubuntu
}

// binDirVersion is the major version in the name of a binDirGlobs directory's
// parent ("15", "postgresql@16"), or 0.
func binDirVersion(dir string) float64 {
	name := filepath.Base(filepath.Dir(dir))
	if _, v, ok := strings.Cut(name, "@"); ok {
		name = v
	}
	v, _ := strconv.ParseFloat(name, 64)
	return v
}

// isFile reports whether path names a regular file.
func isFile(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular()
}

// startLocal initializes a cluster in a fresh temporary directory and starts it on a free port.
func startLocal(ctx context.Context, binDir string) (*Server, error) {
	return startLocalWith(ctx, binDir, Options{})
}

// startLocalWith is startLocal with opt's settings.
func startLocalWith(ctx context.Context, binDir string, opt Options) (*Server, error) {
	user, err := runAs()
	if err != nil {
		return nil, err
	}
	removeStale()
	dir, err := tempDir("pgserver-", user)
	if err != nil {
		return nil, err
	}
	c := &cluster{binDir: binDir, dir: dir, user: user, settings: slices.Clone(opt.settings())}
	err = c.initdb(ctx)
	if err == nil && opt.TLS != nil {
		err = c.setupTLS(opt.TLS)
	}
	if err == nil {
		err = onFreePort(func(port int) error {
			c.port = port
			return c.start(ctx)
		})
	}
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return &Server{URL: c.url("postgres", "postgres"), Kind: "local", local: c}, nil
}

func (c *cluster) dataDir() string { return filepath.Join(c.dir, "data") }
func (c *cluster) logPath() string { return filepath.Join(c.dir, "postgres.log") }

// initdb creates the data directory: trust authentication, superuser postgres, UTF8, C locale.
func (c *cluster) initdb(ctx context.Context) error {
	logFile, offset, err := openLog(c.logPath())
	if err != nil {
		return err
	}
	defer logFile.Close()
	args := []string{"-D", c.dataDir(), "-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8", "--locale=C"}
	if err := command(ctx, filepath.Join(c.binDir, "initdb"+exe), args, c.dir, logFile, c.user).Run(); err != nil {
		return startErr("initdb", err, c.logPath(), offset)
	}
	return nil
}

// start starts the postmaster on c.port, unless it runs already, and waits until it
// accepts connections.
func (c *cluster) start(ctx context.Context) error {
	if c.pg != nil {
		return nil
	}
	logFile, offset, err := openLog(c.logPath())
	if err != nil {
		return err
	}
	defer logFile.Close()
	args := []string{"-D", c.dataDir(), "-p", strconv.Itoa(c.port), "-c", "listen_addresses=127.0.0.1"}
	if runtime.GOOS != "windows" {
		// The socket in the cluster's own directory: the default one may not be
		// writable. On Windows there is none by default, and nothing needs one.
		args = append(args, "-c", "unix_socket_directories="+c.dir)
	}
	for _, s := range c.settings {
		args = append(args, "-c", s)
	}
	// SIGQUIT is PostgreSQL's immediate shutdown: the data is thrown away or only
	// halted. (On Windows the postmaster is killed, which has the same effect.)
	pg, err := spawn(filepath.Join(c.binDir, "postgres"+exe), args, c.dir, logFile, c.user, syscall.SIGQUIT)
	if err != nil {
		return err
	}
	if err := waitReady(ctx, c.url("postgres", "postgres"), pg); err != nil {
		pg.stop()
		return startErr("postgres", err, c.logPath(), offset)
	}
	c.pg = pg
	return nil
}

// halt shuts the postmaster down immediately, keeping the data directory.
func (c *cluster) halt() {
	if c.pg != nil {
		c.pg.stop()
		c.pg = nil
	}
}

// remove halts the cluster and deletes its directory.
func (c *cluster) remove() error {
	c.halt()
	return os.RemoveAll(c.dir)
}

// staleAfter is how old a cluster directory must be before removeStale may
// take it: far older than any test run, so one being set up is never touched.
const staleAfter = 6 * time.Hour

// removeStale removes the directories of local clusters whose test binary was
// killed before it could clean up (SIGKILL, a go test timeout): older than
// staleAfter, and with no postmaster alive in them. The server itself already
// died with its binary (see spawn); only its files were left.
func removeStale() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), "pgserver-*"))
	for _, dir := range dirs {
		fi, err := os.Stat(dir)
		if err != nil || !fi.IsDir() || time.Since(fi.ModTime()) < staleAfter {
			continue
		}
		if pidFile, err := os.ReadFile(filepath.Join(dir, "data", "postmaster.pid")); err == nil {
			first, _, _ := strings.Cut(string(pidFile), "\n")
			if pid, err := strconv.Atoi(strings.TrimSpace(first)); err == nil && processAlive(pid) {
				continue // a server still runs there
			}
		}
		_ = os.RemoveAll(dir)
	}
}
