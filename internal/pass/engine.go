package pass

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/xadm/relay/internal/lease"
	"github.com/xadm/relay/internal/relaytype"
	"github.com/xadm/relay/internal/store"
)

// This file is the one dispatch engine. Run, RunIfElected and the loop's
// periodic pass all run it; they differ only in how many batches they take
// (Run and RunIfElected one, the loop's pass as many as come back full, for up
// to DrainMax) and in whether a graceful stop can halt them.

// group is one natural key's messages of a batch, in id order.
type group []*store.Row

// task is what a worker takes at a time: a run of keys of one lane, each
// delivered in turn, or, for a [BatchSender], the keys of its type that it
// delivers in rounds. Handing keys over a few at a time, not one by one, keeps
// the hand-offs between the engine and its workers off each message's path.
type task struct {
	groups []group
	rounds bool
	lane   int   // the lane of its keys' first rows (lanes.go)
	first  int64 // its first row's id: of lanes alike, the older task goes first
}

// taskDone is what a worker says of a task once the outcomes of its keys are
// recorded: the keys it is done with, the lanes of the messages that failed
// in it, and, of each key it stopped at a message that was not sent (a
// failure, a death), that message: the key's rows from it on wait for a
// later pass, which selects them again.
type taskDone struct {
	lane       int
	keys       []string
	failed     []int
	stopped    []*store.Row
	handedBack bool // the rest of the task went back to the engine (engine.back)
}

// share is which lanes count as slow now, and how many workers they may hold
// together (decision 0040). A lane is slow when its last Send took slowSend
// or more, a Send of it has run that long already, or it is paused or
// probing. While some lanes are not slow, of W ≥ 2 workers they keep at least
// one, and one per such lane with work (tasks queued or in flight, or a Send
// delivered within recentWork) up to half of them; the slow lanes may hold
// the rest. With one worker, lanes take turns.
func (e *engine) share(fl *flight, now time.Time) (slow []bool, slowCap int) {
	w := e.r.cfg.Workers
	slow = e.slowBuf[:0]
	for _, l := range e.lanes {
		slow = append(slow, l.slow.Load() || laneState(l.st.Load()) != laneOpen)
	}
	e.slowBuf = slow
	for _, k := range e.ws {
		if l := k.lane.Load(); l >= 0 && k.turn.Load()&1 == 1 && k.sending() >= slowSend {
			slow[l] = true
		}
	}
	healthy, busy := 0, 0
	for i, l := range e.lanes {
		if slow[i] {
			continue
		}
		healthy++
		q := &fl.lanes[i]
		if len(q.queue) > 0 || q.inFlight > 0 || now.UnixNano()-l.lastSent.Load() < int64(recentWork) {
			busy++
		}
	}
	if w < 2 || healthy == 0 {
		return slow, w
	}
	return slow, w - min(max(busy, 1), (w+1)/2)
}

// recentWork is how long after its last delivered Send a lane counts as
// having work, for its share of the workers (share).
const recentWork = 10 * time.Second

// closed is a channel that is always ready.
var closed = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// tasksPerWorker is how many tasks a batch's keys are cut into per worker:
// enough for a slow key not to leave the other workers idle, few enough that
// a hand-off serves many messages.
const tasksPerWorker = 4

