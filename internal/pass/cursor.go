package pass

import (
	"math"
	"slices"

	"github.com/xadm/relay/internal/store"
)

// This file holds the cursor, where each lane's next select starts and
// whether there is one: half of the engine's state, the flight (flight.go)
// the other. engine.run moves them through their named transitions only.

// cursor is where each lane's next window starts, in an epoch of a pass.
// An epoch begins with a select of every lane from the start, which reads
// the table's highest id (store's epoch); each lane's later windows go on
// past the last row of its own last one, at once: the outcomes of the rows
// before need not be written first, since none of them can come back. A
// lane's cursor moves only over rows its own selects returned, so a type
// left out of the selects for a while (paused, failed in this pass, or with
// work queued) goes on where it stopped. Rows left behind (a key in flight,
// a row held behind an older one: store.HeldAgain) are found by the next
// epoch, once the drain has nothing new; a select that starts an epoch goes
// over ids selected before (rereads), so it waits for the outcomes waiting to
// be written, since a grouped outcome's key is done before its group is
// written.
type cursor struct {
	drain     bool    // take windows while some lane has more, or rows were left behind
	limit     int     // without drain, the rows the pass takes (BatchSize), in as many selects as BatchBytes cuts them into
	taken     int     // without drain, the rows taken so far
	more      bool    // there is a next select
	first     bool    // no select yet: the next carries the preflight
	fromStart bool    // the next select starts an epoch
	behind    bool    // rows were left behind since the epoch began
	epoch     int64   // the highest id when the epoch began
	after     []int64 // by lane, where its next window starts
	seen      []int64 // by lane, the highest id of it selected in this pass
	lanesMore []bool  // by lane, its last window left rows out
}

func newCursor(drain bool, limit, lanes int) cursor {
	c := cursor{drain: drain, limit: limit, more: true, first: true, fromStart: true, epoch: math.MinInt64,
		after: make([]int64, lanes), seen: make([]int64, lanes), lanesMore: make([]bool, lanes)}
	for i := range c.after {
		c.after[i], c.seen[i] = math.MinInt64, math.MinInt64
	}
	return c
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

// next is where the next select of lanes starts, whether it starts an epoch
// (then every lane starts from the start, and the rows left behind are
// selected again; a select for new rows only, !epochOK, starts none but the
// pass's first), and whether it goes over ids selected before in this pass
// (rereads): each is in flight (its key busy), or its outcome is recorded
// once the outcomes waiting to be written are (a grouped outcome's key is
// done before its group is written).
func (c *cursor) next(lanes []int, epochOK bool) (after []int64, epoch, rereads bool) {
	if epoch = c.fromStart && (epochOK || c.first); epoch {
		for i := range c.after {
			c.after[i], c.lanesMore[i] = math.MinInt64, false
		}
		c.behind = false
	}
	after = make([]int64, len(lanes))
	for i, l := range lanes {
		after[i] = c.after[l]
		rereads = rereads || c.after[l] < c.seen[l]
	}
	return after, epoch, rereads
}

// selected moves the cursors of a select's lanes past its rows, and says
// whether another select follows: at once while some lane had more rows than
// the select took, from the start when rows were left behind, or not at all.
// Without drain, a select cut by BatchBytes before the pass's limit is
// followed by the next.
func (c *cursor) selected(lanes []int, f store.Batch, rows []store.Row, epoch, skipped bool, laneOf func(typ string) int) {
	c.first = false
	if epoch {
		c.fromStart, c.epoch = false, f.Epoch
	}
	for _, l := range lanes {
		c.lanesMore[l] = f.Cut
	}
	for _, typ := range f.More {
		c.lanesMore[laneOf(typ)] = true
	}
	for i := range rows {
		l := rows[i].Lane
		c.after[l] = rows[i].ID // rows are in id order
		c.seen[l] = max(c.seen[l], rows[i].ID)
	}
	c.behind = c.behind || skipped
	if !c.drain {
		c.more = f.Cut && c.taken < c.limit
		return
	}
	c.more = slices.Contains(c.lanesMore, true) || c.behind
	c.fromStart = !slices.Contains(c.lanesMore, true) && c.behind
}

// drop forgets that lane has more rows: it cannot be selected in this pass
// (paused, or failed in it), and its rows wait for the next.
func (c *cursor) drop(lane int) {
	if c.lanesMore[lane] {
		c.lanesMore[lane] = false
		c.more = slices.Contains(c.lanesMore, true) || c.behind
		c.fromStart = c.more && !slices.Contains(c.lanesMore, true)
	}
}

// woken starts selecting again, after a pass's last window, for rows a
// wake-up says were committed since: past each lane's cursor, or from the
// start when rows were left behind. Without drain (one batch) it does
// nothing. (Separable lanes select for such rows at once, beside the
// queues: engine.selectBatch's hungry select.)
func (c *cursor) woken() {
	if c.drain {
		c.more, c.fromStart = true, c.behind
	}
}

// stop ends the pass's selects: a failure, a halt, or the drain's time bound.
func (c *cursor) stop() { c.more = false }
