package pass

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/xadm/relay/internal/relaytype"
	"github.com/xadm/relay/internal/store"
)

// This file is the randomized test of per-key order: a relay's passes run
// on a model of the table (world), many keys and types, while senders fail at
// random, types pause and probe, failed rows wait out their backoff, rows are
// re-queued, partitions change, batches are cut by bytes, and new rows arrive
// mid-drain, some committed late (an id drawn before a select passed it,
// committed after). At every Send it asserts the rule of decision 0041: the
// relay never sends a message while an older live message of its key is
// unsent, and never two messages of a key at once.
//
//	go test ./internal/pass -run TestKeyOrderRandomized -keyorder.runs 2000   # long
var (
	keyOrderRuns    = flag.Int("keyorder.runs", 60, "runs of TestKeyOrderRandomized, each a random relay and a random history")
	keyOrderLate    = flag.Bool("keyorder.late", true, "TestKeyOrderRandomized: some rows commit late")
	keyOrderRequeue = flag.Bool("keyorder.requeue", true, "TestKeyOrderRandomized: dead rows are re-queued")
	keyOrderSeed    = flag.Uint64("keyorder.seed", 0, "TestKeyOrderRandomized: the first run's seed (0: the clock's)")
)

// world is the table as a model: every row, the visible ones and those whose
// transaction has not committed yet, and a clock for the backoff.
type world struct {
	mu    sync.Mutex
	rng   *rand.Rand
	t     modelTable // its rows, its clock (moved by the test) and the relay's select of them
	rows  map[int64]*modelRow
	next  int64
	types []string // the relay's

	health      map[string]health // by type
	delivered   map[int64]bool    // Sends that returned nil
	inFlight    map[string]int64  // key → the id in a Send
	broken      []string          // what broke the rule, as it happened
	sends       int               // Sends started
	lanes       func() []*lane    // the relay's, to end pauses as time passes
	trail       []string          // the last events, for a failure's message
	late        map[string]int64  // key → its row whose transaction has not committed
	keys        []string          // the keys rows are written for
	requeued    int               // rows re-queued
	clock       int               // counts selects and re-queues, in the order they happen
	picked      map[int64]int     // id → the clock of the first select that returned it since its last outcome
	revived     map[int64]int     // id → the clock of its last re-queue
	passSelects int               // selects of the pass running
	group       int               // outcomes written in groups of this many (GroupOutcomes); 0: each at once
	wake        chan struct{}     // the pass\'s wake-ups (Opts.Wake)
	lateRows    int               // rows committed late
	hook        func(w *world)    // called at each Send, under mu: more events
}

// health is a type's destination: it refuses everything (down), or one key
// (bad), or each message with a chance (flaky).
type health struct {
	down  bool
	bad   string
	flaky float64
}

func (w *world) live(r *modelRow) bool { return w.t.live(r) }

func (w *world) dead(r *modelRow) bool {
	return r.visible && r.status == store.StatusError && r.attempts >= w.t.maxAttempts
}

func (w *world) note(format string, args ...any) {

	w.trail = append(w.trail, fmt.Sprintf(format, args...))
	if len(w.trail) > 400 {
		w.trail = w.trail[100:]
	}
}

// insert writes a row for key of typ; late: its transaction commits later.
// A key's writers take its order lock: a row is written only once the key's
// last row committed (commit commits it first).
func (w *world) insert(typ, key string, late bool) {
	if id, ok := w.late[key]; ok {
		w.commit(id)
	}
	w.next++
	r := &modelRow{id: w.next, typ: typ, key: key, status: store.StatusPending, size: 1 + w.rng.IntN(40), visible: !late}
	w.rows[r.id] = r
	w.t.rows = append(w.t.rows, r)
	if late {
		w.late[key] = r.id
	} else {
		w.notify()
	}
	w.note("insert %d %s/%s late=%v", r.id, typ, key, late)
}

// notify wakes the pass, as a commit's NOTIFY does (Opts.Wake).
func (w *world) notify() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

func (w *world) commit(id int64) {
	r := w.rows[id]
	r.visible = true
	w.notify()
	delete(w.late, r.key)
	w.lateRows++
	w.note("commit %d", id)
}

// requeue re-queues a dead row as relayctl does.
func (w *world) requeue(r *modelRow) {
	r.status, r.attempts, r.updated = requeuedStatus, 0, w.t.now
	w.clock++
	w.revived[r.id] = w.clock
	w.requeued++
	w.note("requeue %d", r.id)
}

