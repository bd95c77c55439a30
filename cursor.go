package relay

import "math"

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
func (c *cursor) take(rows []row) []row {
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
func (c *cursor) selected(rows []row, full, cut, skipped bool) {
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

// flight is what the engine has handed out: the tasks queued for the
// workers, the keys in flight, and whether the next select waits for a task
// to finish first.
type flight struct {
	queue    []task
	busy     map[string]bool // keys handed out and not yet done
	tasks    int             // tasks handed out and not yet done
	workers  int             // workers started
	waitDone bool            // select again only once a task is done
}

// handed records that t went to a worker.
func (f *flight) handed(t task) {
	for _, g := range t.groups {
		f.busy[g[0].Key] = true
	}
	f.tasks++
	f.queue = f.queue[1:]
}

// finished records that a task's keys are done: their outcomes are recorded.
func (f *flight) finished(keys []string) {
	for _, k := range keys {
		delete(f.busy, k)
	}
	f.tasks--
	f.waitDone = false
}

// planned queues a batch's tasks. With nothing of it to send and keys still in
// flight, a select from the start waits for one of them first: it would find
// the same rows again.
func (f *flight) planned(queue []task, c *cursor) {
	f.queue = queue
	f.waitDone = len(queue) == 0 && len(f.busy) > 0 && c.fromStart
}
