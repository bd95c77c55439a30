package pass

import (
	"math"

	"github.com/xadm/relay/internal/store"
)

// This file holds the engine's state as two small types: the cursor, where
// the next select of a pass starts and whether there is one, and the flight,
// what the engine has handed to its workers. engine.run moves them through
// their named transitions only.

// cursor is where a pass's next select starts. After a full batch, the next
// is selected past its last id, at once: the outcomes of the one before need
// not be written first, since none of its rows can come back. A row left
// behind (its key in flight) is found by a select from the start, once the
// drain has nothing new past the last batch; a select that goes over ids
// selected before (rereads) waits for the outcomes waiting to be written,
// since a grouped outcome's key is done before its group is written.
type cursor struct {
	drain     bool  // take batches while they come back full, or rows were left behind
	limit     int   // without drain, the rows the pass takes (BatchSize), in as many selects as BatchBytes cuts them into
	taken     int   // without drain, the rows taken so far
	more      bool  // there is a next select
	first     bool  // no select yet: the next carries the preflight
	fromStart bool  // the next select starts from the beginning
	behind    bool  // rows were left behind since the last select from the start
	after     int64 // the last id of the last select: a drain goes on past it
	seen      int64 // the highest id selected so far
}

func newCursor(drain bool, limit int) cursor {
	return cursor{drain: drain, limit: limit, more: true, first: true, fromStart: true, after: math.MinInt64, seen: math.MinInt64}
}

// take keeps, of a select's rows, those within a direct pass's limit.
func (c *cursor) take(rows []store.Row) []store.Row {
	if c.drain {
		return rows
	}
	if rest := c.limit - c.taken; len(rows) > rest {
		rows = rows[:rest]
	}
	c.taken += len(rows)
	return rows
}

// next starts the next select: where it starts, and whether it goes over ids
// selected before.
func (c *cursor) next() (from int64, rereads bool) {
	from = c.after
	if c.fromStart {
		from, c.behind = math.MinInt64, false
	}
	return from, from < c.seen
}

// selected moves the cursor past a select's rows: on past them after a full
// batch (or, without drain, one cut by BatchBytes before the pass's limit),
// back to the start when rows were left behind, or nowhere (the pass takes no
// more batches).
func (c *cursor) selected(rows []store.Row, full, cut, skipped bool) {
	c.first = false
	if n := len(rows); n > 0 {
		c.after = rows[n-1].ID // onwards from here, whether this select was from the start or not
		c.seen = max(c.seen, c.after)
	}
	c.behind = c.behind || skipped
	switch {
	case !c.drain: // cut by BatchBytes, not by BatchSize: on past it
		c.more, c.fromStart = cut && c.taken < c.limit, false
	case full: // onwards, past this batch
		c.more, c.fromStart = true, false
	case c.behind: // nothing new past it: back for what was left behind
		c.more, c.fromStart = true, true
	default:
		c.more = false
	}
}

// woken starts selecting again, after a pass's last batch, for rows a
// wake-up says were committed since: on past the last batch, or from the
// start when rows were left behind. Without drain (one batch) it does nothing.
func (c *cursor) woken() {
	if c.drain {
		c.more, c.fromStart = true, c.behind
	}
}

// stop ends the pass's selects: a failure, a halt, or the drain's time bound.
func (c *cursor) stop() { c.more = false }

// reread takes, into the cursor, a select from the start for some lanes
// (engine.selectHungry): the ids it went over, and whether it left rows
// behind. Where the next select starts does not change.
func (c *cursor) reread(rows []store.Row, skipped bool) {
	if n := len(rows); n > 0 {
		c.seen = max(c.seen, rows[n-1].ID)
	}
	c.behind = c.behind || skipped
	if c.drain && skipped && !c.more {
		c.more, c.fromStart = true, true
	}
}

// flight is what the engine has queued and handed out: the tasks queued for
// the workers by lane, the keys queued or in flight, and whether the next
// select waits for a task to finish first.
type flight struct {
	lanes    []laneFlight
	handOuts int             // tasks handed out so far: a lane's turn
	busy     map[string]bool // keys queued or handed out, and not yet done
	tasks    int             // tasks handed out and not yet done
	workers  int             // workers started
	idle     int             // workers free for a task
	starting bool            // a worker was started and has not said it is free yet
	waitDone bool            // select again only once a task is done
}

// laneFlight is one lane's part of the flight.
type laneFlight struct {
	queue    []task
	inFlight int  // its tasks at a worker
	turn     int  // flight.handOuts when it was last handed a task
	stopped  bool // a message of it failed in this pass: it is selected no more
}