// event is one random thing happening to the world: rows written (some late),
// late rows committed, a dead row re-queued, time passing (backoffs and
// pauses end), a destination changing its health.
func (w *world) event() {
	switch n := w.rng.IntN(100); {
	case n < 40:
		for range 1 + w.rng.IntN(3) {
			typ := w.types[w.rng.IntN(len(w.types))]
			if w.rng.IntN(10) == 0 {
				typ = "other" // another app's type, on the same keys
			}
			w.insert(typ, w.keys[w.rng.IntN(len(w.keys))], *keyOrderLate && w.rng.IntN(4) == 0)
		}
	case n < 55:
		for key, id := range w.late {
			if w.rng.IntN(2) == 0 {
				_ = key
				w.commit(id)
			}
		}
	case n < 62:
		if !*keyOrderRequeue {
			break
		}
		for _, r := range w.t.rows {
			if w.dead(r) && w.rng.IntN(3) == 0 {
				w.requeue(r)
				break
			}
		}
	case n < 80:
		w.t.now = w.t.now.Add(time.Duration(w.rng.IntN(3000)) * time.Millisecond)
		if w.rng.IntN(2) == 0 {
			w.endPauses()
		}
	default:
		typ := w.types[w.rng.IntN(len(w.types))]
		h := health{}
		switch w.rng.IntN(5) {
		case 0:
			h.down = true
		case 1:
			h.bad = w.keys[w.rng.IntN(len(w.keys))]
		case 2:
			h.flaky = 0.3
		}
		w.health[typ] = h
		w.note("health %s %+v", typ, h)
	}
}

// endPauses ends the pause of every paused lane, as if its time had passed.
func (w *world) endPauses() {
	for _, l := range w.lanes() {
		l.mu.Lock()
		if l.state == lanePaused {
			l.until = time.Now().Add(-time.Millisecond)
		}
		l.mu.Unlock()
	}
	w.note("pauses end")
}

// serves reports whether typ is one of the relay's types.
func (w *world) serves(typ string) bool { return slices.Contains(w.types, typ) }

// send is a Send of m: it checks the rule, lets things happen, and answers
// as m's destination does.
func (w *world) send(m store.Row) error {
	w.mu.Lock()
	w.sends++
	if id, ok := w.inFlight[m.Key]; ok {
		w.broken = append(w.broken, fmt.Sprintf("row %d sent while row %d of key %s is in flight", m.ID, id, m.Key))
	}
	if w.delivered[m.ID] {
		w.broken = append(w.broken, fmt.Sprintf("row %d sent again, though delivered and its outcome recorded or on its way", m.ID))
	}
	for _, o := range w.rows {
		// A row re-queued after m was selected rejoins its key's order
		// from the next select on (decision 0041): m may go first.
		if o.key == m.Key && o.id < m.ID && w.serves(o.typ) && w.live(o) && !w.delivered[o.id] && w.revived[o.id] <= w.picked[m.ID] {
			w.broken = append(w.broken, fmt.Sprintf("row %d (%s) of key %s sent while its older row %d (%s, %s, %d attempts) is unsent",
				m.ID, m.Type, m.Key, o.id, o.typ, o.status, o.attempts))
		}
	}
	w.note("send %d %s/%s", m.ID, m.Type, m.Key)
	w.inFlight[m.Key] = m.ID
	if w.hook != nil {
		w.hook(w)
	}
	h := w.health[m.Type]
	fail := h.down || h.bad == m.Key || h.flaky > 0 && w.rng.Float64() < h.flaky
	delete(w.inFlight, m.Key)
	if !fail {
		w.delivered[m.ID] = true
	}
	w.mu.Unlock()
	if fail {
		return errors.New("503 from " + m.Type)
	}
	return nil
}

// worldSender is the Sender of one type of the world.
type worldSender struct {
	w   *world
	typ string
}

func (s worldSender) Send(_ context.Context, m store.Row) error { return s.w.send(m) }

// worldTable is the world as the pass reads and writes it: its Fetch is the
// select of sql/pass.sql, as a model (select_model_test.go).
type worldTable struct{ w *world }

func (t worldTable) Fetch(_ context.Context, q Query) (store.Batch, error) {
	t.w.mu.Lock()
	defer t.w.mu.Unlock()
	if t.w.passSelects++; t.w.passSelects > 2000 {
		t.w.broken = append(t.w.broken, fmt.Sprintf("a pass made %d selects: it selects again and again without sending (query %+v)", t.w.passSelects, q))
		return store.Batch{}, errors.New("too many selects")
	}
	f := t.w.t.fetch(q)
	var b strings.Builder
	for _, m := range f.Rows {
		fmt.Fprintf(&b, " %d%s/%s", m.ID, m.Type, m.Key)
		if m.Held != store.NotHeld {
			fmt.Fprintf(&b, "(held %d)", m.Held)
		}
	}
	t.w.note("select epoch=%v types=%v after=%v width=%v later=%v more=%v:%s", q.StartEpoch, q.Types, q.After, q.Width, q.Later, f.More, b.String())
	t.w.clock++
	for _, m := range f.Rows {
		if _, ok := t.w.picked[m.ID]; !ok {
			t.w.picked[m.ID] = t.w.clock
		}
	}
	return f, nil
}