// engine is one pass's dispatch: it selects batches outside any transaction,
// splits them by natural key and by lane (each message type is one: lanes.go),
// and hands the keys to at most Concurrency workers, started only when there
// is work for them. A key queued or in flight is never handed out twice: its
// later messages, selected again, wait until a later batch finds it idle. The
// next batch is selected while the last messages of the current one are still
// in flight, once their outcomes are flushed, so a message sent in this pass
// is never selected as still pending.
//
// The workers are shared fairly between the lanes that have work: the next
// task goes to the lane with the fewest in flight, slow lanes keep to their
// share (share), and when a lane waits with none in flight, or slow lanes
// hold more than their share while another has work queued, a worker hands
// back the rest of its task at its next key (preempt). A paused lane's tasks
// are dropped, and its type is left out of the selects; so, when the table
// has the key index, is a lane that saw a failure in this pass, and, while
// some lanes have work queued, a select past their cursors for the others
// (the hungry ones) comes at a wake-up or every Interval. Whatever a select
// leaves out, a row is held back while an older live row of its key is
// missing from the batch (sql/pass.sql, held; decision 0041).
//
// A batch stops being followed by another when it comes back short, after
// drainMax, on halt, or when an outcome could not be recorded. Memory is
// bounded by BatchSize rows and BatchBytes of payload per batch, plus those in
// flight.
type engine struct {
	r   *Runner
	src Outbox
	ctx context.Context
	o   Opts
	res Result
	rec *recorder

	lanes []*lane // the relay's, by index

	// blocked are the keys whose earliest row this epoch left behind: their
	// later rows wait behind it. again: the next epoch finds the row (its key
	// was in flight, or the select held it behind an older row it lacked);
	// otherwise the row is held back past this pass (its outcome could not be
	// recorded, its lane cannot send now, or it waits behind a row that waits
	// out its backoff).
	blocked map[string]blockedRow
	claimed []*lane // lanes whose probe this pass claimed

	ws       []*worker // the workers started, for their running Sends (share)
	slowBuf  []bool
	work     chan task
	idle     chan int // a worker is free, having finished a task of this lane (-1: none yet)
	done     chan taskDone
	back     chan task     // the rest of a task a worker handed back
	starving atomic.Bool   // a lane waits for a worker with none in flight: the next to finish a key hands back its task's rest
	slowNow  []atomic.Bool // by lane, it counts as slow now (overShare)
	excess   atomic.Int32  // how many workers of slow lanes are to hand back their task's rest (overShare)
	stop     chan struct{}
	stopped  sync.Once
	leaseOut sync.Once // the first to see the lease run out says so
	workers  sync.WaitGroup
}

// blockedRow is a key left behind (engine.blocked): its rows from id from
// on wait; an older row of it, selected later (of another lane, whose window
// had not reached it), may still go.
type blockedRow struct {
	from  int64
	again bool
	held  bool // the select held its row behind an older one it lacked: the next epoch's select takes both
}

// block leaves m's key behind from m on (engine.blocked).
func (e *engine) block(m *store.Row, again, held bool) {
	b, ok := e.blocked[m.Key]
	if !ok || m.ID < b.from {
		b.from = m.ID
	}
	b.again, b.held = b.again || again, b.held || held
	e.blocked[m.Key] = b
}

// newEngine is a pass's engine on src, without its recorder.
func (r *Runner) newEngine(ctx context.Context, o Opts, src Outbox) *engine {
	return &engine{
		r: r, src: src, ctx: ctx, o: o,
		lanes:   r.lanes.all,
		slowNow: make([]atomic.Bool, len(r.lanes.all)),
		work:    make(chan task),
		idle:    make(chan int, r.cfg.Workers),
		blocked: make(map[string]blockedRow),
		done:    make(chan taskDone, r.cfg.Workers),
		back:    make(chan task, r.cfg.Workers),
		stop:    make(chan struct{}),
	}
}

func (e *engine) halt() { e.stopped.Do(func() { close(e.stop) }) }

// halted reports whether the pass must start nothing new: its context ended,
// a graceful stop, a recording failure, or an election lease that ran out.
func (e *engine) halted() bool {
	if e.ctx.Err() != nil {
		return true
	}
	// The lease is looked at before the recorder's failure: a replica that
	// wakes from a freeze finds both, and says that its lease ran out.
	if err := lease.Valid(e.ctx); err != nil {
		e.leaseOut.Do(func() {
			e.rec.keep(err)
			e.r.deps.Logger.LogAttrs(e.ctx, slog.LevelWarn, "relay: the election's lease ran out; starting no new message",
				slog.String("error", err.Error()))
		})
		return true
	}
	if e.rec.errorOf() != nil {
		return true
	}
	select {
	case <-e.stop:
		return true
	case <-e.o.Halt:
		return true
	default:
		return false
	}
}

