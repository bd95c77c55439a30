package election_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/xadm/relay"
	"github.com/xadm/relay/internal/testkit/harness"
	"github.com/xadm/relay/internal/testkit/pgserver"
	"github.com/xadm/relay/internal/testkit/testlog"
)

// The partitioned election (partitions.go), proven from outside: replicas
// of one app, each with its own pool as separate processes would have,
// share the partitions, exclude a JVM relay both ways, and deliver every
// row once and each key in id order while they join and leave.

// orderReceiver is a destination shared by every replica of a test: it
// records, per key, the ids in the order they arrived, and how often each
// id came.
type orderReceiver struct {
	mu    sync.Mutex
	byKey map[string][]int64
	times map[int64]int
}

func newOrderReceiver() *orderReceiver {
	return &orderReceiver{byKey: map[string][]int64{}, times: map[int64]int{}}
}

func (o *orderReceiver) sender(typ string) relay.Sender {
	return relay.SenderFunc(typ, func(_ context.Context, m relay.Message) error {
		o.receive(m.Key, m.ID)
		return nil
	})
}

// receive records one delivery of message id of key.
func (o *orderReceiver) receive(key string, id int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.byKey[key] = append(o.byKey[key], id)
	o.times[id]++
}

// check says what breaks at-least-once and per-key order: an id of want that
// never came, and a key whose first deliveries are out of id order; and
// returns the ids that came more than once.
func (o *orderReceiver) check(t testing.TB, want []int64) (repeated []int64) {
	t.Helper()
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, id := range want {
		require.NotZero(t, o.times[id], "row %d was never delivered", id)
	}
	for key, ids := range o.byKey {
		seen := map[int64]bool{}
		var first []int64
		for _, id := range ids {
			if !seen[id] {
				seen[id] = true
				first = append(first, id)
			}
		}
		require.True(t, slices.IsSorted(first), "key %q arrived out of id order: %v", key, ids)
	}
	for id, n := range o.times {
		if n > 1 {
			repeated = append(repeated, id)
		}
	}
	slices.Sort(repeated)
	return repeated
}

// replica is one started, partitioned relay with a pool of its own.
type replica struct {
	r    *relay.Relay
	pool *pgxpool.Pool
}

func startReplica(t *testing.T, b *harness.Bundle, name string, cfg relay.Config, senders ...relay.Sender) *replica {
	t.Helper()
	pool := pgserver.Pool(t, harness.Server().URL, b.Table+"_"+name, int32(cfg.Concurrency+4))
	r, err := relay.New(pool, cfg, senders...)
	require.NoError(t, err)
	require.NoError(t, r.Start(context.Background()))
	t.Cleanup(func() { _ = r.Stop(context.Background()) })
	return &replica{r: r, pool: pool}
}

// settled reports whether every one of the n partitions is held exactly once
// and the shares are as even as they can be: none holds more than
// ceil(n / replicas) or fewer than floor.
func settled(replicas []*replica, n int) bool {
	count := make([]int, n)
	lo, hi := n/len(replicas), (n+len(replicas)-1)/len(replicas)
	for _, rp := range replicas {
		parts := rp.r.Stats().Partitions
		if len(parts) < lo || len(parts) > hi {
			return false
		}
		for _, p := range parts {
			count[p]++
		}
	}
	for _, c := range count {
		if c != 1 {
			return false
		}
	}
	return true
}

func partitionedConfig(b *harness.Bundle, n int) relay.Config {
	cfg := b.Config
	cfg.Partitions = n
	cfg.Interval = 50 * time.Millisecond
	return cfg
}

