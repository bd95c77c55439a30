package pass

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/xadm/relay/internal/store"
)

// These tests run the engine's lanes (lanes.go) on the in-memory table of
// engine_internal_test.go: no PostgreSQL.

// add appends rows of typ with keys to t, in order, and returns their ids.
func (t *memTable) add(typ string, keys ...string) []int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	var ids []int64
	for _, k := range keys {
		id := int64(len(t.rows) + 1)
		t.rows[id] = &store.Row{ID: id, Type: typ, Key: k}
		ids = append(ids, id)
	}
	return ids
}

// status is row id's status and attempts.
func (t *memTable) status(id int64) (string, int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	r := t.rows[id]
	return r.Status.String, r.Attempts
}

// laneRelay is a Runner with no pool and a sender per type, for the engine
// alone, its Config changed by cfg.
func laneRelay(t *testing.T, concurrency int, cfg func(*Config), senders ...typedSender) *Runner {
	t.Helper()
	c := Config{Concurrency: concurrency, Workers: concurrency, BatchSize: 100, MaxAttempts: 10, PauseAfter: 5,
		SendTimeout: time.Hour, Interval: time.Second}
	if cfg != nil {
		cfg(&c)
	}
	ss := map[string]Sender{}
	for _, s := range senders {
		ss[s.Type()] = s
	}
	return New(c, slices.Sorted(maps.Keys(ss)), Deps{Senders: ss, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
}

// typedSender is a test's Sender that says its type.
type typedSender interface {
	Sender
	Type() string
}

// senderFunc adapts a function to a typedSender of type typ.
type senderFunc struct {
	typ  string
	send func(ctx context.Context, m store.Row) error
}

func (s senderFunc) Type() string                                { return s.typ }
func (s senderFunc) Send(ctx context.Context, m store.Row) error { return s.send(ctx, m) }

// runLanes runs one pass of r's engine over t, its lanes separable or not.
func runLanes(r *Runner, t *memTable, o Opts, separable bool) Result {
	o.Keyed = separable
	return runMem(r, t, o)
}

// gatedSender sends type typ: each Send takes a token from gate first (nil:
// none), then fails when fail says so. It records what it sent, in order.
type gatedSender struct {
	typ  string
	gate chan struct{}
	fail func(m store.Row) error

	mu    sync.Mutex
	sent  []store.Row
	tried []string // the keys of every Send past the gate, in order
}

func (s *gatedSender) Type() string { return s.typ }

func (s *gatedSender) Send(ctx context.Context, m store.Row) error {
	if s.gate != nil {
		select {
		case <-s.gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	s.mu.Lock()
	s.tried = append(s.tried, m.Key)
	s.mu.Unlock()
	if s.fail != nil {
		if err := s.fail(m); err != nil {
			return err
		}
	}
	s.mu.Lock()
	s.sent = append(s.sent, m)
	s.mu.Unlock()
	return nil
}

func (s *gatedSender) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.sent)
}

func keysOf(prefix string, n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = prefix + string(rune('a'+i%26)) + string(rune('a'+i/26))
	}
	return keys
}

// waitFor waits until cond holds, failing the test after a minute.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	require.Eventually(t, cond, time.Minute, time.Millisecond, what)
}

// TestLanesShareTheWorkers: x's destination answers one message at a time,
// at the test's pace; y's at once. With two workers, one serves y while x's
// first message is still unanswered; with one, it hands the rest of its task
// back after x's first message, and serves y's keys one after each of x's.
func TestLanesShareTheWorkers(t *testing.T) {
	for _, tc := range []struct {
		name             string
		workers, xTokens int
	}{
		{"TwoWorkers", 2, 0},
		{"OneWorkerHandsBack", 1, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			table := newMemTable(100)
			table.add("x", keysOf("x", 20)...)
			table.add("y", keysOf("y", 5)...)
			x := &gatedSender{typ: "x", gate: make(chan struct{})}
			y := &gatedSender{typ: "y"}
			r := laneRelay(t, tc.workers, nil, x, y)
			done := make(chan Result, 1)
			go func() { done <- runLanes(r, table, Opts{Drain: true, DrainFor: time.Hour}, false) }()
			for range tc.xTokens {
				x.gate <- struct{}{}
			}
			waitFor(t, "y's messages sent while x's wait", func() bool { return y.count() == 5 })
			require.LessOrEqual(t, x.count(), tc.xTokens, "x sent only what its destination answered")
			close(x.gate)
			res := <-done
			require.NoError(t, res.Err)
			require.Equal(t, 25, res.Sent)
		})
	}
}