func (e *engine) run() {
	start := time.Now()
	c := newCursor(e.o.Drain, e.r.cfg.BatchSize, len(e.lanes))
	fl := newFlight(len(e.lanes))
	defer func() {
		for _, l := range e.claimed {
			l.releaseProbe() // a probe not sent: the next pass probes
		}
		for _, l := range e.lanes {
			l.passEnded()
		}
	}()
	// While some lanes have work queued, the others are selected for at a
	// wake-up, and every Interval for rows written without one.
	var tick <-chan time.Time
	if e.separable() && e.o.Drain {
		t := time.NewTicker(e.r.cfg.Interval)
		defer t.Stop()
		tick = t.C
	}
	hungry := false // a select for the hungry lanes is due
	for {
		if e.halted() {
			c.stop()
			fl.dropAll()
		}
		fl.dropPaused(e)
		if fl.waitDone && fl.inFlight() == 0 {
			fl.waitDone = false // no done to wait for: the keys it waited on were dropped
		}
		queued := fl.queued()
		if queued == 0 && c.more && !fl.waitDone && fl.inFlight() > 0 && e.src.Starved() {
			// Every connection is taken, by the election and the workers
			// holding theirs for their outcomes: select once one is back.
			fl.waitDone = true
		}
		if queued == 0 && c.more && !fl.waitDone && !e.selectBatch(&c, fl, start, false) {
			break
		}
		if hungry && !e.halted() && (queued == 0 || e.separable()) {
			hungry = false
			if !e.selectBatch(&c, fl, start, true) {
				break
			}
		}
		queued = fl.queued()
		if queued == 0 && fl.inFlight() == 0 {
			if c.more {
				// Nothing to send from this batch (its keys were left behind
				// or wait out a backoff) and nothing in flight to wait for:
				// select the next one at once. (waitDone is false here: it is
				// only set while something is in flight, and a done clears it.)
				continue
			}
			break
		}
		var send chan task
		var next task
		var woken, due <-chan struct{}
		var recheck <-chan time.Time
		if queued == 0 && c.more && !fl.waitDone {
			// Nothing to send from the last select (its keys in flight, held
			// or waiting out a backoff), and the next is due at once: after
			// whatever the workers have said meanwhile.
			due = closed
		}
		if fl.inFlight() > 0 && !e.halted() && due == nil && (e.separable() || !c.more) {
			woken = e.o.Wake // a commit notified meanwhile: select again beside the writes
		}
		if queued > 0 {
			if fl.tasks == 0 && e.rec.ready(e.ctx) != nil {
				// Grouped outcomes are written on the recorder's connection:
				// it is held before anything is sent.
				fl.dropAll()
				continue
			}
			if fl.idle == 0 && fl.workers < e.r.cfg.Workers && !fl.starting {
				fl.workers++
				fl.starting = true
				e.workers.Add(1)
				k := e.newWorker()
				e.ws = append(e.ws, k)
				go k.start()
			}
			if fl.idle > 0 {
				slow, slowCap := e.share(fl, time.Now())
				if t, ok := fl.next(slow, slowCap); ok {
					send, next = e.work, t
				} else {
					// The slow lanes hold their share of the workers: look
					// again once a Send may have crossed slowSend, or the
					// healthy lanes' work gone quiet.
					recheck = time.After(slowSend)
				}
			}
		}
		// Said before the hand-off, as it will be after it: the worker that
		// takes next then finds it at its first key, whoever runs first.
		e.starving.Store(fl.starving(e.r.cfg.Workers) || send != nil && fl.starvingAfter(next, e.r.cfg.Workers))
		e.overShare(fl)
		select {
		case send <- next:
			fl.handed(next)
		case l := <-e.idle:
			fl.freed(l)
		case d := <-e.done:
			fl.finished(d)
			for _, m := range d.stopped {
				e.block(m, false, false)
			}
			for _, l := range d.failed {
				// The lane's destination may be struggling: its failed rows
				// wait for the next pass, not the next batch.
				if !e.separable() {
					c.stop()
				}
				fl.lanes[l].stopped = true
				c.drop(l)
			}
		case t := <-e.back:
			fl.requeue(t)
		case <-woken:
			e.res.Woken = true
			if e.separable() {
				hungry = true
			} else {
				c.woken()
			}
		case <-tick:
			hungry = e.separable()
		case <-due:
		case <-recheck:
		}
	}
	e.starving.Store(false)
	e.excess.Store(0)
	close(e.work)
	for ; fl.tasks > 0; fl.tasks-- {
		<-e.done
	}
	e.workers.Wait() // e.idle has room for each worker's last word
	for len(e.back) > 0 {
		<-e.back
	}
	err := e.rec.close()
	switch {
	case err != nil:
		e.res.Err = err
	case e.ctx.Err() != nil:
		e.res.Err = context.Cause(e.ctx)
	}
}