// TestPartitionsShareOut: four replicas share 16 partitions four each; when
// one stops, the three left take its partitions; when a fifth and sixth
// come, they get their share. No coordinator: each rebalances at its passes.
func TestPartitionsShareOut(t *testing.T) {
	t.Parallel()
	b := harness.Setup(t)
	cfg := partitionedConfig(b, 16)
	recv := newOrderReceiver()
	var replicas []*replica
	for i := range 4 {
		replicas = append(replicas, startReplica(t, b, fmt.Sprint("r", i), cfg, recv.sender("t")))
	}
	require.Eventually(t, func() bool { return settled(replicas, 16) }, 30*time.Second, 10*time.Millisecond,
		"four replicas hold four partitions each")
	for _, rp := range replicas {
		require.Len(t, rp.r.Stats().Partitions, 4)
	}
	// An operator sees the members and their partitions.
	admin, err := relay.NewAdmin(b.Pool, b.Config)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		holders, err := admin.Election(context.Background())
		require.NoError(t, err)
		var all []int
		for _, h := range holders {
			if h.Kind != relay.HolderRelay || h.Mode != relay.LockShared || !h.Granted || h.PartitionsOf != 16 {
				return false
			}
			all = append(all, h.Partitions...)
		}
		slices.Sort(all)
		return len(holders) == 4 && slices.Equal(all, []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15})
	}, 30*time.Second, 10*time.Millisecond, "Admin.Election lists four shared holders and their partitions")

	require.NoError(t, replicas[0].r.Stop(context.Background()))
	require.Nil(t, replicas[0].r.Stats().Partitions, "a stopped replica holds nothing")
	replicas = replicas[1:]
	require.Eventually(t, func() bool { return settled(replicas, 16) }, 30*time.Second, 10*time.Millisecond,
		"the three left take the stopped one's partitions")

	replicas = append(replicas, startReplica(t, b, "r4", cfg, recv.sender("t")), startReplica(t, b, "r5", cfg, recv.sender("t")))
	require.Eventually(t, func() bool { return settled(replicas, 16) }, 30*time.Second, 10*time.Millisecond,
		"newcomers get their share: 16 over 5 is 3 or 4 each")

	ids := b.Insert(t, "t", harness.DistinctKeys("k", 200)...)
	require.Eventually(t, func() bool { return b.CountStatus(t, "SENT") == len(ids) }, 30*time.Second, 10*time.Millisecond)
	require.Empty(t, recv.check(t, ids), "nothing failed: every row came once")
	delivering := 0
	for _, rp := range replicas {
		if rp.r.Stats().Sent > 0 {
			delivering++
		}
	}
	require.Equal(t, len(replicas), delivering, "every replica delivered its partitions' rows")
}

// passPartitions is an Observer that records, for each pass of its relay,
// when it started and how many partitions the relay held when it ended.
type passPartitions struct {
	r      atomic.Pointer[relay.Relay]
	mu     sync.Mutex
	passes []passHeld
}

type passHeld struct {
	start time.Time
	held  int
}

func (p *passPartitions) PassDone(rep relay.PassReport) {
	if r := p.r.Load(); r != nil {
		held := len(r.Stats().Partitions)
		p.mu.Lock()
		defer p.mu.Unlock()
		p.passes = append(p.passes, passHeld{start: time.Now().Add(-rep.Duration), held: held})
	}
}

func (p *passPartitions) MessageDone(relay.MessageReport) {}

// firstAfter returns the first pass that started after t, once one has ended.
func (p *passPartitions) firstAfter(t time.Time) (passHeld, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, ph := range p.passes {
		if ph.start.After(t) {
			return ph, true
		}
	}
	return passHeld{}, false
}

// TestPartitionsFreedTakenAtTheNextPass: partitions a member let go of at
// its Stop are taken at the other member's very next pass, whether that pass
// rebalances or, after an idle one, looks on the relay's own session (the
// look's side: TestPartitionsIdleCheckTakesFreed, partitions_test.go).
func TestPartitionsFreedTakenAtTheNextPass(t *testing.T) {
	t.Parallel()
	b := harness.Setup(t)
	cfg := partitionedConfig(b, 4)
	cfg.Interval = time.Second // the stop falls between two of a's timer passes
	var passes passPartitions
	acfg := cfg
	acfg.Observer = &passes
	a := startReplica(t, b, "a", acfg, harness.NewRecorder("t", nil))
	passes.r.Store(a.r)
	other := startReplica(t, b, "b", cfg, harness.NewRecorder("t", nil))
	require.Eventually(t, func() bool { return settled([]*replica{a, other}, 4) }, 30*time.Second, 10*time.Millisecond)

	require.NoError(t, other.r.Stop(context.Background()))
	stopped := time.Now()
	var next passHeld
	require.Eventually(t, func() bool {
		var ok bool
		next, ok = passes.firstAfter(stopped)
		return ok
	}, 30*time.Second, 10*time.Millisecond)
	require.Equal(t, 4, next.held, "the first pass after the stop took the partitions let go of")
}

