//go:build unix

package pgserver

import (
	"errors"
	"fmt"
	"os"
	"os/user"
	"strconv"
	"syscall"
)

// exe is the file name suffix of executables.
const exe = ""

// runAs returns the postgres OS user when this process runs as root, since
// PostgreSQL and PgBouncer refuse to run as root; nil otherwise.
func runAs() (*osUser, error) {
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
	return &osUser{uid: int(uid), gid: int(gid)}, nil
}

// sysProcAttr runs a process as user (nil: as this process's user).
func sysProcAttr(user *osUser) *syscall.SysProcAttr {
	attr := &syscall.SysProcAttr{}
	if user != nil {
		attr.Credential = &syscall.Credential{Uid: uint32(user.uid), Gid: uint32(user.gid)}
	}
	return attr
}

// ownProcessGroup puts the process in a process group of its own, out of reach
// of the terminal's Ctrl-C.
func ownProcessGroup(attr *syscall.SysProcAttr) { attr.Setpgid = true }

// interrupt sends sig to p.
func interrupt(p *os.Process, sig syscall.Signal) error { return p.Signal(sig) }

// processAlive reports whether a process with this pid exists, whoever owns it.
func processAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}
