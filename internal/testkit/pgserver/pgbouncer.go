package pgserver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	"github.com/jackc/pgx/v5"
)

// PgBouncer is a running pgbouncer in front of a Server.
//
// In transaction mode each transaction runs on whichever server connection is free:
// session state such as a session advisory lock stays with that server connection,
// not with the client, and pgx's default statement cache fails with pgbouncer 1.18
// ("prepared statement ... already exists"); pgx.QueryExecModeExec and
// pgx.QueryExecModeSimpleProtocol work.
type PgBouncer struct {
	URL string // a postgres:// URL through pgbouncer on 127.0.0.1, with sslmode=disable

	dir      string
	proc     *child
	stopOnce sync.Once
	stopErr  error
}

// StartPgBouncer starts pgbouncer (from $PGBOUNCER, /usr/sbin/pgbouncer or PATH; as the
// postgres OS user when running as root) on a free port of 127.0.0.1 in front of s, with
// pool_mode mode ("session" or "transaction"), auth_type=trust, default_pool_size=20 and
// max_client_conn=500 (and server_reset_query=DISCARD ALL in session mode). Its
// configuration and log live in a temporary directory.
func StartPgBouncer(ctx context.Context, s *Server, mode string) (*PgBouncer, error) {
	if mode != "session" && mode != "transaction" {
		return nil, fmt.Errorf("pgserver: pool mode %q is neither session nor transaction", mode)
	}
	bin := findPgBouncer()
	if bin == "" {
		return nil, errors.New("pgserver: pgbouncer not found: install pgbouncer (Debian: apt-get install -y pgbouncer)")
	}
	cfg, err := pgx.ParseConfig(s.URL)
	if err != nil {
		return nil, err
	}
	user, err := runAs()
	if err != nil {
		return nil, err
	}
	dir, err := tempDir("pgbouncer-", user)
	if err != nil {
		return nil, err
	}
	b := &PgBouncer{dir: dir}
	authFile := filepath.Join(dir, "userlist.txt")
	err = writeFile(authFile, quote(cfg.User, '"')+" "+quote(cfg.Password, '"')+"\n", user)
	if err == nil {
		err = onFreePort(func(port int) error {
			b.URL = pgURL(cfg.User, port, cfg.Database)
			return b.start(ctx, bin, user, iniFile(cfg, authFile, port, mode))
		})
	}
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return b, nil
}

// findPgBouncer returns the path of the pgbouncer binary, or "" if there is
// none: $PGBOUNCER when it is set (even to a file that does not exist, which
// shows what the tests do without pgbouncer), else /usr/sbin/pgbouncer or
// pgbouncer on PATH.
func findPgBouncer() string {
	if p := os.Getenv("PGBOUNCER"); p != "" {
		if isFile(p) {
			return p
		}
		return ""
	}
	if p := "/usr/sbin/pgbouncer"; isFile(p) {
		return p
	}
	p, _ := exec.LookPath("pgbouncer")
	return p
}

// iniFile is the pgbouncer configuration: every database of the server cfg points at,
// a listener on 127.0.0.1:port only, clients trusted if they are in authFile.
func iniFile(cfg *pgx.ConnConfig, authFile string, port int, mode string) string {
	server := fmt.Sprintf("host=%s port=%d user=%s", quote(cfg.Host, '\''), cfg.Port, quote(cfg.User, '\''))
	if cfg.Password != "" {
		server += " password=" + quote(cfg.Password, '\'')
	}
	ini := fmt.Sprintf(`[databases]
* = %s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = %s
default_pool_size = 20
max_client_conn = 500
ignore_startup_parameters = extra_float_digits,options
`, server, port, authFile, mode)
	if mode == "session" {
		ini += "server_reset_query = DISCARD ALL\n"
	}
	return ini
}

// quote puts s between q quotes, doubling quotes inside, as pgbouncer's files expect.
func quote(s string, q rune) string {
	qs := string(q)
	return qs + strings.ReplaceAll(s, qs, qs+qs) + qs
}

// writeFile writes a file readable only by user (the current user if nil).
func writeFile(path, content string, user *osUser) error {
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		return err
	}
	return chown(path, user)
}

// start writes the configuration ini and runs pgbouncer with it until it accepts connections.
func (b *PgBouncer) start(ctx context.Context, bin string, user *osUser, ini string) error {
	iniPath := filepath.Join(b.dir, "pgbouncer.ini")
	logPath := filepath.Join(b.dir, "pgbouncer.log")
	if err := writeFile(iniPath, ini, user); err != nil {
		return err
	}
	logFile, offset, err := openLog(logPath)
	if err != nil {
		return err
	}
	defer logFile.Close()
	// SIGTERM shuts pgbouncer down without waiting for clients (up to pgbouncer 1.22).
	proc, err := spawn(bin, []string{iniPath}, b.dir, logFile, user, syscall.SIGTERM)
	if err != nil {
		return err
	}
	if err := waitReady(ctx, b.URL, proc); err != nil {
		proc.stop()
		return startErr("pgbouncer", err, logPath, offset)
	}
	b.proc = proc
	return nil
}

// Stop stops pgbouncer and removes its directory. It is safe to call twice.
func (b *PgBouncer) Stop() error {
	b.stopOnce.Do(func() {
		b.proc.stop()
		b.stopErr = os.RemoveAll(b.dir)
	})
	return b.stopErr
}