// TestPartitionsExcludeJVM: a JVM relay's exclusive hold of the app's key
// keeps partitioned replicas from delivering anything, and while a
// partitioned replica runs, a JVM relay never wins the key; the same with a
// Go replica of Partitions 1.
func TestPartitionsExcludeJVM(t *testing.T) {
	t.Parallel()
	b := harness.Setup(t)
	cfg := partitionedConfig(b, 8)
	recv := newOrderReceiver()

	release := harness.HoldLikeJVM(t, b.Config.AppName)
	ids := b.Insert(t, "t", harness.DistinctKeys("k", 20)...)
	rp := startReplica(t, b, "p", cfg, recv.sender("t"))
	require.Eventually(t, func() bool { return rp.r.Stats().PassesCoalesced >= 5 }, 30*time.Second, 10*time.Millisecond)
	require.Zero(t, rp.r.Stats().PassesElected)
	require.Nil(t, rp.r.Stats().Partitions)
	require.Zero(t, b.CountStatus(t, "SENT"), "nothing delivered while the JVM relay holds the key")

	release()
	require.Eventually(t, func() bool { return b.CountStatus(t, "SENT") == len(ids) }, 30*time.Second, 10*time.Millisecond,
		"the partitioned replica delivers once the JVM relay let go")
	require.Len(t, rp.r.Stats().Partitions, 8, "alone, it holds every partition")
	require.False(t, harness.LockFree(t, b.Config.AppName), "a JVM relay cannot win the key while a partitioned replica runs")

	// A Go replica of Partitions 1 is excluded the same way.
	single := b.Config
	single.Interval = 20 * time.Millisecond
	one := startReplica(t, b, "one", single, recv.sender("t"))
	more := b.Insert(t, "t", harness.DistinctKeys("m", 20)...)
	require.Eventually(t, func() bool { return b.CountStatus(t, "SENT") == len(ids)+len(more) }, 30*time.Second, 10*time.Millisecond)
	require.Zero(t, one.r.Stats().PassesElected, "the replica of Partitions 1 never won the key")
	require.Zero(t, one.r.Stats().Sent)

	require.NoError(t, rp.r.Stop(context.Background()))
	require.Eventually(t, func() bool { return one.r.Stats().PassesElected > 0 }, 30*time.Second, 10*time.Millisecond,
		"once the partitioned replica stopped, the replica of Partitions 1 is elected")
	require.NoError(t, one.r.Stop(context.Background()))
	require.True(t, harness.LockFree(t, b.Config.AppName), "stopped replicas leave no lock behind")
	require.Empty(t, recv.check(t, append(ids, more...)))
}

// TestPartitionsRollingDeploy: four replicas with Partitions 16 are
// replaced one by one, twice over, while a producer writes rows for 40 keys:
// every row is delivered exactly once, and each key in id order.
func TestPartitionsRollingDeploy(t *testing.T) {
	t.Parallel()
	b := harness.Setup(t)
	cfg := partitionedConfig(b, 16)
	cfg.Concurrency = 4
	recv := newOrderReceiver()

	prod := startProducer(b, 40, 0)

	replicas := make([]*replica, 4)
	for i := range replicas {
		replicas[i] = startReplica(t, b, fmt.Sprint("a", i), cfg, recv.sender("t"))
	}
	for gen := range 2 {
		for i := range replicas {
			// Some rows are written under each line-up of replicas.
			mark := prod.count()
			require.Eventually(t, func() bool { return prod.count() >= mark+50 }, 30*time.Second, time.Millisecond)
			require.NoError(t, replicas[i].r.Stop(context.Background()))
			replicas[i] = startReplica(t, b, fmt.Sprintf("g%d_%d", gen, i), cfg, recv.sender("t"))
		}
	}
	written := prod.stop(t)
	require.Eventually(t, func() bool { return b.CountStatus(t, "SENT") == len(written) }, 60*time.Second, 10*time.Millisecond,
		"every row written is delivered")
	require.Empty(t, recv.check(t, written), "a rolling deploy repeats nothing")
	t.Logf("%d rows over 40 keys, 12 replicas in turn", len(written))
}

