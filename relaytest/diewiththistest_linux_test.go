package relaytest_test

import (
	"os/exec"
	"syscall"
)

// dieWithThisTest makes the kernel kill cmd, a child test binary, when this
// test binary dies, so that the child never outlives the test.
func dieWithThisTest(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
