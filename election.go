package relay

import (
	"context"
	"fmt"
	"time"

	"github.com/xadm/relay/internal/election"
)

// This file is the one seam that runs a pass. [Relay.pass] is the only
// function that takes the pass slot (one pass of a relay at a time) and the
// only one that reports a pass; Run, RunIfElected and the loop's timer and
// wake-up passes all go through it. How a pass is elected is decided once, in
// New (chooseElection), as one of internal/election's four elections.

// passKind is why a pass runs.
type passKind int

const (
	passDirect  passKind = iota // Run: no election; waits for a pass in flight
	passElected                 // RunIfElected and the loop's woken passes: straight to the election
	passTimed                   // the loop's timer: the election's idle poll first, where it has one
)

// chooseElection picks the relay's election, once. With ClusterLock and no
// Guard it is the relay's own PostgresGuard on its pool, as it is when the
// adopter passes one on that same pool.
func (r *Relay) chooseElection(guard Guard) (election.Election, error) {
	er := &election.Relay{Pool: r.pool, Logger: r.logger, Key: r.key, Table: r.cfg.Table, Types: r.types,
		MaxAttempts: r.cfg.MaxAttempts, Partitions: r.cfg.Partitions, Interval: r.cfg.Interval, Presence: r.presence,
		Outbox: r.repo, Sendable: r.sendable, Dispatch: r.dispatch, LearnTable: r.learnTable,
		SetPartitions: r.stats.setPartitions}
	r.direct = election.NewNone(er)
	if !r.cfg.ClusterLock {
		return r.direct, nil
	}
	own, _ := guard.(*PostgresGuard)
	if guard == nil {
		own = NewPostgresGuard(r.pool)
		own.g.SetLogger(r.logger)
	}
	onPool := own != nil && own.g.Pool() == r.pool
	// The election would hold the pool's only connection while the pass waits
	// for another: fail now rather than at every pass.
	if onPool && r.maxConns < 2 {
		return nil, fmt.Errorf("relay: the pool allows %d connection; the election holds one for the whole pass "+
			"and the pass needs another: set pool_max_conns to at least 2", r.maxConns)
	}
	switch { // the check that the pool keeps its sessions, shared with the guard on it
	case onPool:
		r.sessions = own.g.Sessions()
	case r.cfg.Partitions > 1:
		r.sessions = &election.SessionCheck{}
	}
	er.Sessions = r.sessions
	switch {
	case r.cfg.Partitions > 1:
		return election.NewMember(er), nil
	case !onPool:
		return election.NewGuarded(er, guard), nil
	}
	return election.NewPolled(er, own.g), nil
}

// pass runs one pass of kind: it takes the pass slot (waiting for it, or
// coalescing when it is taken), elects, runs the engine and reports the pass.
func (r *Relay) pass(ctx context.Context, kind passKind, o election.Opts) election.Result {
	e := r.election
	if kind == passDirect {
		e = r.direct
	}
	start := time.Now()
	if e.Waits() {
		select {
		case r.slot <- struct{}{}:
		case <-ctx.Done():
			var res election.Result
			res.Err = ctx.Err()
			return res
		}
	} else {
		select {
		case r.slot <- struct{}{}:
		default:
			// A pass of this relay is in flight: it holds the election, so
			// this one coalesces like any other loser.
			r.passDone(election.Result{}, start)
			return election.Result{}
		}
	}
	defer func() { <-r.slot }()
	var res election.Result
	work := true
	if kind == passTimed {
		res, work = e.Poll(ctx, o)
	}
	if work {
		res = e.Run(ctx, o)
	}
	r.passDone(res, start)
	return res
}
