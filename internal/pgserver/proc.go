package pgserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/user"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// errPortTaken marks a start that failed because another process took the port first.
var errPortTaken = errors.New("port already in use")

// runAs returns the credentials of the postgres OS user when this process runs as
// root, since PostgreSQL and PgBouncer refuse to run as root; nil otherwise.
func runAs() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("pgserver: as root, PostgreSQL must run as the postgres OS user: %w", err)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, err
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, err
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// tempDir makes a fresh temporary directory owned by cred's user (the current user if nil).
func tempDir(prefix string, cred *syscall.Credential) (string, error) {
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		return "", err
	}
	if err := chown(dir, cred); err != nil {
		os.RemoveAll(dir)
		return "", err
	}
	return dir, nil
}

// chown gives path to cred's user; nil cred leaves it alone.
func chown(path string, cred *syscall.Credential) error {
	if cred == nil {
		return nil
	}
	return os.Chown(path, int(cred.Uid), int(cred.Gid))
}

// command prepares name to run as cred in dir, its output appended to logFile.
func command(ctx context.Context, name string, args []string, dir string, logFile *os.File, cred *syscall.Credential) *exec.Cmd {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	return cmd
}

// openLog opens the log at path for appending and returns it with its current size,
// the offset from which a failure's log tail is read.
func openLog(path string) (*os.File, int64, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, 0, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, err
	}
	return f, fi.Size(), nil
}

// child is a long-running server process (postgres or pgbouncer).
type child struct {
	cancel context.CancelFunc
	done   chan struct{} // closed once the process has exited
}

// spawn starts a server process as cred in dir, its output appended to logFile.
// Stopping it sends it sig, and so does this process dying (strictly, the OS thread
// that started it, which Go ends only under a goroutine that exits locked to it);
// it is killed if it has not exited 10s after a stop.
func spawn(name string, args []string, dir string, logFile *os.File, cred *syscall.Credential, sig syscall.Signal) (*child, error) {
	ctx, cancel := context.WithCancel(context.Background())
	cmd := command(ctx, name, args, dir, logFile, cred)
	cmd.SysProcAttr.Pdeathsig = sig
	// Its own process group: a Ctrl-C in the terminal goes to the program,
	// which stops gracefully while the server is still there to answer.
	cmd.SysProcAttr.Setpgid = true
	cmd.Cancel = func() error { return cmd.Process.Signal(sig) }
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Start(); err != nil {
		cancel()
		return nil, err
	}
	c := &child{cancel: cancel, done: make(chan struct{})}
	go func() {
		cmd.Wait() // the exit status of a signalled server says nothing useful
		close(c.done)
	}()
	return c, nil
}

// stop signals the process and waits until it has exited.
func (c *child) stop() {
	c.cancel()
	<-c.done
}

// waitReady waits up to 30s until url accepts a pgx connection; it gives up early
// if the process c exits.
func waitReady(ctx context.Context, url string, c *child) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for {
		try, cancelTry := context.WithTimeout(ctx, 2*time.Second)
		conn, err := pgx.Connect(try, url)
		if err == nil {
			err = conn.Close(try)
			cancelTry()
			return err
		}
		cancelTry()
		select {
		case <-c.done:
			return errors.New("exited during startup")
		case <-ctx.Done():
			return fmt.Errorf("not accepting connections: %w", err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// startErr describes a failed start of name, with the tail of what it logged to
// logPath since offset; it wraps errPortTaken when the port was taken.
func startErr(name string, err error, logPath string, offset int64) error {
	tail := logTail(logPath, offset)
	if strings.Contains(tail, "Address already in use") {
		err = fmt.Errorf("%w: %w", errPortTaken, err)
	}
	return fmt.Errorf("pgserver: %s did not start: %w\n--- tail of %s ---\n%s", name, err, logPath, tail)
}

// logTail returns the last 2 KiB that were written to path since offset.
func logTail(path string, offset int64) string {
	f, err := os.Open(path)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size()-offset > 2048 {
		offset = fi.Size() - 2048
	}
	b, err := io.ReadAll(io.NewSectionReader(f, offset, 2048))
	if err != nil {
		return err.Error()
	}
	return string(b)
}

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// onFreePort calls start with a free port, trying again with another port (three
// tries in all) when another process took the port in between.
func onFreePort(start func(port int) error) error {
	for try := 1; ; try++ {
		port, err := freePort()
		if err != nil {
			return err
		}
		err = start(port)
		if err == nil || !errors.Is(err, errPortTaken) || try == 3 {
			return err
		}
	}
}
