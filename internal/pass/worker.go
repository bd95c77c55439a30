package pass

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/xadm/relay/internal/relaytype"
	"github.com/xadm/relay/internal/store"
)

// A pass's worker takes tasks from its engine (engine.go) and delivers their
// keys one message at a time, calling each Sender on its own goroutine: no
// hand-off to another goroutine and back on a message's path.
//
// Each Send's context is a child of the pass's without a timer of its own
// (sendContext, send.go): the worker's one timer, set again for each Send,
// ends it SendTimeout after the Send started. A Send that is still running
// sendGrace after its context ended (it ignores its context) is given up:
// the log says so, the message fails with its context's cause, and another
// goroutine takes the worker's place from there, with its tasks and its
// writer. The goroutine left in the Send finds, when
// the Send returns at last, that its turn was taken, and leaves without
// touching anything. A Send that ends its goroutine (runtime.Goexit, as
// t.FailNow does) is handed over the same way, at once.
type worker struct {
	e *engine
	w *writer // its outcomes' writer, held from before its first send

	// turn is the running Send's number (odd) while it runs, the next even
	// one after it returned, and 0 once the Send was given up: only the
	// goroutine that holds the turn goes on.
	turn atomic.Uint64
	sent uint64 // Sends started, by the goroutines that held the turn in turn
	at   place  // where the worker is, for the goroutine that takes its place

	born    time.Time    // when the worker started: since counts from it, on the monotonic clock
	since   atomic.Int64 // when the running Send started, past born
	lane    atomic.Int32 // the lane of the running Send, -1 when none runs (engine.share)
	overdue *time.Timer  // fires at the running Send's SendTimeout (watch)
	unwatch func()

	mu      sync.Mutex
	running running // the running Send's turn and its context's cancel, for overdue
}

// running is the Send the worker's timer ends when it is overdue.
type running struct {
	turn   uint64
	cancel context.CancelCauseFunc
}

// place is where a worker is in its task, set before each Send.
type place struct {
	t       task
	g       int          // the group of t being delivered
	failed  []int        // the lanes of the messages of t's groups before g that failed
	stopped []*store.Row // the messages t's keys before g stopped at
	m       *store.Row
	ctx     context.Context // the Send's
}

// errSenderExited is the outcome of a Send that ended its goroutine.
var errSenderExited = errors.New("sender ended its goroutine (runtime.Goexit, as t.FailNow does) instead of returning")

// newWorker is a worker of e, not started yet (start).
func (e *engine) newWorker() *worker {
	k := &worker{e: e}
	k.lane.Store(-1)
	return k
}

// start runs k until the pass ends.
func (k *worker) start() {
	k.unwatch = k.watch()
	k.run(nil)
}

// run takes tasks until the pass ends, starting, when given is not nil, with
// the outcome of the Send the last goroutine was given up in, and the rest of
// its task.
func (k *worker) run(given *delivery) {
	e := k.e
	ended := false
	defer func() {
		if !ended { // given up in a Send: the goroutine in its place ends the worker
			return
		}
		k.unwatch()
		if k.w != nil {
			k.w.close()
		}
		e.workers.Done()
	}()
	last := -1        // the lane of the task it finished last
	if given != nil { // the key goes no further in this pass
		at := k.at
		failed, stopped := at.failed, append(at.stopped, at.m)
		if f, _ := k.settle(*given, false); f {
			failed = append(failed, at.m.Lane)
		}
		if !k.finish(at.t, at.g+1, failed, stopped, true) {
			return
		}
		last = at.t.lane
	}
	for {
		// Say it is free, and of which lane's task, before it takes the next:
		// the engine then chooses the next task knowing who works on what.
		e.idle <- last
		t, ok := <-e.work
		if !ok {
			break
		}
		if k.w == nil {
			var err error
			if k.w, err = e.rec.newWriter(e.ctx); err != nil {
				k.w = nil
			}
		}
		if !k.finish(t, 0, nil, nil, false) {
			return
		}
		last = t.lane
	}
	ended = true
}