func (t worldTable) Starved() bool                               { return false }
func (t worldTable) Acquire(context.Context) (store.Conn, error) { panic("worldTable: Acquire") }
func (t worldTable) Record(context.Context, store.Querier, []store.Update) (map[int64]bool, error) {
	panic("worldTable: Record")
}
func (t worldTable) RecordEach(context.Context, store.Conn, []store.Update) (map[int64]bool, map[int64]error, error) {
	panic("worldTable: RecordEach")
}
func (t worldTable) States(context.Context, store.Querier, []int64) (map[int64]store.State, error) {
	panic("worldTable: States")
}
func (t worldTable) ErrWidth() int { return 0 }
func (t worldTable) Relearn()      {}

// worldOutcomes records outcomes into the world at once, or, with a group
// size, as GroupOutcomes does: they wait, their keys done, until the group
// is full or the engine flushes it.
type worldOutcomes struct {
	rc    *recorder
	w     *world
	group int
	mu    *sync.Mutex
	held  *[]delivery
}

func (s worldOutcomes) ready(context.Context) error           { return s.rc.errorOf() }
func (s worldOutcomes) hold(context.Context, *heldConn) error { return nil }
func (s worldOutcomes) flush() error                          { s.write(nil, true); return s.rc.errorOf() }
func (s worldOutcomes) close() error                          { return s.flush() }

func (s worldOutcomes) add(ds []delivery, _ *heldConn) error {
	s.write(ds, false)
	return s.rc.errorOf()
}

// write writes ds, or adds them to the group, and writes the group when it
// is full or all is set. One write at a time, so that a flush returns once
// every outcome given before it is written (as groupedOutcomes' flushing).
func (s worldOutcomes) write(ds []delivery, all bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	*s.held = append(*s.held, ds...)
	var out []delivery
	if all || len(*s.held) >= s.group {
		out, *s.held = *s.held, nil
	}
	if len(out) == 0 {
		return
	}
	s.w.mu.Lock()
	for _, d := range out {
		r := s.w.rows[d.m.ID]
		s.w.note("outcome %d %v", d.m.ID, d.out)
		delete(s.w.picked, d.m.ID)
		if d.out == relaytype.OutcomeSent {
			r.status = store.StatusSent
		} else {
			r.status = store.StatusError
			r.attempts = int(d.newAttempts(s.w.t.maxAttempts))
		}
		r.updated = s.w.t.now
	}
	s.w.mu.Unlock()
	s.rc.report(out)
}

// partition is a key's partition of n, as the model computes it.
func partition(key string, n int) int {
	h := fnv.New32a()
	h.Write([]byte(key))
	return int(h.Sum32() % uint32(n))
}

// TestKeyOrderRandomized runs random relays through random histories and
// checks, at every Send, that no message of a key goes while an older live
// one of its key is unsent (world.send).
func TestKeyOrderRandomized(t *testing.T) {
	seed := *keyOrderSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	runs := *keyOrderRuns
	if testing.Short() {
		runs = min(runs, 10)
	}
	for run := range runs {
		s := seed + uint64(run)
		if !keyOrderRun(t, s) {
			t.Logf("failed in run %d of %d", run+1, runs)
			return
		}
	}
}

