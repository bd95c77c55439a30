package pass

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/xadm/relay/internal/relaytype"
	"github.com/xadm/relay/internal/store"
)

// These tests run the engine's ordering and hand-off logic on an in-memory
// table, without PostgreSQL: a memTable fetches, and its memOutcomes strategy
// records. The integration tests (drain_test.go, outcomes_test.go, …) run the
// same engine against the server.

// memTable is an outbox in memory: rows by id, selected by the model of the
// relay's select (select_model_test.go), at most limit a batch.
type memTable struct {
	mu      sync.Mutex
	rows    map[int64]*store.Row
	limit   int
	ceiling int
	selects int
}

func newMemTable(limit int, keys ...string) *memTable {
	t := &memTable{rows: map[int64]*store.Row{}, limit: limit, ceiling: 10}
	for i, k := range keys {
		id := int64(i + 1)
		t.rows[id] = &store.Row{ID: id, Type: "t", Key: k}
	}
	return t
}

func (t *memTable) Fetch(_ context.Context, q Query) (store.Batch, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.selects++
	m := modelTable{maxAttempts: t.ceiling, batch: t.limit, partition: partition}
	for _, id := range slices.Sorted(maps.Keys(t.rows)) {
		r := t.rows[id]
		m.rows = append(m.rows, &modelRow{id: id, typ: r.Type, key: r.Key, status: r.Status.String, attempts: r.Attempts, visible: true})
	}
	return m.fetch(q), nil
}

func (t *memTable) Starved() bool { return false }

func (t *memTable) Acquire(context.Context) (store.Conn, error) { panic("memTable: Acquire") }

// The memOutcomes strategy records; the rest of Outbox is not called.
func (t *memTable) Record(context.Context, store.Querier, []store.Update) (map[int64]bool, error) {
	panic("memTable: Record")
}

func (t *memTable) RecordEach(context.Context, store.Conn, []store.Update) (map[int64]bool, map[int64]error, error) {
	panic("memTable: RecordEach")
}

func (t *memTable) States(context.Context, store.Querier, []int64) (map[int64]store.State, error) {
	panic("memTable: States")
}

func (t *memTable) ErrWidth() int { return 0 }
func (t *memTable) Relearn()      {}

// memOutcomes records outcomes into its memTable, one at a time.
type memOutcomes struct {
	rc *recorder
	t  *memTable
}

func (s memOutcomes) ready(context.Context) error           { return s.rc.errorOf() }
func (s memOutcomes) hold(context.Context, *heldConn) error { return nil }
func (s memOutcomes) flush() error                          { return s.rc.errorOf() }
func (s memOutcomes) close() error                          { return s.rc.errorOf() }

func (s memOutcomes) add(ds []delivery, _ *heldConn) error {
	s.t.mu.Lock()
	for _, d := range ds {
		r := s.t.rows[d.m.ID]
		if d.out == relaytype.OutcomeSent {
			r.Status.String = store.StatusSent
		} else {
			r.Status.String = store.StatusError
			r.Attempts = int(d.newAttempts(s.t.ceiling))
		}
	}
	s.t.mu.Unlock()
	s.rc.report(ds)
	return s.rc.errorOf()
}

// orderSender sends into a log, checks that no two messages of a key are in
// flight at once, and fails the messages fail says.
type orderSender struct {
	mu       sync.Mutex
	inFlight map[string]bool
	sent     []store.Row
	overlaps []string
	fail     func(m store.Row) bool
	hold     chan struct{} // when set, each send waits for it
}

func (s *orderSender) Type() string { return "t" }

func (s *orderSender) Send(ctx context.Context, m store.Row) error {
	s.mu.Lock()
	if s.inFlight[m.Key] {
		s.overlaps = append(s.overlaps, m.Key)
	}
	s.inFlight[m.Key] = true
	s.mu.Unlock()
	if s.hold != nil {
		<-s.hold
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.inFlight, m.Key)
	if s.fail != nil && s.fail(m) {
		return errors.New("refused")
	}
	s.sent = append(s.sent, m)
	return nil
}

