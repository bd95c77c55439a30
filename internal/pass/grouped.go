package pass

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// groupedOutcomes records up to size outcomes in one statement (GroupOutcomes
// > 1), on a connection it holds from before the pass's first send. A group
// is written when it is full, before a select that goes over ids selected
// before, at the pass's end, and at most outcomeGroupDelay after its first
// outcome. A full group is written behind the workers, who go on sending
// while it is on its way, and the next full group waits for that write: a
// crash re-delivers at most two groups' messages (2 × size, decision 0037),
// never more than outcomeGroupDelay and one write's worth of time.
type groupedOutcomes struct {
	rc   *recorder
	size int

	flushing sync.Mutex    // guards conn
	behind   chan struct{} // holds a token while a full group is written behind the workers (writeBehind)
	conn     heldConn      // the connection the groups are written on
	held     atomic.Bool   // conn was held by ready

	mu      sync.Mutex
	pending []delivery
	timer   *time.Timer
}

// ready holds, before the pass's first send, the connection the groups will
// be written on. Once it is held it returns at once, without waiting for a
// group being written on it (the writes keep it, or fail the pass).
func (g *groupedOutcomes) ready(ctx context.Context) error {
	if g.held.Load() {
		return g.rc.errorOf()
	}
	g.flushing.Lock()
	defer g.flushing.Unlock()
	_, err := g.conn.get(ctx)
	g.held.Store(err == nil)
	return g.rc.keep(err)
}

// hold holds nothing: the workers' outcomes go to the group's connection.
func (g *groupedOutcomes) hold(context.Context, *heldConn) error { return nil }

// add puts ds in the group, and writes the group once it is full. It returns
// an error once a recording has failed: the pass then starts no new message.
func (g *groupedOutcomes) add(ds []delivery, _ *heldConn) error {
	for _, d := range ds {
		g.mu.Lock()
		g.pending = append(g.pending, d)
		full := len(g.pending) >= g.size
		if !full && g.timer == nil {
			g.timer = time.AfterFunc(outcomeGroupDelay, func() { _ = g.flush() })
		}
		g.mu.Unlock()
		if full {
			if err := g.writeBehind(); err != nil {
				return err
			}
		} else if err := g.rc.errorOf(); err != nil {
			return err
		}
	}
	return nil
}

// writeBehind writes the pending group in the background, once the last
// group written so has been: the worker goes on sending meanwhile. It
// returns the pass's failure, if a write failed.
func (g *groupedOutcomes) writeBehind() error {
	g.behind <- struct{}{}
	if err := g.rc.errorOf(); err != nil {
		<-g.behind
		return err
	}
	group := g.take()
	go func() {
		defer func() { <-g.behind }()
		_ = g.writeGroup(group) // its failure is kept: the next add returns it
	}()
	return nil
}

// flush records every outcome added so far: it waits for a group written
// behind the workers, then writes the pending one.
func (g *groupedOutcomes) flush() error {
	g.behind <- struct{}{}
	defer func() { <-g.behind }()
	return g.writeGroup(g.take())
}

// take empties the pending group and returns it.
func (g *groupedOutcomes) take() []delivery {
	g.mu.Lock()
	defer g.mu.Unlock()
	group := g.pending
	g.pending = nil
	if g.timer != nil {
		g.timer.Stop()
		g.timer = nil
	}
	return group
}

// writeGroup records group, if it has any outcome, and reports it.
func (g *groupedOutcomes) writeGroup(group []delivery) error {
	if len(group) == 0 {
		return g.rc.errorOf()
	}
	g.flushing.Lock()
	recorded, err := g.rc.write(group, &g.conn)
	g.flushing.Unlock()
	g.rc.waiting.add(-len(group))
	g.rc.report(recorded) // once no lock is held
	return g.rc.keep(err)
}

// close flushes the last group and gives the connection back.
func (g *groupedOutcomes) close() error {
	err := g.flush()
	g.flushing.Lock()
	g.conn.release()
	g.flushing.Unlock()
	return err
}