// TestPartitionsRunIfElected: without a started loop, RunIfElected joins,
// runs its share and leaves, and reports whether it held a partition.
func TestPartitionsRunIfElected(t *testing.T) {
	t.Parallel()
	b := harness.Setup(t)
	cfg := partitionedConfig(b, 4)
	recv := newOrderReceiver()
	r := b.NewRelay(t, cfg, recv.sender("t"))
	ids := b.Insert(t, "t", harness.DistinctKeys("k", 40)...)
	ran, err := r.RunIfElected(context.Background())
	require.NoError(t, err)
	require.True(t, ran)
	require.Equal(t, len(ids), b.CountStatus(t, "SENT"), "alone, it holds every partition")
	require.True(t, harness.LockFree(t, b.Config.AppName), "RunIfElected leaves the election when it returns")
	require.Nil(t, r.Stats().Partitions)

	release := harness.HoldLikeJVM(t, b.Config.AppName)
	b.Insert(t, "t", "late")
	ran, err = r.RunIfElected(context.Background())
	require.NoError(t, err)
	require.False(t, ran, "a JVM relay holds the key")
	release()
	require.Empty(t, recv.check(t, ids))
}

// TestPartitionsKilled: three replicas, separate processes, deliver by HTTP
// while a producer writes; one is killed (-9) mid-delivery and a new one
// joins, then another is killed. The server ends a killed replica's session
// at once, and the others take its partitions at their next pass: every row
// is delivered, each key's first deliveries in id order, and only what a
// killed replica had sent without recording its outcome comes twice.
func TestPartitionsKilled(t *testing.T) {
	t.Parallel()
	b := harness.Setup(t)
	recv := newOrderReceiver()
	dest := newNamedReceiver(t, recv, time.Millisecond)
	children := map[string]*exec.Cmd{}
	start := func(name string) { children[name] = startChildReplica(t, b, name, dest.url(name), 16) }
	kill := func(name string) {
		require.Eventually(t, func() bool { return dest.delivered(name) >= 20 }, 60*time.Second, time.Millisecond,
			"replica %s delivers before it is killed", name)
		require.NoError(t, children[name].Process.Kill())
		_ = children[name].Wait()
	}

	prod := startProducer(b, 40, 200*time.Microsecond)

	for _, name := range []string{"a", "b", "c"} {
		start(name)
	}
	kill("a")
	start("d")
	kill("b")
	require.Eventually(t, func() bool { return dest.delivered("d") >= 20 }, 60*time.Second, time.Millisecond, "the newcomer gets its share")
	written := prod.stop(t)
	require.Eventually(t, func() bool { return b.CountStatus(t, "SENT") == len(written) }, 60*time.Second, 10*time.Millisecond,
		"every row written is delivered")

	repeated := recv.check(t, written)
	recv.mu.Lock()
	defer recv.mu.Unlock()
	// A repeat is a message a killed replica sent whose outcome it had not
	// recorded: at most, per worker, the one in flight and the outcomes
	// waiting to be written (8).
	repeats := 0
	for _, id := range repeated {
		n := recv.times[id]
		repeats += n - 1
		require.True(t, dest.sent("a", id) || dest.sent("b", id), "row %d came %d times, but no replica that sent it was killed", id, n)
	}
	require.LessOrEqual(t, repeats, 2*4*(1+8), "repeats are bounded by what was in flight at the kills")
	t.Logf("%d rows, %d repeated after two kills; replica a delivered %d, b %d, c %d, d %d",
		len(written), repeats, dest.delivered("a"), dest.delivered("b"), dest.delivered("c"), dest.delivered("d"))
}

// TestPartitionsKilledChild is a replica of TestPartitionsKilled: it runs
// only as that test's child process, until killed.
func TestPartitionsKilledChild(t *testing.T) {
	name := os.Getenv("RELAY_PARTITION_CHILD")
	if name == "" {
		t.Skip("a replica of TestPartitionsKilled; it runs only as that test's child process")
	}
	table := os.Getenv("RELAY_PARTITION_TABLE")
	cfg := relay.DefaultConfig()
	cfg.AppName, cfg.Table = table, table
	cfg.Partitions = 16
	if n := os.Getenv("RELAY_PARTITION_N"); n != "" {
		var err error
		cfg.Partitions, err = strconv.Atoi(n)
		require.NoError(t, err)
	}
	cfg.Interval = 100 * time.Millisecond
	cfg.Concurrency = 4
	sender, err := relay.NewHTTPSender(relay.HTTPSenderConfig{Type: "t", URL: relay.URLWithKey(os.Getenv("RELAY_PARTITION_RECEIVER"))})
	require.NoError(t, err)
	r, err := relay.New(pgserver.Pool(t, harness.Server().URL, table+"_"+name, 8), cfg, sender)
	require.NoError(t, err)
	require.NoError(t, r.Start(context.Background()))
	select {} // until the parent kills it
}

