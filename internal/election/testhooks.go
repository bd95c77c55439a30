package election

import (
	"time"
)

// The hooks below are for the relay's tests only.

// SetKeptIdle makes a Polled election keep itself between the loop's passes
// for up to idle without work, instead of keptIdle; false for another
// election. It must run before the loop starts.
func SetKeptIdle(e Election, idle time.Duration) bool {
	p, ok := e.(*polledElection)
	if ok {
		p.keptIdle = idle
	}
	return ok
}

// IdleCheckNext reports whether a Member election will look for work on the
// relay's own session at its next timer pass, instead of rebalancing: its
// last pass was an idle one that rebalanced.
func IdleCheckNext(e Election) bool {
	m := e.(*memberElection).m
	m.turn.Lock()
	defer m.turn.Unlock()
	return m.idle
}
