package pgserver

import (
	"os"
	"syscall"
)

// usePdeathsig makes the kernel signal a server when this process dies
// (Pdeathsig). Tests turn it off to run the watchdog of the other Unix systems
// here; nothing else does.
var usePdeathsig = true

// dieWithParent asks the kernel to send sig to the process when this process dies.
func dieWithParent(attr *syscall.SysProcAttr, sig syscall.Signal) {
	if usePdeathsig {
		attr.Pdeathsig = sig
	}
}

// watchParent has nothing to start: the kernel does it (see dieWithParent).
func watchParent(p *os.Process, sig syscall.Signal) (release func(), err error) {
	if usePdeathsig {
		return func() {}, nil
	}
	return startWatchdog(p.Pid, sig)
}