// TestLanesPauseDropsTheLanesTasks: x's destination refuses everything;
// after PauseAfter failures in a row x is paused, its queued keys are not
// tried, and keep their status and attempts; y's go on.
func TestLanesPauseDropsTheLanesTasks(t *testing.T) {
	table := newMemTable(100)
	xs := table.add("x", keysOf("x", 10)...)
	table.add("y", keysOf("y", 5)...)
	x := &gatedSender{typ: "x", fail: func(store.Row) error { return errors.New("503 from x") }}
	y := &gatedSender{typ: "y"}
	r := laneRelay(t, 1, func(c *Config) { c.PauseAfter = 2 }, x, y)
	res := runLanes(r, table, Opts{Drain: true, DrainFor: time.Hour}, false)
	require.NoError(t, res.Err)
	require.Equal(t, 5, res.Sent)
	require.Equal(t, 2, res.Failed, "x paused after 2 failures in a row")
	tried := 0
	for _, id := range xs {
		status, attempts := table.status(id)
		if status == store.StatusError {
			tried++
			require.Equal(t, 1, attempts)
		} else {
			require.Empty(t, status, "an x row not tried stays as it was")
			require.Zero(t, attempts)
		}
	}
	require.Equal(t, 2, tried)
	paused := r.lanes.Paused()
	require.Len(t, paused, 1)
	require.Equal(t, "x", paused[0].Type)
	require.Contains(t, paused[0].Reason, "2 sends in a row failed, the last: 503 from x")
	require.WithinDuration(t, paused[0].Since.Add(pauseFirst), paused[0].Until, time.Millisecond)

	// A pass while x is paused sends none of it.
	res = runLanes(r, table, Opts{Drain: true, DrainFor: time.Hour}, false)
	require.NoError(t, res.Err)
	require.Zero(t, res.Processed())
}

// TestLanesProbe: once its pause is over, a lane sends one message alone;
// its success opens the lane, and the next pass sends the rest. A probe
// that fails pauses the lane again, for twice as long.
func TestLanesProbe(t *testing.T) {
	table := newMemTable(100)
	table.add("x", keysOf("x", 6)...)
	down := true
	var mu sync.Mutex
	x := &gatedSender{typ: "x", fail: func(store.Row) error {
		mu.Lock()
		defer mu.Unlock()
		if down {
			return errors.New("connection refused")
		}
		return nil
	}}
	r := laneRelay(t, 2, func(c *Config) { c.PauseAfter = 1 }, x)
	l := r.lanes.byType["x"]
	res := runLanes(r, table, Opts{Drain: true, DrainFor: time.Hour}, false)
	require.NoError(t, res.Err)
	require.Equal(t, lanePaused, laneState(l.st.Load()))
	failedFirst := res.Failed

	endPause := func() {
		l.mu.Lock()
		l.until = time.Now().Add(-time.Millisecond)
		l.mu.Unlock()
	}
	endPause()
	res = runLanes(r, table, Opts{Drain: true, DrainFor: time.Hour}, false)
	require.NoError(t, res.Err)
	require.Equal(t, 1, res.Failed, "one probe, and it failed")
	require.Equal(t, laneProbing, laneState(l.st.Load()), "it failed fast: another key's probe goes first")
	res = runLanes(r, table, Opts{Drain: true, DrainFor: time.Hour}, false)
	require.NoError(t, res.Err)
	require.Equal(t, 1, res.Failed, "the second probe, and it failed too")
	p, _ := l.pausedType()
	require.WithinDuration(t, time.Now().Add(2*pauseFirst), p.Until, time.Second, "the second pause lasts twice as long")
	require.Contains(t, p.Reason, "the probes of two keys failed, the last: connection refused")
	x.mu.Lock()
	probes := x.tried[len(x.tried)-2:]
	x.mu.Unlock()
	require.NotEqual(t, probes[0], probes[1], "two keys asked")

	mu.Lock()
	down = false
	mu.Unlock()
	endPause()
	res = runLanes(r, table, Opts{Drain: true, DrainFor: time.Hour}, false)
	require.NoError(t, res.Err)
	require.Equal(t, 1, res.Sent, "the probe alone")
	require.Equal(t, laneOpen, laneState(l.st.Load()))
	require.Empty(t, r.lanes.Paused())
	res = runLanes(r, table, Opts{Drain: true, DrainFor: time.Hour}, false)
	require.NoError(t, res.Err)
	require.Equal(t, 6, x.count(), "every x message sent once the lane opened (failed first: %d)", failedFirst)
}

