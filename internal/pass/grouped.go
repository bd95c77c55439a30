package pass

import (
	"context"
	"sync"
	"time"
)

// groupedOutcomes records up to size outcomes in one statement (GroupOutcomes
// > 1), on a connection it holds from before the pass's first send. A group
// is written when it is full, before a select that goes over ids selected
// before, at the pass's end, and at most outcomeGroupDelay after its first
// outcome: a crash re-delivers at most size messages, never more than that
// much time's worth.
type groupedOutcomes struct {
	rc   *recorder
	size int

	flushing sync.Mutex // one group write at a time, so the last flush waits for a timer's
	conn     heldConn   // the connection the groups are written on

	mu      sync.Mutex
	pending []delivery
	timer   *time.Timer
}

// ready holds, before the pass's first send, the connection the groups will
// be written on.
func (g *groupedOutcomes) ready(ctx context.Context) error {
	g.flushing.Lock()
	defer g.flushing.Unlock()
	_, err := g.conn.get(ctx)
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
			if err := g.flush(); err != nil {
				return err
			}
		} else if err := g.rc.errorOf(); err != nil {
			return err
		}
	}
	return nil
}

// flush records the pending group, if any.
func (g *groupedOutcomes) flush() error {
	recorded, err := g.write()
	g.rc.report(recorded) // once no lock is held
	return g.rc.keep(err)
}

func (g *groupedOutcomes) write() ([]delivery, error) {
	g.flushing.Lock()
	defer g.flushing.Unlock()
	g.mu.Lock()
	group := g.pending
	g.pending = nil
	if g.timer != nil {
		g.timer.Stop()
		g.timer = nil
	}
	g.mu.Unlock()
	if len(group) == 0 {
		return nil, nil
	}
	defer g.rc.waiting.add(-len(group))
	return g.rc.write(group, &g.conn)
}

// close flushes the last group and gives the connection back.
func (g *groupedOutcomes) close() error {
	err := g.flush()
	g.flushing.Lock()
	g.conn.release()
	g.flushing.Unlock()
	return err
}
