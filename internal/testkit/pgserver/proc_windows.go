package pgserver

import (
	"errors"
	"os"
	"syscall"

	"golang.org/x/sys/windows"
)

// exe is the file name suffix of executables.
const exe = ".exe"

// runAs returns nil: on Windows the server runs as this process's user, which
// must not be an elevated administrator (postgres.exe refuses to run as one; a
// non-elevated member of Administrators is fine).
func runAs() (*osUser, error) { return nil, nil }

// sysProcAttr returns the attributes of every process started: nothing
// special, since Windows has no switch of credentials here.
func sysProcAttr(*osUser) *syscall.SysProcAttr { return &syscall.SysProcAttr{} }

// ownProcessGroup puts the process in a process group of its own, out of reach
// of the console's Ctrl-C.
func ownProcessGroup(attr *syscall.SysProcAttr) {
	attr.CreationFlags |= syscall.CREATE_NEW_PROCESS_GROUP
}

// interrupt kills p: Windows has no signal to ask a server to stop, and an
// immediate stop (PostgreSQL's SIGQUIT) is what Halt and Stop want anyway.
func interrupt(p *os.Process, _ syscall.Signal) error { return p.Kill() }

// stillActive is the exit code GetExitCodeProcess reports for a running process.
const stillActive = 259

// processAlive reports whether a process with this pid runs, whoever owns it.
func processAlive(pid int) bool {
	h, err := windows.OpenProcess(windows.PROCESS_QUERY_LIMITED_INFORMATION, false, uint32(pid))
	if err != nil {
		return errors.Is(err, windows.ERROR_ACCESS_DENIED) // it exists, but is not ours to query
	}
	defer windows.CloseHandle(h)
	var code uint32
	if err := windows.GetExitCodeProcess(h, &code); err != nil {
		return true
	}
	return code == stillActive
}
