package pass

// This file holds the flight, what the engine has handed to its workers: half
// of the engine's state, the cursor (cursor.go) the other. engine.run moves
// them through their named transitions only.

// flight is what the engine has queued and handed out: the tasks queued for
// the workers by lane, the keys queued or in flight, and whether the next
// select waits for a task to finish first.
type flight struct {
	lanes    []laneFlight
	handOuts int             // tasks handed out so far: a lane's turn
	busy     map[string]bool // keys queued or handed out, and not yet done
	tasks    int             // tasks handed out and not yet done
	transit  int             // rests of tasks said handed back (taskDone.handedBack) and not yet requeued; -1: one requeued first
	workers  int             // workers started
	idle     int             // workers free for a task
	starting bool            // a worker was started and has not said it is free yet
	waitDone bool            // select again only once a task is done
	// moved says a task was queued or done since the epoch began.
	moved bool
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
	f.moved = true
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
// whose task is the oldest. The slow lanes (engine.share) together hold at
// most slowCap workers: the rest are kept for the others, so that another
// type waits for no slow send. ok is false when no lane may take a worker
// now.
func (f *flight) next(slow []bool, slowCap int) (t task, ok bool) {
	slowInFlight := 0
	for i := range f.lanes {
		if slow[i] {
			slowInFlight += f.lanes[i].inFlight
		}
	}
	best := -1
	for i := range f.lanes {
		q := &f.lanes[i]
		if len(q.queue) == 0 || slow[i] && slowInFlight >= slowCap {
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
	f.waitDone, f.moved = false, true
	if d.handedBack {
		f.transit++
	}
}

// inFlight is how many tasks are at a worker, or on their way back from one.
// Once every task's done came (tasks 0), transit counts the rests still on
// their way; before, a rest requeued ahead of its task's done leaves it at -1
// for that task, which tasks still counts.
func (f *flight) inFlight() int { return f.tasks + max(f.transit, 0) }

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
	f.transit--
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
				e.block(g[0], false, false)
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
// still in flight, the next epoch's select waits for one of them first: it
// would find the same rows again; unless the select, not itself an epoch's,
// held rows behind older ones it lacked (held), which the next epoch's
// select may take with them.
func (f *flight) planned(c *cursor, held, epoch bool) {
	f.waitDone = f.queued() == 0 && len(f.busy) > 0 && c.fromStart && (epoch || !held)
}