// TestStuckSendsHoldOnlyTheirKeys: with one worker, key x0's Send ignores
// its context and never returns (until the test lets it). It is given up at
// its SendTimeout and counted stuck: x0's next message waits behind it, never
// two of a key in flight, while x's other keys are all delivered. Once the
// Send returns, x0 goes on.
func TestStuckSendsHoldOnlyTheirKeys(t *testing.T) {
	table := newMemTable(100)
	first := table.add("x", "x0")[0]
	table.add("x", keysOf("x", 5)...)
	second := table.add("x", "x0")[0]
	release := make(chan struct{})
	var mu sync.Mutex
	var sent []string
	x := senderFunc{"x", func(_ context.Context, m store.Row) error {
		if m.ID == first {
			<-release // ignores its context
		}
		mu.Lock()
		sent = append(sent, m.Key)
		mu.Unlock()
		return nil
	}}
	r := laneRelay(t, 1, func(c *Config) { c.SendTimeout = 20 * time.Millisecond }, x)
	res := runLanes(r, table, Opts{Drain: true, DrainFor: time.Hour}, true)
	require.NoError(t, res.Err)
	require.Equal(t, 5, res.Sent, "x's other keys, past the stuck one")
	require.Equal(t, 1, res.Failed, "x0's first message failed with its context's cause")
	status, _ := table.status(second)
	require.Empty(t, status, "x0's next message waits behind the stuck Send")
	st := r.lanes.Stuck()
	require.Len(t, st, 1)
	require.Equal(t, "x", st[0].Type)
	require.Equal(t, 1, st[0].Sends)
	require.False(t, st[0].Since.IsZero())
	require.Empty(t, r.lanes.Paused(), "one stuck Send costs its key, not its type")

	res = runLanes(r, table, Opts{Drain: true, DrainFor: time.Hour}, true)
	require.NoError(t, res.Err)
	require.Zero(t, res.Processed(), "x0 waits while its Send still runs")

	close(release)
	waitFor(t, "the stuck Send returned, and counted back", func() bool { return len(r.lanes.Stuck()) == 0 })
	res = runLanes(r, table, Opts{Drain: true, DrainFor: time.Hour}, true)
	require.NoError(t, res.Err)
	require.Equal(t, 2, res.Sent, "x0's first message again, then its second")
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, "x0", sent[len(sent)-1])
}

// TestStuckSendsBound: every Send of x ignores its context. At the relay's
// bound of stuck Sends (StuckSendsMax) x is paused instead of leaving more
// behind, and says why; it probes again only once fewer run.
func TestStuckSendsBound(t *testing.T) {
	table := newMemTable(100)
	table.add("x", keysOf("x", 10)...)
	table.add("y", keysOf("y", 3)...)
	release := make(chan struct{})
	var running atomic.Int32
	x := senderFunc{"x", func(context.Context, store.Row) error {
		running.Add(1)
		defer running.Add(-1)
		<-release // ignores its context
		return nil
	}}
	y := &gatedSender{typ: "y"}
	r := laneRelay(t, 2, func(c *Config) { c.SendTimeout = 20 * time.Millisecond; c.StuckSendsMax = 3 }, x, y)
	l := r.lanes.byType["x"]
	res := runLanes(r, table, Opts{Drain: true, DrainFor: time.Hour}, false)
	require.NoError(t, res.Err)
	require.Equal(t, 3, res.Sent, "y's keys")
	// At the bound x is paused; only the Sends already in flight can join them.
	require.GreaterOrEqual(t, l.stuck.Load(), int32(3))
	require.LessOrEqual(t, l.stuck.Load(), int32(3+2-1), "no more x Sends left behind than the bound and the workers in flight")
	p, ok := l.pausedType()
	require.True(t, ok)
	require.Contains(t, p.Reason, "Sends ignored their context and still run, the relay's bound (StuckSendsMax)")

	l.mu.Lock()
	l.until = time.Now().Add(-time.Millisecond) // the pause is over, but they still run
	l.mu.Unlock()
	ok, _ = l.dispatchable(time.Now())
	require.False(t, ok, "no probe while the relay runs its bound")
	close(release)
	waitFor(t, "the stuck Sends returned, and counted back", func() bool {
		return running.Load() == 0 && l.stuck.Load() == 0 && len(r.lanes.Stuck()) == 0
	})
	ok, probe := l.dispatchable(time.Now())
	require.True(t, ok)
	require.True(t, probe)
}

