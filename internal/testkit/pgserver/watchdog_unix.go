//go:build unix

package pgserver

import (
	"os"
	"os/exec"
	"strconv"
	"syscall"
)

// watchdogScript waits until its standard input reaches end of file, then sends
// signal number $1 to process $2. Nothing is ever written to the pipe, so read
// returns only at end of file: when the last copy of the pipe's write end closes.
const watchdogScript = `read -r line; kill -$1 $2`

// startWatchdog starts a small shell process that sends sig to process pid when
// this process dies, for the Unix systems without Pdeathsig (macOS, the BSDs).
// The watchdog waits on a pipe whose write end only this process holds (os.Pipe
// makes both ends close-on-exec, so no other child inherits it); whatever way
// this process ends, SIGKILL included, the kernel closes that end and the
// watchdog's read returns. It runs as this process's user (as root, it may
// signal the postgres user's server), in a process group of its own so that a
// Ctrl-C meant for this program does not end it.
//
// release ends the watchdog without signalling anything; call it once pid has
// exited, so that the watchdog never signals a pid the system has reused.
func startWatchdog(pid int, sig syscall.Signal) (release func(), err error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer r.Close() // the watchdog has its own copy
	cmd := exec.Command("/bin/sh", "-c", watchdogScript, "pgserver-watchdog",
		strconv.Itoa(int(sig)), strconv.Itoa(pid))
	cmd.Stdin = r
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		w.Close()
		return nil, err
	}
	return func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		_ = w.Close()
	}, nil
}