// finish delivers t's groups from g on and hands the task's keys back, with
// the lanes that saw a failure and the messages its keys stopped at, once
// their outcomes are recorded. It hands the rest of the task back to the
// engine before a key when t's lane paused, or, after its first key, when
// another lane waits for a worker; with yield (it takes the place of a
// goroutine given up in a Send), at once, so that the engine chooses who
// the worker serves next knowing the lane is slow. It returns false when the
// goroutine was given up in a Send.
func (k *worker) finish(t task, g int, failed []int, stopped []*store.Row, yield bool) bool {
	e := k.e
	var rest []group
	switch {
	case k.w == nil: // no connection for the outcomes: send nothing
	case t.rounds:
		var f bool
		var s []*store.Row
		if f, s, rest = e.deliverRounds(t, k.w); f {
			failed = append(failed, t.lane)
		}
		stopped = append(stopped, s...)
	default:
		k.at.t = t
		for first := g; g < len(t.groups) && !e.halted(); g++ {
			if e.lanes[t.lane].paused() || yield && g == first || g > first && e.preempt(t.lane) {
				rest = t.groups[g:]
				break
			}
			k.at.g, k.at.failed, k.at.stopped = g, failed, stopped
			l, at, kept := k.deliverKey(t.groups[g])
			if !kept {
				return false
			}
			if l >= 0 {
				failed = append(failed, l)
			}
			if at != nil {
				stopped = append(stopped, at)
			}
		}
	}
	done := taskDone{lane: t.lane, failed: failed, stopped: stopped, keys: make([]string, 0, len(t.groups)-len(rest)),
		handedBack: len(rest) > 0}
	if len(rest) > 0 {
		e.back <- task{groups: rest, rounds: t.rounds, lane: t.lane, first: rest[0][0].ID}
	}
	handedBack := make(map[string]bool, len(rest))
	for _, g := range rest {
		handedBack[g[0].Key] = true
	}
	for _, g := range t.groups {
		if !handedBack[g[0].Key] {
			done.keys = append(done.keys, g[0].Key)
		}
	}
	if k.w != nil {
		k.w.finish(done, e.done) // once the task's outcomes are recorded
	} else {
		e.done <- done
	}
	return true
}

// deliverKey delivers the messages of one natural key, in id order, one at a
// time, and records each outcome. It stops at the first message that is not
// sent: the rest of that key wait for a later pass instead of overtaking it.
// failed is the lane of a message that failed, -1 if none; stopped is the
// message it stopped at, if it stopped before the key's last; kept is false
// when the goroutine was given up in a Send.
func (k *worker) deliverKey(g group) (failed int, stopped *store.Row, kept bool) {
	e := k.e
	for i, m := range g {
		if e.halted() {
			return -1, nil, true
		}
		d, kept := k.deliverOne(m)
		if !kept {
			return -1, nil, false
		}
		more := i < len(g)-1 && (d.out.Delivered() || m.Bad != "")
		if f, stop := k.settle(d, more); stop {
			if !d.out.Delivered() && d.out != relaytype.OutcomeInterrupted {
				stopped = m
			}
			if f {
				return m.Lane, stopped, true
			}
			return -1, stopped, true
		}
	}
	return -1, nil, true
}

// settle records d, the outcome of one message of a key (more: the key's
// next message follows it in this pass). stop is true when the key goes no
// further in this pass: the pass halts on an interrupted Send, an outcome
// could not be recorded, or the message failed (failed).
func (k *worker) settle(d delivery, more bool) (failed, stop bool) {
	switch {
	case d.out == relaytype.OutcomeInterrupted:
		k.e.halt()
		return false, true
	case k.w.recordOne(d, more) != nil:
		return false, true
	case !d.out.Delivered() && d.m.Bad == "":
		return true, true
	}
	return false, false
}

// deliverOne sends one message, or marks it dead unsent when it cannot be
// delivered, and says what became of it; recording it is the recorder's job.
func (k *worker) deliverOne(m *store.Row) (d delivery, kept bool) {
	if m.Bad != "" {
		return delivery{m: m, out: relaytype.OutcomeDead, sendErr: errors.New(m.Bad)}, true
	}
	kept, err := k.send(m)
	if !kept {
		return delivery{}, false
	}
	return k.e.r.outcomeOf(k.e.ctx, m, err, k.sending()), true
}