// keyOrderRun is one run of TestKeyOrderRandomized; false when it failed.
func keyOrderRun(t *testing.T, seed uint64) (ok bool) {
	rng := rand.New(rand.NewPCG(seed, seed^0x5eed))
	types := []string{"a", "b", "c"}[:1+rng.IntN(3)]
	w := &world{rng: rng, rows: map[int64]*modelRow{}, types: types,
		health: map[string]health{}, delivered: map[int64]bool{}, inFlight: map[string]int64{}, late: map[string]int64{},
		picked: map[int64]int{}, revived: map[int64]int{}, wake: make(chan struct{}, 1)}
	w.t = modelTable{now: time.Unix(1_000_000, 0), batch: 2 + rng.IntN(7), batchBytes: 20 + rng.IntN(200),
		maxAttempts: 2 + rng.IntN(4), partition: partition}
	if rng.IntN(2) == 0 {
		w.t.backoff, w.t.backoffCap = time.Duration(1+rng.IntN(3))*time.Second, 8*time.Second
	}
	if rng.IntN(3) == 0 {
		w.t.partitions = 2 + rng.IntN(3)
	}
	if rng.IntN(2) == 0 {
		w.group = 2 + rng.IntN(6)
	}
	for i := range 3 + rng.IntN(8) {
		w.keys = append(w.keys, fmt.Sprintf("k%d", i))
	}
	concurrency := 1 + rng.IntN(4)
	cfg := Config{Concurrency: concurrency, Workers: concurrency, BatchSize: w.t.batch, MaxAttempts: w.t.maxAttempts,
		PauseAfter: rng.IntN(4), SendTimeout: time.Hour, Interval: time.Duration(1+rng.IntN(50)) * time.Millisecond}
	senders := map[string]Sender{}
	for _, typ := range types {
		senders[typ] = worldSender{w: w, typ: typ}
	}
	r := New(cfg, types, Deps{Senders: senders, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	defer func() {
		if p := recover(); p != nil {
			t.Errorf("seed %d: %v\n%s", seed, p, strings.Join(w.trail[max(0, len(w.trail)-150):], "\n"))
			ok = false
		}
	}()
	w.lanes = func() []*lane { return r.lanes.all }
	w.hook = func(w *world) {
		if w.rng.IntN(3) == 0 {
			w.event()
		}
	}
	w.mu.Lock()
	for range 10 + rng.IntN(30) {
		w.insert(types[rng.IntN(len(types))], w.keys[rng.IntN(len(w.keys))], *keyOrderLate && rng.IntN(5) == 0)
	}
	w.mu.Unlock()
	keyed := rng.IntN(4) != 0
	pass := func(drain bool) {
		o := Opts{Drain: drain, DrainFor: time.Hour, Keyed: keyed}
		if drain && rng.IntN(2) == 0 {
			o.Wake = w.wake
		}
		if w.t.partitions > 0 {
			for p := range w.t.partitions {
				if rng.IntN(2) == 0 {
					o.Parts = append(o.Parts, p)
				}
			}
			if o.Parts == nil {
				o.Parts = []int{0}
			}
		}
		w.mu.Lock()
		w.passSelects = 0
		w.mu.Unlock()
		runWorld(r, w, o)
	}
	steps := 20 + rng.IntN(40)
	for step := range steps {
		pass(rng.IntN(4) != 0)
		w.mu.Lock()
		for range rng.IntN(4) {
			w.event()
		}
		broken := w.broken
		w.mu.Unlock()
		if len(broken) > 0 {
			t.Errorf("seed %d (types %d, concurrency %d, batch %d, bytes %d, pauseAfter %d, backoff %s, partitions %d, keyed %v, groups %d): step %d of %d, after %d sends: %s\nlast events:\n%s",
				seed, len(types), concurrency, w.t.batch, w.t.batchBytes, cfg.PauseAfter, w.t.backoff, w.t.partitions, keyed, w.group,
				step, steps, w.sends, broken[0], strings.Join(w.trail[max(0, len(w.trail)-150):], "\n"))
			return false
		}
	}
	// Heal: every destination answers, every row commits, time passes; the
	// relay then delivers everything left.
	w.mu.Lock()
	w.hook = nil
	clear(w.health)
	for _, id := range w.late {
		w.commit(id)
	}
	w.mu.Unlock()
	for range 200 {
		w.mu.Lock()
		w.t.now = w.t.now.Add(time.Hour)
		w.endPauses()
		live := 0
		for _, row := range w.rows {
			if w.serves(row.typ) && w.live(row) {
				live++
			}
		}
		w.mu.Unlock()
		if live == 0 {
			break
		}
		for _, l := range r.lanes.all {
			l.mu.Lock()
			if l.state == laneProbing {
				l.probe = false
			}
			l.mu.Unlock()
		}
		pass(true)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, row := range w.t.rows {
		if w.serves(row.typ) && w.live(row) {
			require.Failf(t, "a row was never delivered", "seed %d: row %d (%s/%s, %s, %d attempts)", seed, row.id, row.typ, row.key, row.status, row.attempts)
			return false
		}
	}
	if len(w.broken) > 0 {
		t.Errorf("seed %d, while healing: %s\nlast events:\n%s", seed, w.broken[0], strings.Join(w.trail[max(0, len(w.trail)-150):], "\n"))
		return false
	}
	return true
}

// runWorld runs one pass of r's engine over w.
func runWorld(r *Runner, w *world, o Opts) Result {
	ctx := context.Background()
	e := r.newEngine(ctx, o, worldTable{w})
	e.rec = &recorder{r: r, ctx: ctx, res: &e.res, pipeline: outcomePipeline}
	e.rec.outcomeStrategy = worldOutcomes{rc: e.rec, w: w, group: w.group, mu: new(sync.Mutex), held: new([]delivery)}
	e.run()
	return e.res
}

// requeuedStatus is the status relayctl's re-queue gives a dead row: a
// failed row with 0 attempts, due at once (decision 0041).
const requeuedStatus = store.StatusError
