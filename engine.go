package relay

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"time"
)

// This file is the one dispatch engine. Run, RunIfElected and the loop's
// periodic pass all run it; they differ only in how many batches they take
// (Run and RunIfElected one, the loop's pass as many as come back full, for up
// to drainMax) and in whether a graceful stop can halt them.

// passOpts tune a pass. The zero value is Run's and RunIfElected's: one batch.
type passOpts struct {
	halt     <-chan struct{} // closed: start no new message or batch (graceful stop)
	drain    bool            // take batches while they come back full
	drainFor time.Duration   // how long at most; 0: drainMax
	parts    []int           // partitioned: deliver only these partitions (partitions.go)
	own      *ownSession     // the started relay's own session, for the idle poll; nil: the pool's
	// keep, for the loop's passes, says from the pass's result whether the
	// election is kept for the next pass (polledElection); nil: let go.
	keep func(passResult) bool
	// wake is the loop's wake-ups: one that comes while the pass waits for
	// its last messages has it select again at once, beside their outcomes'
	// writes, instead of after the pass. nil: none (Run, RunIfElected).
	wake <-chan struct{}
	// afterLoss says the loop's last pass lost its election: a lock found
	// taken now is most likely that election's own, whose session's backend
	// has not exited yet (or a server going down answered), so the pass
	// fails rather than coalesces (polledElection).
	afterLoss bool
}

// drainMax bounds how long one pass keeps draining a backlog before it lets go
// of the election; the loop then starts the next pass at once.
const drainMax = 10 * time.Second

// passResult is what a pass did.
type passResult struct {
	sent, failed, dead int
	lag                time.Duration
	outcomesWaiting    int  // the most outcomes that waited to be written at once (PassReport.OutcomesWaiting)
	backlog            bool // draining stopped at drainMax with rows left
	woken              bool // a wake-up came during the pass, and it selected again (passOpts.wake)
	ran                bool // the pass ran: elected, or direct
	err                error
}

func (p *passResult) processed() int { return p.sent + p.failed + p.dead }

// coalesced says another session held the election: the pass neither ran nor failed.
func (p *passResult) coalesced() bool { return !p.ran && p.err == nil }

// group is one natural key's messages of a batch, in id order.
type group []*row

// task is what a worker takes at a time: a run of keys, each delivered in
// turn, or, for a [BatchSender], the keys of one type that it delivers in
// rounds. Handing keys over a few at a time, not one by one, keeps the
// hand-offs between the engine and its workers off each message's path.
type task struct {
	groups []group
	rounds bool
}

// tasksPerWorker is how many tasks a batch's keys are cut into per worker:
// enough for a slow key not to leave the other workers idle, few enough that
// a hand-off serves many messages.
const tasksPerWorker = 4

// engine is one pass's dispatch: it selects batches outside any transaction,
// splits them by natural key, and hands the keys to at most Concurrency
// workers, started only when there is work for them. A key in flight is never
// handed out twice: its later messages, selected again, wait until a later
// batch finds it idle. The next batch is selected while the last messages of
// the current one are still in flight, once their outcomes are flushed, so a
// message sent in this pass is never selected as still pending.
//
// A batch stops being followed by another when it comes back short, after
// drainMax, on halt, when an outcome could not be recorded, or after a
// failure: the destination may be struggling, and a failed row waits for the
// next pass, not the next batch. Memory is bounded by BatchSize rows and
// BatchBytes of payload per batch, plus those in flight.
type engine struct {
	r   *Relay
	src fetcher
	ctx context.Context
	o   passOpts
	res passResult
	rec *recorder

	// blocked are the keys whose earliest row this pass left behind: their
	// later rows wait behind it. True: the key was in flight, and a select
	// from the start will find the row; false: the row is held back (its
	// outcome could not be recorded) past this pass.
	blocked map[string]bool

	work     chan task
	done     chan []string // the keys of a finished task
	failed   chan struct{} // a task saw a message fail: stop taking batches
	stop     chan struct{} // closed when the pass must start nothing new
	stopped  sync.Once
	leaseOut sync.Once // the first to see the lease run out says so
	workers  sync.WaitGroup
}

// fetcher is where an engine's batches come from: the table, through the
// Relay (relay.go), or an in-memory table in the engine's unit tests.
type fetcher interface {
	// fetch selects one batch of rows past after (with preflight, the
	// first of a pass), of the partitions parts (nil: all).
	fetch(ctx context.Context, preflight bool, after int64, parts []int) (fetched, error)
	// starved reports whether no connection is free for a select.
	starved() bool
}

// dispatch runs one pass's engine under whatever election the caller holds.
func (r *Relay) dispatch(ctx context.Context, o passOpts) passResult {
	if err := r.learnTable(ctx); err != nil {
		return passResult{err: err}
	}
	e := r.newEngine(ctx, o, r)
	e.rec = r.newRecorder(ctx, &e.res)
	e.run()
	e.res.outcomesWaiting = int(e.rec.waiting.peak.Load())
	return e.res
}