func newFlight(lanes int) *flight {
	return &flight{lanes: make([]laneFlight, lanes), busy: make(map[string]bool)}
}

// queue queues t, its keys busy from now.
func (f *flight) queue(t task) {
	for _, g := range t.groups {
		f.busy[g[0].Key] = true
	}
	q := &f.lanes[t.lane]
	q.queue = append(q.queue, t)
}

// queued is how many tasks wait for a worker.
func (f *flight) queued() int {
	n := 0
	for i := range f.lanes {
		n += len(f.lanes[i].queue)
	}
	return n
}

// next is the task to hand out: of the lanes with tasks queued, the one with
// the fewest in flight; of those, the one served longest ago, then the one
// whose task is the oldest. A slow lane (lanes.go) never takes the last of
// workers while the relay has other lanes: that one is kept for them, so
// that another type waits for no slow send. ok is false when no lane may
// take a worker now.
func (f *flight) next(lanes []*lane, workers int) (t task, ok bool) {
	best := -1
	for i := range f.lanes {
		q := &f.lanes[i]
		if len(q.queue) == 0 || len(lanes) > 1 && workers > 1 && q.inFlight >= workers-1 && lanes[i].slow.Load() {
			continue
		}
		if best < 0 {
			best = i
			continue
		}
		b := &f.lanes[best]
		if q.inFlight != b.inFlight {
			if q.inFlight < b.inFlight {
				best = i
			}
			continue
		}
		if q.turn < b.turn || q.turn == b.turn && q.queue[0].first < b.queue[0].first {
			best = i
		}
	}
	if best < 0 {
		return task{}, false
	}
	return f.lanes[best].queue[0], true
}

// handed records that t went to a worker.
func (f *flight) handed(t task) {
	q := &f.lanes[t.lane]
	q.queue = q.queue[1:]
	q.inFlight++
	f.tasks++
	f.idle--
	f.handOuts++
	q.turn = f.handOuts
}

// finished records that a task's keys are done: their outcomes are recorded.
func (f *flight) finished(d taskDone) {
	for _, k := range d.keys {
		delete(f.busy, k)
	}
	f.tasks--
	f.waitDone = false
}

// freed records that a worker is free, having finished a task of lane (-1:
// a worker just started).
func (f *flight) freed(lane int) {
	f.idle++
	if lane < 0 {
		f.starting = false
		return
	}
	f.lanes[lane].inFlight--
}

// requeue puts the rest of a task a worker handed back first in its lane's
// queue; its keys stay busy.
func (f *flight) requeue(t task) {
	q := &f.lanes[t.lane]
	q.queue = append([]task{t}, q.queue...)
}

// starving reports whether a lane waits with tasks queued and none in
// flight, while every worker is taken.
func (f *flight) starving(workers int) bool { return f.starvingWith(f.idle, -1, workers) }

// starvingAfter is starving as it will be once t is handed out. A select
// that hands out something else instead leaves it said for one turn of the
// engine's loop, at worst one worker's task handed back for nothing.
func (f *flight) starvingAfter(t task, workers int) bool {
	return f.starvingWith(f.idle-1, t.lane, workers)
}

// starvingWith is starving with idle workers free and, when handed is a
// lane, one task of it moved from its queue to a worker.
func (f *flight) starvingWith(idle, handed, workers int) bool {
	if idle > 0 || f.workers < workers {
		return false
	}
	for i := range f.lanes {
		queued, inFlight := len(f.lanes[i].queue), f.lanes[i].inFlight
		if i == handed {
			queued, inFlight = queued-1, inFlight+1
		}
		if queued > 0 && inFlight == 0 {
			return true
		}
	}
	return false
}

// dropPaused drops the queued tasks of the lanes paused meanwhile: their keys
// are no longer busy, and wait, blocked, past this pass.
func (f *flight) dropPaused(e *engine) {
	for i := range f.lanes {
		q := &f.lanes[i]
		if len(q.queue) == 0 || !e.lanes[i].paused() {
			continue
		}
		for _, t := range q.queue {
			for _, g := range t.groups {
				delete(f.busy, g[0].Key)
				e.blocked[g[0].Key] = blockedRow{lane: i}
			}
		}
		q.queue = nil
	}
}

// dropAll drops every queued task: the pass starts nothing new.
func (f *flight) dropAll() {
	for i := range f.lanes {
		f.lanes[i].queue = nil
	}
}

// planned notes a batch's tasks queued. With nothing of it to send and keys
// still in flight, a select from the start waits for one of them first: it
// would find the same rows again.
func (f *flight) planned(c *cursor) {
	f.waitDone = f.queued() == 0 && len(f.busy) > 0 && c.fromStart
}