// separable reports whether the pass's selects may leave lanes out: the
// table has the key index, which keeps each key's order across the types a
// select leaves out (sql/pass.sql, held), and the relay has several types.
func (e *engine) separable() bool { return e.o.Keyed && len(e.lanes) > 1 }

// selection is which lanes a select takes rows of: those that can send now
// and have not failed in this pass (with hungry, only those with nothing
// queued), a probing lane one row only; and later, the types that cannot
// send in this pass. Lanes it leaves out that could not send lose their
// place in the drain (cursor.drop). Without separable lanes every lane is
// selected while one can send (a paused lane's rows are then cut in plan).
// ok is false when no lane can be selected.
func (e *engine) selection(c *cursor, fl *flight, hungry bool) (lanes []int, types []string, width []int32, later []string, ok bool) {
	now := time.Now()
	full := int32(e.r.cfg.BatchSize)
	any := false
	for i, l := range e.lanes {
		can, probe := l.dispatchable(now)
		can = can && !fl.lanes[i].stopped
		any = any || can
		if !can {
			later = append(later, l.typ)
			c.drop(i)
		}
		switch {
		case !e.separable():
			lanes, types, width = append(lanes, i), append(types, l.typ), append(width, full)
		case can && (!hungry || len(fl.lanes[i].queue) == 0):
			w := full
			if probe {
				w = 1 // the probe's candidate: the lane's next rows wait for its answer
			}
			lanes, types, width = append(lanes, i), append(types, l.typ), append(width, w)
		}
	}
	if !any || len(lanes) == 0 || hungry && !e.separable() {
		return nil, nil, nil, nil, false
	}
	return lanes, types, width, later, true
}