// send calls m's Sender on this goroutine under SendTimeout. kept is false
// when the Send was given up while it ran: the goroutine must then leave at
// once, since another holds the worker.
func (k *worker) send(m *store.Row) (kept bool, err error) {
	r := k.e.r
	start := time.Now()
	ctx, cancel := r.sendContext(k.e.ctx, start)
	defer cancel(nil)
	s, msg, l := r.deps.Senders[m.Type], *m, k.e.lanes[m.Lane] // read before the turn: m is the taker's after it
	turn := 2*k.sent + 1
	k.sent++
	k.at.m, k.at.ctx = m, ctx
	k.mu.Lock()
	k.running = running{turn: turn, cancel: cancel}
	k.mu.Unlock()
	k.since.Store(int64(start.Sub(k.born)))
	k.lane.Store(int32(m.Lane))
	k.turn.Store(turn)
	k.overdue.Reset(r.cfg.SendTimeout)
	returned := false
	defer func() {
		if !returned && k.turn.CompareAndSwap(turn, 0) { // runtime.Goexit in the Send
			go k.takeOver(errSenderExited)
		}
	}()
	err = s.Send(ctx, msg)
	returned = true
	if k.turn.Load() == turn {
		k.lane.Store(-1)
	}
	if !k.turn.CompareAndSwap(turn, turn+1) {
		// Given up: the worker, and its overdue timer, are another
		// goroutine's now.
		r.lanes.stuck.done(l, msg.Key)
		return false, err
	}
	// The timer is left set: firing for a Send that returned, it does
	// nothing, and the next Send sets it again.
	return true, err
}

// watch arms what ends a Send at its SendTimeout and gives up one that
// ignores its context: the worker's overdue timer, set for each Send to fire
// at its SendTimeout, which ends the Send's context and gives it sendGrace
// more, and, sendGrace after the pass's context ends, a look at the Send then
// running. Both are the worker's, not each Send's. It returns their stop.
func (k *worker) watch() (stop func()) {
	k.born = time.Now()
	timeout := k.e.r.cfg.SendTimeout
	k.overdue = time.AfterFunc(time.Duration(math.MaxInt64), func() {
		v := k.turn.Load()
		if v&1 == 0 || k.sending() < timeout {
			return // the Send it was set for returned: the one running now has set it again
		}
		k.mu.Lock()
		run := k.running
		k.mu.Unlock()
		if run.turn != v {
			return // v returned meanwhile; its successor is younger than timeout
		}
		run.cancel(k.e.r.sendTimedOut)
		time.AfterFunc(sendGrace, func() {
			if k.turn.Load() == v {
				k.giveUp(v)
			}
		})
	})
	stopEnded := context.AfterFunc(k.e.ctx, func() {
		time.AfterFunc(sendGrace, func() {
			if v := k.turn.Load(); v&1 == 1 {
				k.giveUp(v)
			}
		})
	})
	return func() {
		k.overdue.Stop()
		stopEnded()
	}
}

// giveUp gives up the Send numbered turn, unless it returned meanwhile, and
// goes on with the worker on this goroutine.
func (k *worker) giveUp(turn uint64) {
	if !k.turn.CompareAndSwap(turn, 0) {
		return // it answered in time
	}
	m := k.at.m
	k.e.r.deps.Logger.LogAttrs(k.e.ctx, slog.LevelError, "relay: sender did not return after its context ended; abandoned",
		slog.Int64("id", m.ID), slog.String("type", m.Type))
	k.e.r.lanes.stuck.add(k.e.lanes[m.Lane], m.Key) // its key waits until it returns
	k.takeOver(context.Cause(k.at.ctx))
}

// takeOver goes on with the worker in the place of the goroutine given up in
// its Send, whose message failed with cause.
func (k *worker) takeOver(cause error) {
	d := k.e.r.outcomeOf(k.e.ctx, k.at.m, cause, k.sending())
	k.run(&d)
}

// sending is how long the last Send started has been running, or ran.
func (k *worker) sending() time.Duration {
	return time.Since(k.born) - time.Duration(k.since.Load())
}