// TestPartitionsChangeCount: a deploy that changes Partitions from 8 to 16.
// Two counts' partitions do not nest (a key's partition of 8 and of 16 are
// different locks), so the newcomer takes none while a replica of the old
// count holds any, and takes them all once the last one stopped: a key is
// never delivered by two replicas at once.
func TestPartitionsChangeCount(t *testing.T) {
	t.Parallel()
	b := harness.Setup(t)
	recv := newOrderReceiver()
	old := startReplica(t, b, "old", partitionedConfig(b, 8), recv.sender("t"))
	require.Eventually(t, func() bool { return len(old.r.Stats().Partitions) == 8 }, 30*time.Second, 10*time.Millisecond)

	logs := &testlog.Buffer{}
	cfg := partitionedConfig(b, 16)
	cfg.Logger = logs.Logger()
	next := startReplica(t, b, "new", cfg, recv.sender("t"))
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "partitions are held with another Partitions") },
		30*time.Second, 10*time.Millisecond, "the newcomer says why it takes none:\n%s", logs)
	ids := b.Insert(t, "t", harness.DistinctKeys("k", 50)...)
	require.Eventually(t, func() bool { return b.CountStatus(t, "SENT") == len(ids) }, 30*time.Second, 10*time.Millisecond)
	require.Nil(t, next.r.Stats().Partitions)
	require.Zero(t, next.r.Stats().Sent, "the replica of the new count delivered nothing beside the old one")
	require.Equal(t, 8, len(old.r.Stats().Partitions), "the old one keeps all of its count's partitions")

	require.NoError(t, old.r.Stop(context.Background()))
	require.Eventually(t, func() bool { return len(next.r.Stats().Partitions) == 16 }, 30*time.Second, 10*time.Millisecond,
		"once the old count's last holder stopped, the new count takes over")
	more := b.Insert(t, "t", harness.DistinctKeys("m", 50)...)
	require.Eventually(t, func() bool { return b.CountStatus(t, "SENT") == len(ids)+len(more) }, 30*time.Second, 10*time.Millisecond)
	require.Empty(t, recv.check(t, append(ids, more...)))
}

// producer writes rows of type t over keys natural keys, one per statement,
// pause apart, until stopped, as a service's transactions would.
type producer struct {
	cancel  context.CancelFunc
	done    sync.WaitGroup
	mu      sync.Mutex
	written []int64
	err     error
}

func startProducer(b *harness.Bundle, keys int, pause time.Duration) *producer {
	ctx, cancel := context.WithCancel(context.Background())
	p := &producer{cancel: cancel}
	insert := "INSERT INTO " + pgx.Identifier{b.Table}.Sanitize() + " (type, natural_key, payload) VALUES ('t', $1, '{}') RETURNING id"
	p.done.Go(func() {
		for i := 0; ctx.Err() == nil; i++ {
			var id int64
			if err := b.Pool.QueryRow(context.Background(), insert, fmt.Sprint("k", i%keys)).Scan(&id); err != nil {
				p.mu.Lock()
				p.err = err
				p.mu.Unlock()
				return
			}
			p.mu.Lock()
			p.written = append(p.written, id)
			p.mu.Unlock()
			time.Sleep(pause)
		}
	})
	return p
}

// count is how many rows it has written so far.
func (p *producer) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.written)
}

// stop stops it and returns the ids it wrote, in order.
func (p *producer) stop(t *testing.T) []int64 {
	t.Helper()
	p.cancel()
	p.done.Wait()
	require.NoError(t, p.err)
	return p.written
}