// selectBatch selects the next windows of the lanes that can send and
// queues their tasks. With hungry (a wake-up, or every Interval while some
// lanes have work queued) it selects, past their cursors, for the lanes with
// nothing queued, and never starts an epoch: rows written since their last
// select would otherwise wait for the others' queues to drain, or for a key
// in flight to be done. It returns false when the pass
// must end: the select failed, or the server is read-only (the failure is
// kept).
func (e *engine) selectBatch(c *cursor, fl *flight, start time.Time, hungry bool) bool {
	lanes, types, width, later, ok := e.selection(c, fl, hungry)
	if !ok {
		if !hungry {
			c.stop() // every lane is paused or failed in this pass
		}
		return true
	}
	if !hungry && c.fromStart && !c.first && !fl.moved && fl.inFlight() == 0 {
		// Nothing was sent or done since the last epoch began, and nothing
		// is in flight: the next would find the same rows (held behind rows
		// a type's window did not reach, a probe's key passed over), until
		// time or new rows change them. The next pass sees to it.
		c.stop()
		return true
	}
	after, epoch, rereads := c.next(lanes, !hungry)
	if epoch {
		fl.moved = false
	}
	if rereads && e.rec.flush() != nil {
		// The select goes over ids selected before: each is in flight (its
		// key is busy), or its outcome is recorded, once the group waiting
		// to be written is.
		return false
	}
	first := c.first
	f, err := e.src.Fetch(e.ctx, Query{Preflight: first, StartEpoch: epoch, Epoch: c.epoch, Parts: e.o.Parts,
		Types: types, After: after, Width: width, All: e.r.types, Later: later, Keyed: e.o.Keyed})
	if err != nil {
		e.rec.keep(err)
		return false
	}
	if first && f.ReadOnly {
		e.rec.keep(fmt.Errorf("%w: nothing is sent from it, since no outcome could be recorded", store.ErrReadOnly))
		return false
	}
	if first {
		e.res.Lag = lagOf(f)
	}
	if epoch {
		// An epoch's selects find every row left behind in the last.
		clear(e.blocked)
	}
	rows := c.take(f.Rows)
	for i := range rows {
		rows[i].Lane = e.r.lanes.byType[rows[i].Type].index
	}
	skipped, held := e.plan(rows, fl, time.Now())

	c.selected(lanes, f, rows, epoch, skipped, func(typ string) int { return e.r.lanes.byType[typ].index })
	if c.more && time.Since(start) > cmp.Or(e.o.DrainFor, DrainMax) {
		c.stop()
		e.res.Backlog = true
	}
	fl.planned(c, held, epoch)
	return true
}

// lagOf is how long the oldest row of the first batch has waited, on the
// database's clock (the producers' now() filled created_at).
func lagOf(f store.Batch) time.Duration {
	for _, m := range f.Rows {
		if !m.CreatedAt.IsZero() {
			return max(f.Now.Sub(m.CreatedAt), 0)
		}
	}
	return 0
}

// plan splits a batch, in id order, into tasks, queued by lane: runs of keys,
// in the order of each key's first id, except that the keys of a
// [BatchSender]'s type go together in one task. A key queued or in flight is
// left out (skipped reports it: the rows are selected again by the next
// epoch, once the key is idle), and so is a key whose row the select held
// (held reports it)
// behind an older live row of its key that the batch lacks (store.Held: the
// next epoch, or past this pass), and a key whose row here is held back
// because its last outcome could not be recorded. Either way the key is
// blocked for the rest of the epoch: its later rows, in this batch or the
// next ones selected past it, wait behind the row left out. A key's rows
// stop at its first row of a lane that cannot send now (paused, or probing
// with its probe taken), which blocks the key past this pass; a probing
// lane's probe is the first key that starts with one of its rows, alone,
// unless its last probe failed on that key and another may answer.
func (e *engine) plan(rows []store.Row, fl *flight, now time.Time) (skipped, held bool) {
	type taken struct {
		m     *store.Row
		group int
	}
	index := make(map[string]int, len(rows)) // a key's group
	var counts []int                         // a group's rows
	ts := make([]taken, 0, len(rows))
	for i := range rows {
		m := &rows[i]
		if b, ok := e.blocked[m.Key]; ok && m.ID >= b.from {
			skipped, held = skipped || b.again, held || b.held
			continue
		}
		switch {
		case fl.busy[m.Key]:
			// Selected again once idle; its later rows wait behind this one.
			e.block(m, true, false)
			skipped = true
			continue
		case e.r.held.waiting(m.ID, now):
			e.block(m, false, false) // waits out its backoff; its later rows wait behind it
			continue
		case e.r.lanes.stuck.holds(m.Key):
			e.block(m, false, false) // a Send of its key was given up and still runs (stuck.go)
			continue
		case m.Held != store.NotHeld:
			// An older live row of its key is missing from the batch.
			again := m.Held == store.HeldAgain
			e.block(m, again, again)
			skipped, held = skipped || again, held || again
			continue
		}
		g, ok := index[m.Key]
		if !ok {
			g = len(counts)
			index[m.Key] = g
			counts = append(counts, 0)
		}
		counts[g]++
		ts = append(ts, taken{m, g})
	}
	// The groups share one array, each its part of it, in id order: one
	// allocation per batch rather than one per key.
	groups, all := make([]group, len(counts)), make([]*store.Row, len(ts))
	off := 0
	for g, n := range counts {
		groups[g] = all[off : off : off+n]
		off += n
	}
	for _, t := range ts {
		groups[t.group] = append(groups[t.group], t.m)
	}
	batched := make(map[*lane]int) // a BatchSender's lane → its task in tasks
	var tasks []task
	singles := make([][]group, len(e.lanes))
	for _, g := range groups {
		if g = e.sendable(g, now); len(g) == 0 {
			continue
		}
		l := e.lanes[g[0].Lane]
		if _, ok := e.r.deps.Senders[l.typ].(BatchSender); ok && g[0].Bad == "" {
			if t, ok := batched[l]; ok {
				tasks[t].groups = append(tasks[t].groups, g)
				continue
			}
			batched[l] = len(tasks)
			tasks = append(tasks, task{groups: []group{g}, rounds: true, lane: l.index, first: g[0].ID})
			continue
		}
		singles[l.index] = append(singles[l.index], g)
	}
	for lane, single := range singles {
		size := max(1, (len(single)+e.r.cfg.Workers*tasksPerWorker-1)/(e.r.cfg.Workers*tasksPerWorker))
		for len(single) > 0 {
			n := min(size, len(single))
			tasks = append(tasks, task{groups: single[:n:n], lane: lane, first: single[0][0].ID})
			single = single[n:]
		}
	}
	for _, t := range tasks {
		fl.queue(t)
	}
	return skipped, held
}

