//go:build linux

package election_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/xadm/relay"
	"github.com/xadm/relay/internal/testkit/harness"
	"github.com/xadm/relay/internal/testkit/pgserver"
	"github.com/xadm/relay/internal/testkit/testlog"
)

// TestFrozenLeader freezes the elected replica's whole process with SIGSTOP
// in the middle of a send, as a long GC pause, a debugger or a paused VM
// does: the server keeps its session, which no keepalive can end since the
// kernel still answers for it. The lease ends the frozen holder's lock session
// 10s after its last heartbeat, the other replica takes over within
// harness.TakeoverBound, and when the frozen process wakes up it starts no new
// message: its lease is past.
//
// The frozen replica is this test binary run again as a child
// (TestFrozenLeaderChild), delivering by HTTP to a receiver of this test, with
// Concurrency 4 and grouped outcomes, through a proxy to the database that this test freezes with
// the process and keeps frozen when the process wakes up: its heartbeat then
// cannot tell it the election is lost, and only the lease stops its workers
// from going on with the batch they had in hand.
func TestFrozenLeader(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := harness.Setup(t)
	b.Insert(t, "t", harness.DistinctKeys("k", 30)...)

	proxy, viaProxy, err := pgserver.ProxyURL(harness.Server().URL)
	require.NoError(t, err)
	t.Cleanup(func() { proxy.Close() })
	var (
		mu          sync.Mutex
		child       *exec.Cmd
		frozenAt    time.Time
		thawedAt    time.Time
		childAfter  int // requests the child made after it woke up
		childByID   = map[string]int{}
		standbyByID = map[int64]int{}
		firstTaken  time.Time
	)
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		id := r.Header.Get("Relay-Message-Id")
		childByID[id]++
		if !thawedAt.IsZero() {
			childAfter++
			t.Logf("a request after the child woke: id %s, attempt %s", id, r.Header.Get("Relay-Attempt"))
		}
		freeze := frozenAt.IsZero() && len(childByID) == 5
		if freeze {
			// Frozen mid-send: the request arrived, the answer is not read yet.
			frozenAt = time.Now()
			proxy.Freeze()
			_ = child.Process.Signal(syscall.SIGSTOP)
		}
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(receiver.Close)

	var out testlog.Buffer
	child = exec.Command(os.Args[0], "-test.run=^TestFrozenLeaderChild$", "-test.v")
	child.Env = append(os.Environ(),
		"RELAY_FREEZE_CHILD=1",
		"RELAY_TEST_DATABASE_URL="+viaProxy,
		"RELAY_FREEZE_TABLE="+b.Table,
		"RELAY_FREEZE_RECEIVER="+receiver.URL)
	child.Stdout, child.Stderr = &out, &out
	mu.Lock()
	require.NoError(t, child.Start())
	mu.Unlock()
	t.Cleanup(func() {
		_ = child.Process.Signal(syscall.SIGCONT)
		_ = child.Process.Kill()
		_ = child.Wait()
		if t.Failed() {
			t.Logf("the frozen replica's output (%d bytes):\n%s", len(out.String()), out.String())
		}
	})

	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return !frozenAt.IsZero()
	}, 30*time.Second, 10*time.Millisecond, "the child delivers, and is frozen mid-send")

	cfg := b.Config
	cfg.Interval = 100 * time.Millisecond
	standby, err := relay.New(pgserver.Pool(t, harness.Server().URL, b.Table+"_standby", 4), cfg,
		relay.SenderFunc("t", func(_ context.Context, m relay.Message) error {
			mu.Lock()
			defer mu.Unlock()
			if firstTaken.IsZero() {
				firstTaken = time.Now()
			}
			standbyByID[m.ID]++
			return nil
		}))
	require.NoError(t, err)
	require.NoError(t, standby.Start(ctx))
	require.Eventually(t, func() bool { return b.CountStatus(t, "SENT") == 30 }, 30*time.Second, 10*time.Millisecond,
		"the standby takes over and delivers everything")
	mu.Lock()
	takeover := firstTaken.Sub(frozenAt)
	thawedAt = time.Now()
	mu.Unlock()
	t.Logf("the standby delivered %s after the leader froze (bound %s)", takeover.Round(time.Millisecond), harness.TakeoverBound)
	require.Less(t, takeover, harness.TakeoverBound)

	// The frozen replica wakes up: it finishes the sends it was in, records
	// nothing over the standby's outcomes, and starts nothing new.
	require.NoError(t, child.Process.Signal(syscall.SIGCONT))
	require.Eventually(t, func() bool {
		return harness.LockFree(t, b.Config.AppName) || len(harness.ElectionHolders(t, b.Config.AppName)) > 0
	},
		5*time.Second, 10*time.Millisecond)
	// It had a batch of 30 in hand: without the lease its idle workers would
	// go on with the rest. Wait until it says its lease ran out.
	require.Eventually(t, func() bool { return strings.Contains(out.String(), "the election's lease ran out") },
		30*time.Second, 10*time.Millisecond, "the woken replica notices its lease is past")
	require.NoError(t, standby.Stop(ctx))
	proxy.Thaw()
	mu.Lock()
	defer mu.Unlock()
	// A worker that had decided to send just before the freeze sends when it
	// wakes: at most one per worker. Without the lease they would go on
	// through the 25 rows left of their batch.
	require.LessOrEqual(t, childAfter, 4, "the replica that woke up past its lease started nothing new")
	dups := 0
	for _, n := range standbyByID {
		dups += n - 1
	}
	require.Zero(t, dups)
	require.Equal(t, 30, b.CountStatus(t, "SENT"))
}

// TestFrozenLeaderChild is the replica TestFrozenLeader freezes: it only runs
// as that test's child process.
func TestFrozenLeaderChild(t *testing.T) {
	if os.Getenv("RELAY_FREEZE_CHILD") == "" {
		t.Skip("the frozen replica of TestFrozenLeader; it runs only as that test's child process")
	}
	table := os.Getenv("RELAY_FREEZE_TABLE")
	cfg := relay.DefaultConfig()
	cfg.AppName, cfg.Table = table, table
	cfg.Interval = 100 * time.Millisecond
	cfg.Concurrency = 4
	cfg.GroupOutcomes = 1000 // the group is flushed by its timer: the workers never wait for it, only the lease stops them
	sender, err := relay.NewHTTPSender(relay.HTTPSenderConfig{Type: "t", URL: relay.URLWithKey(os.Getenv("RELAY_FREEZE_RECEIVER"))})
	require.NoError(t, err)
	r, err := relay.New(pgserver.Pool(t, harness.Server().URL, table+"_frozen", 8), cfg, sender)
	require.NoError(t, err)
	require.NoError(t, r.Start(context.Background()))
	select {} // until the parent kills it
}