// TestPartitionsZombieMember cuts a member off silently: a proxy between it
// and the server stops forwarding and keeps the sockets open, as a host cut
// off without a FIN (or a frozen process) looks to the server. The server
// ends the member's session when its lease runs out, which frees its
// partitions, and the other member takes them and delivers their rows within
// the field-faults bound, in key order.
func TestPartitionsZombieMember(t *testing.T) {
	t.Parallel()
	b := harness.Setup(t)
	proxy, viaProxy, err := pgserver.ProxyURL(harness.Server().URL)
	require.NoError(t, err)
	t.Cleanup(func() { proxy.Close() })
	cfg := partitionedConfig(b, 8)
	cfg.Interval = 100 * time.Millisecond
	recv := newOrderReceiver()

	cutOff, err := relay.New(pgserver.Pool(t, viaProxy, b.Table+"_a", 6), cfg, recv.sender("t"))
	require.NoError(t, err)
	require.NoError(t, cutOff.Start(context.Background()))
	other := startReplica(t, b, "b", cfg, recv.sender("t"))
	both := []*replica{{r: cutOff}, other}
	require.Eventually(t, func() bool { return settled(both, 8) }, 30*time.Second, 5*time.Millisecond)
	before := b.Insert(t, "t", harness.DistinctKeys("before", 40)...)
	require.Eventually(t, func() bool { return b.CountStatus(t, "SENT") == len(before) }, 30*time.Second, 5*time.Millisecond)

	proxy.Freeze()
	cut := time.Now()
	after := b.Insert(t, "t", harness.DistinctKeys("after", 40)...)
	require.Eventually(t, func() bool { return len(other.r.Stats().Partitions) == 8 }, harness.TakeoverBound+5*time.Second, 10*time.Millisecond,
		"the other member takes the cut-off one's partitions")
	takeover := time.Since(cut)
	require.Eventually(t, func() bool { return b.CountStatus(t, "SENT") == len(before)+len(after) }, 30*time.Second, 10*time.Millisecond)
	t.Logf("the other member held every partition %s after the cut (bound %s)", takeover.Round(time.Millisecond), harness.TakeoverBound)
	require.Less(t, takeover, harness.TakeoverBound)

	proxy.Thaw()
	stopCtx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	require.NoError(t, other.r.Stop(stopCtx))
	_ = cutOff.Stop(stopCtx) // its last pass may end with its session lost
	require.Empty(t, recv.check(t, append(before, after...)), "nothing was in flight at the cut: nothing repeated")
	require.True(t, harness.LockFree(t, b.Config.AppName), "no lock left behind")
}

// TestPartitionsIdleMemberFindsRows: an idle member learns in its rebalance's
// round trip that its partitions have nothing to deliver, and makes no select
// then (internal/loop's TestIdlePartitionedMemberOneRoundTripPerPass counts it); rows written without a NOTIFY, later, are
// found by that same check and delivered, in key order, by both members. A
// check that fails (the table renamed away under the members) is no verdict:
// the passes fail on the select, as before, and deliver again once the table
// is back.
func TestPartitionsIdleMemberFindsRows(t *testing.T) {
	t.Parallel()
	b := harness.Setup(t)
	cfg := partitionedConfig(b, 4)
	cfg.WakeOnCommit = false // only the timer's passes, whose rebalance carries the check
	recv := newOrderReceiver()
	var passes [2]harness.PassCounter
	var replicas []*replica
	for i := range passes {
		c := cfg
		c.Observer = &passes[i]
		replicas = append(replicas, startReplica(t, b, fmt.Sprint("r", i), c, recv.sender("t")))
	}
	require.Eventually(t, func() bool { return settled(replicas, 4) }, 30*time.Second, 10*time.Millisecond)
	idle := func() { // a few passes more on each, with nothing to deliver
		n0, n1 := passes[0].N.Load(), passes[1].N.Load()
		require.Eventually(t, func() bool { return passes[0].N.Load() >= n0+3 && passes[1].N.Load() >= n1+3 },
			30*time.Second, 10*time.Millisecond)
	}
	idle()
	var keys []string
	for i := range 40 {
		keys = append(keys, fmt.Sprintf("k%02d", i%10))
	}
	ids := b.Insert(t, "t", keys...)
	require.Eventually(t, func() bool { return b.CountStatus(t, "SENT") == len(ids) }, 30*time.Second, 10*time.Millisecond)
	require.Empty(t, recv.check(t, ids), "each row delivered once")

	away := pgx.Identifier{b.Table + "_away"}.Sanitize()
	b.Exec(t, "ALTER TABLE %s RENAME TO "+away)
	idle()
	_, err := b.Pool.Exec(context.Background(), "ALTER TABLE "+away+" RENAME TO "+pgx.Identifier{b.Table}.Sanitize())
	require.NoError(t, err)
	more := b.Insert(t, "t", keys[:10]...)
	require.Eventually(t, func() bool { return b.CountStatus(t, "SENT") == len(ids)+len(more) }, 30*time.Second, 10*time.Millisecond)
	require.Empty(t, recv.check(t, append(ids, more...)))
	require.True(t, settled(replicas, 4), "the members kept their partitions")
}
