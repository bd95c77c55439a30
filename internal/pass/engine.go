package pass

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/xadm/relay/internal/lease"
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
// recorded: the keys it is done with, and the lanes of the messages that
// failed in it.
type taskDone struct {
	lane   int
	keys   []string
	failed []int
}

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
// task goes to the lane with the fewest in flight, and when a lane waits with
// none in flight, a worker hands back the rest of its task at its next key
// (preempt). A paused lane's tasks are dropped, and its type is left out of
// the selects; so, when the table has the key index, is a lane that saw a
// failure in this pass, and, while some lanes have work queued, a select from
// the start for the others (the hungry ones) comes at a wake-up or every
// Interval. A select that leaves types out holds a row back behind an earlier
// live row of its key of those types: a key's messages keep their order
// across types (sql/pass.sql, heldByOthers).
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

	// blocked are the keys whose earliest row this pass left behind: their
	// later rows wait behind it. again: the key was in flight, and a select
	// from the start of that row's lane will find the row; otherwise the row
	// is held back past this pass (its outcome could not be recorded, or its
	// lane cannot send now).
	blocked map[string]blockedRow
	claimed []*lane // lanes whose probe this pass claimed

	work     chan task
	idle     chan int // a worker is free, having finished a task of this lane (-1: none yet)
	done     chan taskDone
	back     chan task   // the rest of a task a worker handed back
	starving atomic.Bool // a lane waits for a worker with none in flight: the next to finish a key hands back its task's rest
	stop     chan struct{}
	stopped  sync.Once
	leaseOut sync.Once // the first to see the lease run out says so
	workers  sync.WaitGroup
}

// blockedRow is a key left behind (engine.blocked).
type blockedRow struct {
	again bool
	lane  int
}

