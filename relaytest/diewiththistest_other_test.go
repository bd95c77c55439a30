//go:build !linux

package relaytest_test

import "os/exec"

// dieWithThisTest does nothing where there is no Pdeathsig: the test's cleanup
// kills cmd, a child test binary, and only a kill of this test binary itself
// (SIGKILL, a go test timeout) leaves the child running until its own
// -test.timeout ends it.
func dieWithThisTest(*exec.Cmd) {}