// newEngine is a pass's engine on src, without its recorder.
func (r *Relay) newEngine(ctx context.Context, o passOpts, src fetcher) *engine {
	return &engine{
		r: r, src: src, ctx: ctx, o: o,
		work:    make(chan task),
		blocked: make(map[string]bool),
		done:    make(chan []string, r.cfg.Concurrency),
		failed:  make(chan struct{}, 1),
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
	if err := leaseValid(e.ctx); err != nil {
		e.leaseOut.Do(func() {
			e.rec.keep(err)
			e.r.logger.LogAttrs(e.ctx, slog.LevelWarn, "relay: the election's lease ran out; starting no new message",
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
	case <-e.o.halt:
		return true
	default:
		return false
	}
}

func (e *engine) run() {
	start := time.Now()
	c := newCursor(e.o.drain, e.r.cfg.BatchSize)
	fl := flight{busy: make(map[string]bool)}
	for {
		select {
		case <-e.failed:
			c.stop() // the failed rows wait for the next pass
		default:
		}
		if e.halted() {
			c.stop()
			fl.queue = nil
		}
		if len(fl.queue) == 0 && c.more && !fl.waitDone && fl.tasks > 0 && e.src.starved() {
			// Every connection is taken, by the election and the workers
			// holding theirs for their outcomes: select once one is back.
			fl.waitDone = true
		}
		if len(fl.queue) == 0 && c.more && !fl.waitDone && !e.selectBatch(&c, &fl, start) {
			break
		}
		if len(fl.queue) == 0 && fl.tasks == 0 {
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
		if !c.more && fl.tasks > 0 && !e.halted() {
			woken = e.o.wake // a commit notified meanwhile: select again beside the writes
		}
		if len(fl.queue) > 0 {
			if fl.tasks == 0 && e.rec.ready(e.ctx) != nil {
				// Grouped outcomes are written on the recorder's connection:
				// it is held before anything is sent.
				fl.queue = nil
				continue
			}
			if fl.tasks == fl.workers && fl.workers < e.r.workers() {
				fl.workers++
				e.workers.Add(1)
				go e.worker()
			}
			send, next = e.work, fl.queue[0]
		}
		select {
		case send <- next:
			fl.handed(next)
		case keys := <-e.done:
			fl.finished(keys)
		case <-woken:
			c.woken()
			e.res.woken = true
		}
	}
	close(e.work)
	for ; fl.tasks > 0; fl.tasks-- {
		<-e.done
	}
	e.workers.Wait()
	err := e.rec.close()
	switch {
	case err != nil:
		e.res.err = err
	case e.ctx.Err() != nil:
		e.res.err = context.Cause(e.ctx)
	}
}

// selectBatch selects the cursor's next batch and queues its tasks. It
// returns false when the pass must end: the select failed, or the server is
// read-only (the failure is kept).
func (e *engine) selectBatch(c *cursor, fl *flight, start time.Time) bool {
	from, rereads := c.next()
	if rereads && e.rec.flush() != nil {
		// Rows up to the last select were selected before: each is in flight
		// (its key is busy), or its outcome is recorded, once the group
		// waiting to be written is.
		return false
	}
	first := c.first
	f, err := e.src.fetch(e.ctx, first, from, e.o.parts)
	if err != nil {
		e.rec.keep(err)
		return false
	}
	if first && f.readOnly {
		e.rec.keep(fmt.Errorf("%w: nothing is sent from it, since no outcome could be recorded", ErrReadOnly))
		return false
	}
	if first {
		e.res.lag = lagOf(f)
	}
	if from == math.MinInt64 {
		clear(e.blocked) // a select from the start finds every row left behind
	}
	rows := c.take(f.rows)
	queue, skipped := e.r.plan(rows, fl.busy, e.blocked, time.Now())
	c.selected(rows, f.full, f.cut, skipped)
	if c.more && time.Since(start) > cmp.Or(e.o.drainFor, drainMax) {
		c.stop()
		e.res.backlog = true
	}
	fl.planned(queue, c)
	return true
}

// workers is how many workers a pass runs at most: Concurrency, unless the
// pool is too small to give each its connection next to the election's and
// the select's (New warns of it).
func (r *Relay) workers() int {
	return min(r.cfg.Concurrency, max(1, r.maxConns-2))
}

// starved reports whether the pool has no idle connection and may open no more.
func (r *Relay) starved() bool {
	st := r.pool.Stat()
	return st.IdleConns() == 0 && st.TotalConns() >= st.MaxConns()
}

// lagOf is how long the oldest row of the first batch has waited, on the
// database's clock (the producers' now() filled created_at).
func lagOf(f fetched) time.Duration {
	for _, m := range f.rows {
		if !m.CreatedAt.IsZero() {
			return max(f.now.Sub(m.CreatedAt), 0)
		}
	}
	return 0
}

// plan splits a batch, in id order, into tasks: runs of keys, in the order of
// each key's first id, except that the keys of a [BatchSender]'s type go
// together in one task. A key in flight is left out (skipped reports it: the
// rows are selected again, from the start, once the key is idle), and so is
// a key with a failed row behind the cursor (the same), and a key whose row
// here is held back because its last outcome could not be recorded. Either
// way the key is blocked: its later rows, in this batch or the next ones
// selected past it, wait behind the row left out.
func (r *Relay) plan(rows []row, busy map[string]bool, blocked map[string]bool, now time.Time) (tasks []task, skipped bool) {
	index := make(map[string]int, len(rows))
	var groups []group
	for i := range rows {
		m := &rows[i]
		if again, ok := blocked[m.Key]; ok {
			skipped = skipped || again
			continue
		}
		switch {
		case busy[m.Key]:
			blocked[m.Key], skipped = true, true // selected again once idle; its later rows wait behind this one
			continue
		case r.held.waiting(m.ID, now):
			blocked[m.Key] = false // waits out its backoff; its later rows wait behind it
			continue
		case m.behind:
			blocked[m.Key], skipped = true, true // its key's failed row lies behind the cursor: a select from the start finds both
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
	batched := make(map[string]int) // type → index of its task
	var single []group
	for _, g := range groups {
		typ := g[0].Type
		if _, ok := r.senders[typ].(BatchSender); ok && g[0].bad == "" {
			if t, ok := batched[typ]; ok {
				tasks[t].groups = append(tasks[t].groups, g)
				continue
			}
			batched[typ] = len(tasks)
			tasks = append(tasks, task{groups: []group{g}, rounds: true})
			continue
		}
		single = append(single, g)
	}
	size := max(1, (len(single)+r.workers()*tasksPerWorker-1)/(r.workers()*tasksPerWorker))
	for len(single) > 0 {
		n := min(size, len(single))
		tasks = append(tasks, task{groups: single[:n:n]})
		single = single[n:]
	}
	return tasks, skipped
}

// deliverRounds delivers the keys of one [BatchSender]'s type: each round
// sends the next message of every key still going in one SendBatch call, and
// a key whose message failed goes no further in this pass. A round starts
// once the last one's outcomes are written.
func (e *engine) deliverRounds(t []group, w *writer) (failed bool) {
	s := e.r.senders[t[0][0].Type].(BatchSender)
	next := make([]int, len(t)) // per key, the index of its next message
	for {
		if e.halted() {
			return failed
		}
		var round []*row
		var keys []int
		for k, g := range t {
			if next[k] < len(g) {
				round = append(round, g[next[k]])
				keys = append(keys, k)
			}
		}
		if len(round) == 0 {
			return failed
		}
		ds := e.r.deliverMany(e.ctx, s, round)
		recorded := ds[:0:0]
		more := false
		for i, d := range ds {
			if d.out == outcomeInterrupted {
				e.halt()
				break
			}
			recorded = append(recorded, d)
			k := keys[i]
			if d.out == outcomeSent {
				next[k]++
				more = more || next[k] < len(t[k])
			} else {
				next[k] = len(t[k]) // the rest of this key waits for a later pass
				failed = true
			}
		}
		if len(recorded) > 0 && w.record(recorded, more) != nil {
			return failed
		}
	}
}

// deliverMany sends ms through one SendBatch call.
func (r *Relay) deliverMany(ctx context.Context, s BatchSender, ms []*row) []delivery {
	msgs := make([]Message, len(ms))
	for i, m := range ms {
		msgs[i] = m.Message
	}
	start := time.Now()
	errs := r.sendBatch(ctx, s, msgs)
	took := time.Since(start)
	ds := make([]delivery, len(ms))
	for i, m := range ms {
		ds[i] = r.outcomeOf(ctx, m, errs[i], took)
	}
	return ds
}

// outcomeOf classifies a send's error.
func (r *Relay) outcomeOf(ctx context.Context, m *row, err error, took time.Duration) delivery {
	m.Payload = nil // sent: a batch's payloads are held until their sends return, not until their outcomes are written
	d := delivery{m: m, sendErr: err, took: took}
	switch {
	case err == nil:
		d.out = outcomeSent
	case ctx.Err() != nil:
		// Our own cancellation (stop, lost election) cut the send short: its
		// outcome is unknown, so the row stays as read and a later pass re-sends it.
		r.logger.LogAttrs(ctx, slog.LevelDebug, "relay: send interrupted",
			slog.Int64("id", m.ID), slog.String("type", m.Type), slog.String("error", errorText(err, 0)))
		d.out = outcomeInterrupted
	case permanentFailure(err) || m.Attempts+1 >= r.cfg.MaxAttempts:
		d.out = outcomeDead
	default:
		d.out = outcomeFailed
	}
	return d
}
