//go:build unix && !linux

package pgserver

import (
	"os"
	"syscall"
)

// dieWithParent does nothing: only Linux has Pdeathsig, and watchParent does the
// same job with a watchdog process.
func dieWithParent(*syscall.SysProcAttr, syscall.Signal) {}

// watchParent starts a watchdog that sends sig to p when this process dies.
func watchParent(p *os.Process, sig syscall.Signal) (release func(), err error) {
	return startWatchdog(p.Pid, sig)
}