// TestLanesHungrySelect: with separable lanes, y's rows written while x's
// keys are queued behind a slow destination are selected at a wake-up and
// sent before x's queue drains.
func TestLanesHungrySelect(t *testing.T) {
	// With one worker, the worker on x's task hands its rest back at a key's
	// end once y waits (starving).
	for _, workers := range []int{1, 2} {
		t.Run(map[int]string{1: "OneWorker", 2: "TwoWorkers"}[workers], func(t *testing.T) {
			table := newMemTable(100)
			table.add("x", keysOf("x", 30)...)
			x := &gatedSender{typ: "x", gate: make(chan struct{})}
			y := &gatedSender{typ: "y"}
			r := laneRelay(t, workers, nil, x, y)
			wake := make(chan struct{}, 1)
			done := make(chan Result, 1)
			go func() { done <- runLanes(r, table, Opts{Drain: true, DrainFor: time.Hour, Wake: wake}, true) }()
			x.gate <- struct{}{} // the pass is under way, x's keys queued
			table.add("y", keysOf("y", 4)...)
			wake <- struct{}{}
			// x's destination answers one message each time the test looks: the
			// workers reach a key's end, where one hands its task's rest back.
			waitFor(t, "y's rows selected and sent while x's wait", func() bool {
				select {
				case x.gate <- struct{}{}:
				default:
				}
				return y.count() == 4
			})
			require.Less(t, x.count(), 20, "y went before x's queue drained")
			close(x.gate)
			res := <-done
			require.NoError(t, res.Err)
			require.Equal(t, 34, res.Sent)
		})
	}
}

// TestLanesKeepAKeysOrderAcrossTypes: key k has an x row, then a y row. While
// x is paused, a separable select leaves x out and holds k's y row back
// behind its x row; the other y keys go.
func TestLanesKeepAKeysOrderAcrossTypes(t *testing.T) {
	for _, separable := range []bool{false, true} {
		t.Run(map[bool]string{false: "InPlan", true: "InTheSelect"}[separable], func(t *testing.T) {
			table := newMemTable(100)
			table.add("x", "k")
			held := table.add("y", "k", "a", "b")[0]
			x := &gatedSender{typ: "x"}
			y := &gatedSender{typ: "y"}
			r := laneRelay(t, 2, nil, x, y)
			l := r.lanes.byType["x"]
			l.mu.Lock()
			l.pauseLocked(time.Now(), "paused by the test")
			l.mu.Unlock()
			res := runLanes(r, table, Opts{Drain: true, DrainFor: time.Hour}, separable)
			require.NoError(t, res.Err)
			require.Equal(t, 2, res.Sent)
			status, _ := table.status(held)
			require.Empty(t, status, "k's y row waits behind its x row")
		})
	}
}

// TestLanesSlowLaneLeavesAWorker: a lane whose Sends are slow never takes
// the last worker while the relay has other lanes: y's rows, written while
// x's Sends wait, go through the worker left free.
func TestLanesSlowLaneLeavesAWorker(t *testing.T) {
	table := newMemTable(100)
	table.add("x", keysOf("x", 12)...)
	var inX, mostX atomic.Int32
	gate := make(chan struct{})
	x := senderFunc{"x", func(ctx context.Context, _ store.Row) error {
		n := inX.Add(1)
		defer inX.Add(-1)
		for m := mostX.Load(); n > m && !mostX.CompareAndSwap(m, n); m = mostX.Load() {
		}
		<-gate
		return nil
	}}
	y := &gatedSender{typ: "y"}
	r := laneRelay(t, 3, nil, x, y)
	r.lanes.byType["x"].slow.Store(true) // its last Send was slow
	wake := make(chan struct{}, 1)
	done := make(chan Result, 1)
	go func() { done <- runLanes(r, table, Opts{Drain: true, DrainFor: time.Hour, Wake: wake}, true) }()
	waitFor(t, "x's Sends under way", func() bool { return inX.Load() == 2 })
	table.add("y", keysOf("y", 3)...)
	wake <- struct{}{}
	waitFor(t, "y's rows sent while x's Sends wait", func() bool { return y.count() == 3 })
	require.Equal(t, int32(2), mostX.Load(), "x never held the last of 3 workers")
	close(gate)
	res := <-done
	require.NoError(t, res.Err)
	require.Equal(t, 15, res.Sent)
}
