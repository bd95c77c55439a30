package kafka

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that no test leaves a goroutine behind: every client the
// tests build is closed.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