// newEngine is a pass's engine on src, without its recorder.
func (r *Runner) newEngine(ctx context.Context, o Opts, src Outbox) *engine {
	return &engine{
		r: r, src: src, ctx: ctx, o: o,
		lanes:   r.lanes.all,
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
	c := newCursor(e.o.Drain, e.r.cfg.BatchSize)
	fl := newFlight(len(e.lanes))
	defer func() {
		for _, l := range e.claimed {
			l.releaseProbe() // a probe not sent: the next pass probes
		}
	}()
	// While some lanes have work queued, the others are selected for at a
	// wake-up, and every Interval for rows written without one.
	var tick <-chan time.Time
	if e.o.Separable && e.o.Drain {
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
		queued := fl.queued()
		if queued == 0 && c.more && !fl.waitDone && fl.tasks > 0 && e.src.Starved() {
			// Every connection is taken, by the election and the workers
			// holding theirs for their outcomes: select once one is back.
			fl.waitDone = true
		}
		if queued == 0 && c.more && !fl.waitDone && !e.selectBatch(&c, fl, start) {
			break
		}
		if hungry && queued > 0 && !e.halted() {
			hungry = false
			if !e.selectHungry(&c, fl) {
				break
			}
		}
		queued = fl.queued()
		if queued == 0 && fl.tasks == 0 {
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
		var woken <-chan struct{}
		if fl.tasks > 0 && !e.halted() && (!c.more || queued > 0 && e.o.Separable) {
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
				go e.worker()
			}
			if fl.idle > 0 {
				if t, ok := fl.next(e.lanes, e.r.cfg.Workers); ok {
					send, next = e.work, t
				}
			}
		}
		// Said before the hand-off, as it will be after it: the worker that
		// takes next then finds it at its first key, whoever runs first.
		e.starving.Store(fl.starving(e.r.cfg.Workers) || send != nil && fl.starvingAfter(next, e.r.cfg.Workers))
		select {
		case send <- next:
			fl.handed(next)
		case l := <-e.idle:
			fl.freed(l)
		case d := <-e.done:
			fl.finished(d)
			for _, l := range d.failed {
				// The lane's destination may be struggling: its failed rows
				// wait for the next pass, not the next batch.
				if !e.o.Separable {
					c.stop()
				}
				fl.lanes[l].stopped = true
			}
		case t := <-e.back:
			fl.requeue(t)
		case <-woken:
			e.res.Woken = true
			if queued == 0 {
				c.woken()
			} else {
				hungry = true
			}
		case <-tick:
			hungry = e.o.Separable
		}
	}
	e.starving.Store(false)
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

// selection is what a select asks for: the types of the lanes that can
// send now and have not failed in this pass (with hungry, only those with
// nothing queued), and the others, left out. Without separable lanes every
// type is selected while one can send (a paused lane's rows are then cut in
// plan). ok is false when no type can be selected.
func (e *engine) selection(fl *flight, hungry bool) (types, others []string, ok bool) {
	now := time.Now()
	for i, l := range e.lanes {
		can, _ := l.dispatchable(now)
		if can && !fl.lanes[i].stopped && (!hungry || len(fl.lanes[i].queue) == 0) {
			types = append(types, l.typ)
		} else {
			others = append(others, l.typ)
		}
	}
	switch {
	case len(types) == 0:
		return nil, nil, false
	case !e.o.Separable:
		return e.r.types, nil, !hungry
	}
	return types, others, true
}

// selectBatch selects the cursor's next batch and queues its tasks. It
// returns false when the pass must end: the select failed, or the server is
// read-only (the failure is kept).
func (e *engine) selectBatch(c *cursor, fl *flight, start time.Time) bool {
	types, others, ok := e.selection(fl, false)
	if !ok {
		c.stop() // every lane is paused or failed in this pass
		return true
	}
	from, rereads := c.next()
	if rereads && e.rec.flush() != nil {
		// Rows up to the last select were selected before: each is in flight
		// (its key is busy), or its outcome is recorded, once the group
		// waiting to be written is.
		return false
	}
	first := c.first
	f, err := e.src.Fetch(e.ctx, Query{Preflight: first, After: from, Parts: e.o.Parts, Types: types, Others: others})
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
	if from == math.MinInt64 {
		// A select from the start finds every row left behind, of the lanes
		// it selects; the others' rows hold their keys' later rows back.
		clear(e.blocked)
	}
	rows := c.take(f.Rows)
	skipped := e.plan(rows, fl, time.Now())
	c.selected(rows, f.Full, f.Cut, skipped)
	if c.more && time.Since(start) > cmp.Or(e.o.DrainFor, DrainMax) {
		c.stop()
		e.res.Backlog = true
	}
	fl.planned(c)
	return true
}

// selectHungry selects, from the start, for the lanes that have nothing
// queued while others have: rows written since their last batch would
// otherwise wait for the others' queues to drain. It leaves the cursor where
// it was. It returns false when the pass must end (the failure is kept).
func (e *engine) selectHungry(c *cursor, fl *flight) bool {
	types, others, ok := e.selection(fl, true)
	if !ok {
		return true
	}
	if e.rec.flush() != nil {
		return false
	}
	f, err := e.src.Fetch(e.ctx, Query{After: math.MinInt64, Parts: e.o.Parts, Types: types, Others: others})
	if err != nil {
		e.rec.keep(err)
		return false
	}
	selected := make([]bool, len(e.lanes))
	for _, typ := range types {
		selected[e.r.lanes.byType[typ].index] = true
	}
	for k, b := range e.blocked {
		if b.again && selected[b.lane] {
			delete(e.blocked, k) // this select finds the row again
		}
	}
	c.reread(f.Rows, e.plan(f.Rows, fl, time.Now()))
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
// left out (skipped reports it: the rows are selected again, from the start,
// once the key is idle), and so is a key with a failed row behind the cursor
// (the same), and a key whose row here is held back because its last outcome
// could not be recorded. Either way the key is blocked: its
// later rows, in this batch or the next ones selected past it, wait behind
// the row left out. A key's rows stop at its first row of a lane that cannot
// send now (paused, or probing with its probe taken), which blocks the key
// past this pass; a probing lane's probe is the first key that starts with
// one of its rows, alone.
func (e *engine) plan(rows []store.Row, fl *flight, now time.Time) (skipped bool) {
	index := make(map[string]int, len(rows))
	var groups []group
	for i := range rows {
		m := &rows[i]
		if b, ok := e.blocked[m.Key]; ok {
			skipped = skipped || b.again
			continue
		}
		m.Lane = e.r.lanes.byType[m.Type].index
		switch {
		case fl.busy[m.Key]:
			// Selected again once idle; its later rows wait behind this one.
			e.blocked[m.Key], skipped = blockedRow{again: true, lane: m.Lane}, true
			continue
		case e.r.held.waiting(m.ID, now):
			e.blocked[m.Key] = blockedRow{lane: m.Lane} // waits out its backoff; its later rows wait behind it
			continue
		case m.Behind:
			// Its key's failed row lies behind the cursor: a select from the
			// start finds both, in id order.
			e.blocked[m.Key], skipped = blockedRow{again: true, lane: m.Lane}, true
			continue
		}
		g, ok := index[m.Key]
		if !ok {
			g = len(groups)
			index[m.Key] = g
			groups = append(groups, nil)
		}
		groups[g] = append(groups[g], m)
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
	return skipped
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
		case ok && j == 0 && l.claimProbe():
			e.claimed = append(e.claimed, l)
			return g[:1]
		}
		e.blocked[g[0].Key] = blockedRow{lane: m.Lane}
		return g[:j]
	}
	return g
}

// deliverRounds delivers the keys of one [BatchSender]'s type: each round
// sends the next message of every key still going in one SendBatch call, and
// a key whose message failed goes no further in this pass. A round starts
// once the last one's outcomes are written. rest is what it hands back
// undelivered when another lane waits for a worker, or its own lane paused.
func (e *engine) deliverRounds(t task, w *writer) (failed bool, rest []group) {
	s := e.r.deps.Senders[t.groups[0][0].Type].(BatchSender)
	next := make([]int, len(t.groups)) // per key, the index of its next message
	for round := 0; ; round++ {
		if e.halted() {
			return failed, nil
		}
		if e.lanes[t.lane].paused() || round > 0 && e.preempt() {
			for k, g := range t.groups {
				if next[k] < len(g) {
					rest = append(rest, g[next[k]:])
				}
			}
			return failed, rest
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
			return failed, nil
		}
		ds := e.r.deliverMany(e.ctx, s, ms)
		recorded := ds[:0:0]
		more := false
		for i, d := range ds {
			if d.out == OutcomeInterrupted {
				e.halt()
				break
			}
			recorded = append(recorded, d)
			k := keys[i]
			if d.out == OutcomeSent {
				next[k]++
				more = more || next[k] < len(t.groups[k])
			} else {
				next[k] = len(t.groups[k]) // the rest of this key waits for a later pass
				failed = true
			}
		}
		if len(recorded) > 0 && w.record(recorded, more) != nil {
			return failed, nil
		}
	}
}

// preempt reports whether this worker is the one to hand back the rest of
// its task, for a lane that waits with no worker.
func (e *engine) preempt() bool {
	return e.starving.Load() && e.starving.CompareAndSwap(true, false)
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
		d.out = OutcomeSent
	case ctx.Err() != nil:
		// Our own cancellation (stop, lost election) cut the send short: its
		// outcome is unknown, so the row stays as read and a later pass re-sends it.
		r.deps.Logger.LogAttrs(ctx, slog.LevelDebug, "relay: send interrupted",
			slog.Int64("id", m.ID), slog.String("type", m.Type), slog.String("error", ErrorText(err, 0)))
		d.out = OutcomeInterrupted
		return d
	case permanentFailure(err):
		d.out, permanent = OutcomeDead, true
	case m.Attempts+1 >= r.cfg.MaxAttempts:
		d.out = OutcomeDead
	default:
		d.out = OutcomeFailed
	}
	l := r.lanes.all[m.Lane]
	l.observe(d.out, permanent, err) // the type's health (lanes.go)
	l.took(took)
	return d
}
