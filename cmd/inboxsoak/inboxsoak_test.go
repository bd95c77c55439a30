package main

import (
	"context"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/xadm/relay/internal/testkit/pgserver"
)

// TestMain runs this binary as a soak's child process when the soak started
// it so (the relay replicas and the receiver), and otherwise gets the
// outbox's PostgreSQL and runs the tests, checking afterwards that none left
// a goroutine behind.
func TestMain(m *testing.M) {
	maybeChild()
	os.Exit(pgserver.Run(m, "RELAY_TEST_DATABASE_URL"))
}

// TestInboxSoak is a short soak: 18 seconds of messages of both types for 300
// keys, a fault every 1.2 seconds (each of the seven at least once, order
// paused by 2 seconds of 503s while 150 ledger messages drain), order's inbox
// records purged after a second so that late re-deliveries meet the
// stale-drop too. Every message's effect must be applied exactly once, in
// each key's id order, every order key must end on its newest message, every
// ledger key on the sum of its amounts, none may be lost or dropped as stale.
// go run ./cmd/inboxsoak runs longer.
func TestInboxSoak(t *testing.T) {
	receiver, err := pgserver.Start(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	defer receiver.Stop()
	o := options{
		duration:    18 * time.Second,
		rate:        150,
		keys:        300,
		replicas:    3,
		faultEvery:  1200 * time.Millisecond,
		failFor:     2 * time.Second,
		burst:       150,
		drain:       90 * time.Second,
		purgeAge:    time.Second,
		answerDelay: 5 * time.Millisecond,
		seed:        uint64(time.Now().UnixNano()),
	}
	var progress strings.Builder
	rep, err := soakOn(context.Background(), o, pgserver.Shared(), receiver, &syncWriter{b: &progress})
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	rep.print(&out)
	t.Log(out.String())
	if !rep.ok() {
		t.Fatalf("the soak failed:\n%s\nprogress:\n%s", out.String(), progress.String())
	}
	// The faults did what they are for: the relay delivered again, and the
	// inbox answered without applying; the receiver failed, and order
	// paused while ledger went on; keys got both types.
	if rep.again == 0 || rep.answers["duplicate"]+rep.answers["stale"] == 0 {
		t.Fatalf("no re-delivery reached the inbox:\n%s", out.String())
	}
	if rep.answers["503"] == 0 || rep.pauses[typeOrder] == 0 || rep.burst == 0 || rep.shared == 0 {
		t.Fatalf("no 503, no pause of order, no burst of ledger or no key of both types:\n%s", out.String())
	}
}

// syncWriter is a strings.Builder safe for concurrent writes.
type syncWriter struct {
	mu sync.Mutex
	b  *strings.Builder
}

func (w *syncWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}
