package relay

import (
	"context"
	"fmt"
	"time"

	"github.com/xadm/relay/internal/election"
	"github.com/xadm/relay/internal/pass"
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
		Outbox: r.repo}
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

// passOpts tune a pass: the engine's (internal/pass) and the election's. The
// zero value is Run's and RunIfElected's: one batch.
type passOpts struct {
	Halt  <-chan struct{}      // closed: start no new message or batch (graceful stop)
	Drain bool                 // take batches while they come back full
	Own   *election.OwnSession // the started relay's own session, for the idle poll; nil: the pool's
	// Keep, for the loop's passes, says from the pass's result whether the
	// election is kept for the next pass (Polled); nil: let go.
	Keep func(passResult) bool
	// Wake is the loop's wake-ups: one that comes while the pass waits for
	// its last messages has it select again at once. nil: none.
	Wake <-chan struct{}
	// Woken says a wake-up (or its follow-up) started the loop's pass
	// (election.Opts).
	Woken bool
	// AfterLoss says the loop's last pass lost its election (election.Opts).
	AfterLoss bool
}

// passResult is what a pass did: the engine's result, and whether it ran.
type passResult struct {
	pass.Result
	Ran bool // the pass ran: elected, or direct
}

// Coalesced says another session held the election: the pass neither ran nor failed.
func (p *passResult) Coalesced() bool { return !p.Ran && p.Err == nil }

// pass runs one pass of kind: it takes the pass slot (waiting for it, or
// coalescing when it is taken), asks the election, runs the engine under what
// the election holds and reports the pass.
func (r *Relay) pass(ctx context.Context, kind passKind, o passOpts) passResult {
	e := r.election
	if kind == passDirect {
		e = r.direct
	}
	start := time.Now()
	if e.Waits() {
		select {
		case r.slot <- struct{}{}:
		case <-ctx.Done():
			var res passResult
			res.Err = ctx.Err()
			return res
		}
	} else {
		select {
		case r.slot <- struct{}{}:
		default:
			// A pass of this relay is in flight: it holds the election, so
			// this one coalesces like any other loser.
			r.passDone(passResult{}, start)
			return passResult{}
		}
	}
	defer func() { <-r.slot }()
	var res passResult
	eo := election.Opts{Own: o.Own, Woken: o.Woken, AfterLoss: o.AfterLoss}
	work := true
	if kind == passTimed {
		res, work = r.poll(ctx, e, eo)
	}
	if work {
		res = r.elected(ctx, e, eo, o)
	}
	r.passDone(res, start)
	return res
}

// poll is a timed pass's look for work, before the election: the idle poll
// reads the table, which is learned first, and looks for the types that may
// be sent now.
func (r *Relay) poll(ctx context.Context, e election.Election, eo election.Opts) (res passResult, work bool) {
	if e.Polls() {
		if res.Err = r.learnTable(ctx); res.Err != nil {
			return res, false
		}
		eo.Types = r.sendable() // a paused type's rows are no work until its pause ends
	}
	res.Ran, work, res.Err = e.Poll(ctx, eo)
	return res, work
}

// elected runs the engine under the election e, with what it holds.
func (r *Relay) elected(ctx context.Context, e election.Election, eo election.Opts, o passOpts) (res passResult) {
	if o.Keep != nil {
		eo.Keep = func() bool {
			kept := res
			kept.Ran = true
			return o.Keep(kept)
		}
	}
	res.Ran, res.Err = e.Run(ctx, eo, func(ctx context.Context, t election.Term) error {
		po := pass.Opts{Halt: o.Halt, Drain: o.Drain, Wake: o.Wake, Parts: t.Parts}
		if t.DrainFor > 0 {
			po.DrainFor = min(t.DrainFor, pass.DrainMax)
		}
		res.Result = r.dispatch(ctx, po)
		return res.Err
	})
	return res
}