// memRelay is a Runner with no pool, for the engine alone, its senders of
// type "t".
func memRelay(t *testing.T, concurrency, batch int, s Sender) *Runner {
	t.Helper()
	cfg := Config{Concurrency: concurrency, Workers: concurrency, BatchSize: batch, MaxAttempts: 10, PauseAfter: 5,
		SendTimeout: time.Hour, Interval: time.Second}
	return New(cfg, []string{"t"}, Deps{Senders: map[string]Sender{"t": s}, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
}

// runMem runs one pass of r's engine over t.
func runMem(r *Runner, t *memTable, o Opts) Result { return runMemCtx(context.Background(), r, t, o) }

// runMemCtx is runMem with the pass's context.
func runMemCtx(ctx context.Context, r *Runner, t *memTable, o Opts) Result {
	e := r.newEngine(ctx, o, t)
	e.rec = &recorder{r: r, ctx: context.Background(), res: &e.res, pipeline: outcomePipeline}
	e.rec.outcomeStrategy = memOutcomes{rc: e.rec, t: t}
	e.run()
	return e.res
}

func TestEngineDrainsInKeyOrder(t *testing.T) {
	for _, tc := range []struct {
		name              string
		keys, concurrency int
		rows, batch       int
	}{
		{"OneKeyManyBatches", 1, 4, 50, 7},
		{"FewKeysManyWorkers", 3, 8, 90, 10},
		{"ManyKeysOneWorker", 40, 1, 120, 16},
		{"ManyKeysSmallBatches", 25, 4, 200, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var keys []string
			for i := range tc.rows {
				keys = append(keys, fmt.Sprint("k", i%tc.keys))
			}
			table := newMemTable(tc.batch, keys...)
			s := &orderSender{inFlight: map[string]bool{}}
			r := memRelay(t, tc.concurrency, tc.batch, s)
			res := runMem(r, table, Opts{Drain: true, DrainFor: time.Hour})
			require.NoError(t, res.Err)
			require.Equal(t, tc.rows, res.Sent)
			require.Empty(t, s.overlaps, "two messages of one key in flight at once")
			last := map[string]int64{}
			seen := map[int64]bool{}
			for _, m := range s.sent {
				require.False(t, seen[m.ID], "row %d sent twice", m.ID)
				seen[m.ID] = true
				require.Greater(t, m.ID, last[m.Key], "key %s out of id order", m.Key)
				last[m.Key] = m.ID
			}
		})
	}
}

func TestEngineOneBatchWithoutDrain(t *testing.T) {
	table := newMemTable(5, "a", "b", "c", "d", "e", "f", "g")
	s := &orderSender{inFlight: map[string]bool{}}
	res := runMem(memRelay(t, 2, 5, s), table, Opts{})
	require.NoError(t, res.Err)
	require.Equal(t, 5, res.Sent, "Run and RunIfElected take one batch")
	require.Equal(t, 1, table.selects)
}

func TestEngineFailureStopsItsKey(t *testing.T) {
	// Key a's second message fails: a's later messages wait for a later pass;
	// b's go on.
	var keys []string
	for range 10 {
		keys = append(keys, "a", "b")
	}
	table := newMemTable(20, keys...)
	s := &orderSender{inFlight: map[string]bool{}, fail: func(m store.Row) bool { return m.ID == 3 }}
	res := runMem(memRelay(t, 2, 20, s), table, Opts{Drain: true, DrainFor: time.Hour})
	require.NoError(t, res.Err)
	require.Equal(t, 1, res.Failed)
	var a, b []int64
	for _, m := range s.sent {
		if m.Key == "a" {
			a = append(a, m.ID)
		} else {
			b = append(b, m.ID)
		}
	}
	require.Equal(t, []int64{1}, a, "nothing of a after its failed message")
	require.Len(t, b, 10, "b goes on")
	for id := int64(5); id <= 19; id += 2 {
		require.Empty(t, table.rows[id].Status.String, "a's row %d waits, unsent, for a later pass", id)
	}
}

func TestEngineKeyInFlightIsNotHandedOutTwice(t *testing.T) {
	// Batches of 2 over one key: every batch after the first finds the key in
	// flight, and its rows wait until the key is idle; each row goes once, in order.
	table := newMemTable(2, "a", "a", "a", "a", "a", "a")
	s := &orderSender{inFlight: map[string]bool{}, hold: make(chan struct{})}
	r := memRelay(t, 4, 2, s)
	done := make(chan Result)
	go func() { done <- runMem(r, table, Opts{Drain: true, DrainFor: time.Hour}) }()
	for range 6 {
		s.hold <- struct{}{}
	}
	res := <-done
	require.NoError(t, res.Err)
	require.Equal(t, 6, res.Sent)
	require.Empty(t, s.overlaps)
	var ids []int64
	for _, m := range s.sent {
		ids = append(ids, m.ID)
	}
	require.Equal(t, []int64{1, 2, 3, 4, 5, 6}, ids)
}

func TestEngineHaltStartsNothingNew(t *testing.T) {
	table := newMemTable(10, "a", "b", "c")
	s := &orderSender{inFlight: map[string]bool{}}
	halt := make(chan struct{})
	close(halt)
	res := runMem(memRelay(t, 2, 10, s), table, Opts{Halt: halt, Drain: true})
	require.NoError(t, res.Err)
	require.Zero(t, res.Sent)
	require.Empty(t, s.sent)
}

func TestCursor(t *testing.T) {
	rows := func(lane int, ids ...int64) []store.Row {
		var rs []store.Row
		for _, id := range ids {
			rs = append(rs, store.Row{ID: id, Lane: lane})
		}
		return rs
	}
	laneOf := func(typ string) int { return map[string]int{"x": 0, "y": 1}[typ] }
	both := []int{0, 1}
	c := newCursor(true, 0, 2)
	after, epoch, _ := c.next(both, true)
	require.Equal(t, []int64{math.MinInt64, math.MinInt64}, after)
	require.True(t, epoch, "a pass begins with an epoch")
	require.True(t, c.first)

	// x had more rows than the batch took, y had none: x goes on past its
	// last row, y where it was.
	c.selected(both, store.Batch{More: []string{"x"}, Epoch: 40}, rows(0, 1, 2, 3), epoch, false, laneOf)
	require.True(t, c.more)
	require.False(t, c.first)
	require.Equal(t, int64(40), c.epoch, "the epoch's highest id, for the selects that follow")
	after, epoch, rereads := c.next(both, true)
	require.Equal(t, []int64{3, math.MinInt64}, after)
	require.False(t, epoch)
	require.False(t, rereads, "on past the rows selected")

	// Short, but rows were left behind: a new epoch, every lane from the start.
	c.selected(both, store.Batch{}, append(rows(0, 4), rows(1, 5)...), false, true, laneOf)
	require.True(t, c.more)
	require.True(t, c.fromStart)
	after, epoch, rereads = c.next([]int{1}, true)
	require.Equal(t, []int64{math.MinInt64}, after)
	require.True(t, epoch)
	require.True(t, rereads, "an epoch goes over ids selected before")
	require.Equal(t, []int64{math.MinInt64, math.MinInt64}, c.after, "an epoch starts every lane from the start")

	c.selected([]int{1}, store.Batch{Epoch: 50}, rows(1, 5), true, false, laneOf) // nothing left behind since: the pass ends
	require.False(t, c.more)

	// A lane that cannot be selected any more gives up its place in the drain.
	d := newCursor(true, 0, 2)
	d.next(both, true)
	d.selected(both, store.Batch{More: []string{"x"}}, rows(0, 1), true, false, laneOf)
	require.True(t, d.more)
	d.drop(0)
	require.False(t, d.more)

	one := newCursor(false, 2, 1)
	one.next([]int{0}, true)
	one.selected([]int{0}, store.Batch{More: []string{"x"}}, one.take(rows(0, 1, 2, 3)), true, false, laneOf)
	require.False(t, one.more, "without drain, one batch")
	require.Equal(t, 2, one.taken, "a direct pass keeps its limit")

	cut := newCursor(false, 5, 1)
	cut.next([]int{0}, true)
	cut.selected([]int{0}, store.Batch{Cut: true}, cut.take(rows(0, 1, 2)), true, false, laneOf)
	require.True(t, cut.more, "a direct pass cut by BatchBytes goes on past it")
	after, _, _ = cut.next([]int{0}, true)
	require.Equal(t, []int64{2}, after)
	cut.selected([]int{0}, store.Batch{More: []string{"x"}}, cut.take(rows(0, 3, 4, 5, 6)), false, false, laneOf)
	require.False(t, cut.more, "until its limit")
	require.Equal(t, 5, cut.taken)
}

// gateSender says when each send begins, and waits to be let go.
type gateSender struct {
	began   chan int64
	release chan struct{}
}

func (gateSender) Type() string { return "t" }
func (s gateSender) Send(_ context.Context, m store.Row) error {
	s.began <- m.ID
	<-s.release
	return nil
}

// TestEngineWokenSelectsAgain: a wake-up that comes while a pass's last
// message is in flight has the pass select again, so the row it announces is
// sent in the same pass, not after it; without the loop's wake-ups (Run,
// RunIfElected) a pass takes what it found.
func TestEngineWokenSelectsAgain(t *testing.T) {
	for _, withWake := range []bool{true, false} {
		t.Run(fmt.Sprint("wake=", withWake), func(t *testing.T) {
			tb := newMemTable(100, "a")
			s := gateSender{began: make(chan int64), release: make(chan struct{})}
			wake := make(chan struct{}, 1)
			o := Opts{Drain: true}
			if withWake {
				o.Wake = wake
			}
			done := make(chan Result, 1)
			go func() { done <- runMem(memRelay(t, 2, 100, s), tb, o) }() // a second worker for b
			require.EqualValues(t, 1, <-s.began)                          // the batch, short, was the pass's last
			tb.mu.Lock()
			tb.rows[2] = &store.Row{ID: 2, Type: "t", Key: "b"} // committed meanwhile, and notified
			tb.mu.Unlock()
			wake <- struct{}{}
			if withWake {
				require.EqualValues(t, 2, <-s.began, "b sent in the same pass, while a is in flight")
				s.release <- struct{}{}
			}
			s.release <- struct{}{}
			res := <-done
			require.Equal(t, withWake, res.Woken)
			if withWake {
				require.Equal(t, 2, res.Sent)
				require.Len(t, wake, 0, "the pass took the wake-up")
				return
			}
			require.Equal(t, 1, res.Sent)
			require.Len(t, wake, 1, "left to the loop")
		})
	}
}
