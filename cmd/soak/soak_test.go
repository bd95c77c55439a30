package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/xadm/relay/internal/testkit/pgserver"
)

// TestMain gets the PostgreSQL the soak runs on and runs the tests, checking
// afterwards that none left a goroutine behind.
func TestMain(m *testing.M) { pgserver.Main(m) }

// TestSoak is a short soak: 10 seconds of messages of both types for 300
// keys, by 3 replicas, a session killed every second or so and the receiver
// failing (503) for 2 seconds every 2.5 seconds, in turn order, ledger and
// both, so that types pause and resume. No message may be lost or left
// unsent, no duplicate unexplained, and no key's message received after a
// later one of its key, of either type. go run ./cmd/soak runs longer.
func TestSoak(t *testing.T) {
	o := options{
		duration:    10 * time.Second,
		replicas:    3,
		rate:        200,
		killEvery:   time.Second,
		outageEvery: 2500 * time.Millisecond,
		outageFor:   2 * time.Second,
		concurrency: 2,
		batch:       50,
		interval:    50 * time.Millisecond,
		sendDelay:   2 * time.Millisecond,
		keys:        300,
		drain:       60 * time.Second,
		window:      2 * time.Second,
		seed:        uint64(time.Now().UnixNano()),
		quiet:       true,
		clusterLock: true,
		partitions:  1,
	}
	rep, err := soakOn(context.Background(), o, pgserver.Shared())
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	rep.print(&out)
	t.Log(out.String())
	if !rep.ok() {
		t.Fatalf("the soak failed:\n%s", out.String())
	}
	// The outages did what they are for: the receiver refused, both types
	// paused, and keys got both types.
	if sumOf(rep.refused) == 0 || rep.paused[typeOrder] == 0 || rep.paused[typeLedger] == 0 || rep.shared == 0 {
		t.Fatalf("no 503, a type never paused, or no key of both types:\n%s", out.String())
	}
}