// sendable is the part of a key's rows that can be sent now: up to its first
// row of a lane that cannot (the key is then blocked past this pass), or a
// probing lane's probe alone.
func (e *engine) sendable(g group, now time.Time) group {
	for j, m := range g {
		l := e.lanes[m.Lane]
		ok, probe := l.dispatchable(now)
		switch {
		case ok && !probe:
			continue
		case ok && j == 0 && l.claimProbe(m.Key):
			e.claimed = append(e.claimed, l)
			if len(g) > 1 {
				e.block(g[1], false, false) // the key's next rows wait for the probe's answer, past this pass
			}
			return g[:1]
		}
		e.block(m, false, false)
		return g[:j]
	}
	return g
}

// deliverRounds delivers the keys of one [BatchSender]'s type: each round
// sends the next message of every key still going in one SendBatch call, and
// a key whose message failed goes no further in this pass. A round starts
// once the last one's outcomes are written. rest is what it hands back
// undelivered when another lane waits for a worker, or its own lane paused.
func (e *engine) deliverRounds(t task, w *writer) (failed bool, stopped []*store.Row, rest []group) {
	s := e.r.deps.Senders[t.groups[0][0].Type].(BatchSender)
	next := make([]int, len(t.groups)) // per key, the index of its next message
	for round := 0; ; round++ {
		if e.halted() {
			return failed, stopped, nil
		}
		if e.lanes[t.lane].paused() || round > 0 && e.preempt(t.lane) {
			for k, g := range t.groups {
				if next[k] < len(g) {
					rest = append(rest, g[next[k]:])
				}
			}
			return failed, stopped, rest
		}
		var ms []*store.Row
		var keys []int
		for k, g := range t.groups {
			if next[k] < len(g) {
				ms = append(ms, g[next[k]])
				keys = append(keys, k)
			}
		}
		if len(ms) == 0 {
			return failed, stopped, nil
		}
		ds := e.r.deliverMany(e.ctx, s, ms)
		recorded := ds[:0:0]
		more := false
		for i, d := range ds {
			if d.out == relaytype.OutcomeInterrupted {
				e.halt()
				break
			}
			recorded = append(recorded, d)
			k := keys[i]
			if d.out == relaytype.OutcomeSent {
				next[k]++
				more = more || next[k] < len(t.groups[k])
			} else {
				next[k] = len(t.groups[k]) // the rest of this key waits for a later pass
				failed, stopped = true, append(stopped, d.m)
			}
		}
		if len(recorded) > 0 && w.record(recorded, more) != nil {
			return failed, stopped, nil
		}
	}
}

