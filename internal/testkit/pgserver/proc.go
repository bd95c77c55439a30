package pgserver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// errPortTaken marks a start that failed because another process took the port first.
var errPortTaken = errors.New("port already in use")

// osUser is the OS account a server process runs as. A nil *osUser means this
// process's own account; on Unix, as root, it is the postgres user (see runAs).
type osUser struct{ uid, gid int }

// tempDir makes a fresh temporary directory owned by user (the current user if nil).
func tempDir(prefix string, user *osUser) (string, error) {
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		return "", err
	}
	if err := chown(dir, user); err != nil {
		os.RemoveAll(dir)
		return "", err
	}
	return dir, nil
}

// chown gives path to user; nil user leaves it alone.
func chown(path string, user *osUser) error {
	if user == nil {
		return nil
	}
	return os.Chown(path, user.uid, user.gid)
}

// command prepares name to run as user in dir, its output appended to logFile.
func command(ctx context.Context, name string, args []string, dir string, logFile *os.File, user *osUser) *exec.Cmd {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = sysProcAttr(user)
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
	cmd     *exec.Cmd
	cancel  context.CancelFunc
	release func()        // ends the watchdog or job object that would kill the server if this process died
	done    chan struct{} // closed once the process has exited
}

// spawn starts a server process as user in dir, its output appended to logFile,
// in a process group of its own: a Ctrl-C in the terminal goes to the program,
// which stops gracefully while the server is still there to answer. Stopping it
// sends it sig (on Windows, which has no signals, it is killed); it is killed if
// it has not exited 10s after a stop.
//
// The server dies with this process, however this process ends (SIGKILL and a go
// test timeout included), by the means each OS has: on Linux the kernel sends it
// sig (Pdeathsig; strictly when the OS thread that started it ends, which Go does
// only under a goroutine that exits locked to it); on the other Unix systems a
// watchdog process sends it sig (see startWatchdog); on Windows it is assigned to
// a job object that the system kills when this process's handle to it closes.
func spawn(name string, args []string, dir string, logFile *os.File, user *osUser, sig syscall.Signal) (*child, error) {
	ctx, cancel := context.WithCancel(context.Background())
	cmd := command(ctx, name, args, dir, logFile, user)
	ownProcessGroup(cmd.SysProcAttr)
	dieWithParent(cmd.SysProcAttr, sig)
	cmd.Cancel = func() error { return interrupt(cmd.Process, sig) }
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Start(); err != nil {
		cancel()
		return nil, err
	}
	release, err := watchParent(cmd.Process, sig)
	if err != nil {
		cancel() // nothing watches it: stop it rather than risk leaving it behind
		_ = cmd.Wait()
		return nil, fmt.Errorf("pgserver: make %s die with this process: %w", filepath.Base(name), err)
	}
	c := &child{cmd: cmd, cancel: cancel, release: release, done: make(chan struct{})}
	go c.wait()
	return c, nil
}

// wait waits for the process to exit, then releases what would have killed it.
func (c *child) wait() {
	_ = c.cmd.Wait() // the exit status of a signalled server says nothing useful
	c.release()
	close(c.done)
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