// preempt reports whether this worker, at a key of lane, is one to hand
// back the rest of its task: for a lane that waits with no worker, or, when
// lane is slow, because the slow lanes hold more than their share of the
// workers while another lane has work queued (overShare).
func (e *engine) preempt(lane int) bool {
	if e.starving.Load() && e.starving.CompareAndSwap(true, false) {
		return true
	}
	if !e.slowNow[lane].Load() {
		return false
	}
	for n := e.excess.Load(); n > 0; n = e.excess.Load() {
		if e.excess.CompareAndSwap(n, n-1) {
			return true
		}
	}
	return false
}

// overShare says, for preempt, which lanes are slow now, and by how many
// workers the slow lanes exceed their share (engine.share) while a lane that
// is not slow has tasks queued: that many of their workers hand back the rest
// of their task at their next key, instead of going on with a slow lane's
// next Send (a Send that was fast when it was handed out may hang since).
func (e *engine) overShare(fl *flight) {
	slow, slowCap := e.share(fl, time.Now())
	waiting, held := false, 0
	for i := range fl.lanes {
		e.slowNow[i].Store(slow[i])
		switch {
		case slow[i]:
			held += fl.lanes[i].inFlight
		case len(fl.lanes[i].queue) > 0:
			waiting = true
		}
	}
	excess := int32(0)
	if waiting {
		excess = int32(max(held-slowCap, 0))
	}
	e.excess.Store(excess)
}

// deliverMany sends ms through one SendBatch call.
func (r *Runner) deliverMany(ctx context.Context, s BatchSender, ms []*store.Row) []delivery {
	rows := make([]store.Row, len(ms)) // the Sender's copies: an abandoned call may read them on
	for i, m := range ms {
		rows[i] = *m
	}
	start := time.Now()
	errs := r.sendBatch(ctx, s, rows)
	took := time.Since(start)
	ds := make([]delivery, len(ms))
	for i, m := range ms {
		ds[i] = r.outcomeOf(ctx, m, errs[i], took)
	}
	return ds
}

// outcomeOf classifies a send's error.
func (r *Runner) outcomeOf(ctx context.Context, m *store.Row, err error, took time.Duration) delivery {
	m.Payload = nil // sent: a batch's payloads are held until their sends return, not until their outcomes are written
	d := delivery{m: m, sendErr: err, took: took}
	permanent := false
	switch {
	case err == nil:
		d.out = relaytype.OutcomeSent
	case ctx.Err() != nil:
		// Our own cancellation (stop, lost election) cut the send short: its
		// outcome is unknown, so the row stays as read and a later pass re-sends it.
		r.deps.Logger.LogAttrs(ctx, slog.LevelDebug, "relay: send interrupted",
			slog.Int64("id", m.ID), slog.String("type", m.Type), slog.String("error", ErrorText(err, 0)))
		d.out = relaytype.OutcomeInterrupted
		return d
	case permanentFailure(err):
		d.out, permanent = relaytype.OutcomeDead, true
	case m.Attempts+1 >= r.cfg.MaxAttempts:
		d.out = relaytype.OutcomeDead
	default:
		d.out = relaytype.OutcomeError
	}
	l := r.lanes.all[m.Lane]
	l.observe(d.out, permanent, err, m.Key, took, r.cfg.SendTimeout/2) // the type's health (lanes.go)
	l.took(took)
	return d
}
