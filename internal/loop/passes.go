package loop

import (
	"context"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/xadm/relay/internal/election"
	"github.com/xadm/relay/internal/pass"
)

// This file is the one seam that runs a pass. [Passes.Pass] is the only
// function that takes the pass slot (one pass of a relay at a time) and the
// only one that reports a pass; Run, RunIfElected and the loop's timer and
// wake-up passes all go through it. It asks the election (chosen once, in
// relay.New, as one of internal/election's four) and runs the engine under
// what the election holds.

// Kind is why a pass runs.
type Kind int

const (
	Direct  Kind = iota // Run: no election; waits for a pass in flight
	Elected             // RunIfElected and the loop's woken passes: straight to the election
	Timed               // the loop's timer: the election's idle poll first, where it has one
)

// Deps are what the passes take of the relay, built once in relay.New.
type Deps struct {
	Pool     *pgxpool.Pool // the relay's pool, whose connections the loop warms
	Logger   *slog.Logger
	Interval time.Duration // Config.Interval
	Enabled  bool          // Config.Enabled: the loop passes only when set
	// Election elects the passes of RunIfElected and the loop; Direct runs
	// Run's.
	Election, Direct election.Election
	// Runner runs the engine of each pass.
	Runner *pass.Runner
	// Learn learns the table before a pass reads it, and says whether it has
	// the key index (Keyed).
	Learn func(ctx context.Context) error
	Keyed func() bool
	// Sendable are the types whose rows may be sent now (not paused, not
	// yielded), which the idle poll looks for.
	Sendable func() []string
	// Report reports each pass, which started at start.
	Report func(res Result, start time.Time)
	// Failing is how many passes in a row have failed, for the backoff.
	Failing func() int
}

// Passes run a relay's passes, one at a time.
type Passes struct {
	d Deps
	// slot is a one-slot semaphore: one pass of this relay at a time. Only
	// Pass takes it.
	slot chan struct{}
}

// New returns the passes of the relay d describes.
func New(d Deps) *Passes { return &Passes{d: d, slot: make(chan struct{}, 1)} }

// Opts tune a pass: the engine's (internal/pass) and the election's, each
// in its own words. The zero value is Run's and RunIfElected's: one batch.
type Opts struct {
	// Pass is the engine's: Halt, Drain, Wake. The loop fills in the rest
	// (the partitions held, the drain's bound, the key index).
	Pass pass.Opts
	// Election is the election's: Own, Woken, AfterLoss. The loop fills in
	// the rest (the types the idle poll looks for, Keep).
	Election election.Opts
	// Keep, for the loop's passes, says from the pass's result whether the
	// election is kept for the next pass (Polled); nil: let go.
	Keep func(Result) bool
}

// Result is what a pass did: the engine's result, and whether it ran.
type Result struct {
	pass.Result
	Ran bool // the pass ran: elected, or direct
}

// Coalesced says another session held the election: the pass neither ran nor failed.
func (p *Result) Coalesced() bool { return !p.Ran && p.Err == nil }

// Pass runs one pass of kind: it takes the pass slot (waiting for it, or
// coalescing when it is taken), asks the election, runs the engine under what
// the election holds and reports the pass.
func (p *Passes) Pass(ctx context.Context, kind Kind, o Opts) Result {
	e := p.d.Election
	if kind == Direct {
		e = p.d.Direct
	}
	start := time.Now()
	if e.Waits() {
		select {
		case p.slot <- struct{}{}:
		case <-ctx.Done():
			var res Result
			res.Err = ctx.Err()
			return res
		}
	} else {
		select {
		case p.slot <- struct{}{}:
		default:
			// A pass of this relay is in flight: it holds the election, so
			// this one coalesces like any other loser.
			p.d.Report(Result{}, start)
			return Result{}
		}
	}
	defer func() { <-p.slot }()
	var res Result
	eo := o.Election
	work := true
	if kind == Timed {
		res, work = p.poll(ctx, e, eo)
	}
	if work {
		res = p.elected(ctx, e, eo, o)
	}
	p.d.Report(res, start)
	return res
}

// poll is a timed pass's look for work, before the election: the idle poll
// reads the table, which is learned first, and looks for the types that may
// be sent now.
func (p *Passes) poll(ctx context.Context, e election.Election, eo election.Opts) (res Result, work bool) {
	if e.Polls() {
		if res.Err = p.d.Learn(ctx); res.Err != nil {
			return res, false
		}
		eo.Types = p.d.Sendable() // a paused type's rows are no work until its pause ends
	}
	res.Ran, work, res.Err = e.Poll(ctx, eo)
	return res, work
}

// elected runs the engine under the election e, with what it holds.
func (p *Passes) elected(ctx context.Context, e election.Election, eo election.Opts, o Opts) (res Result) {
	if o.Keep != nil {
		eo.Keep = func() bool {
			kept := res
			kept.Ran = true
			return o.Keep(kept)
		}
	}
	res.Ran, res.Err = e.Run(ctx, eo, func(ctx context.Context, t election.Term) error {
		po := o.Pass
		po.Parts = t.Parts
		res.Result = p.dispatch(ctx, po, t)
		return res.Err
	})
	return res
}

// dispatch runs one pass's engine under the election's term t.
func (p *Passes) dispatch(ctx context.Context, po pass.Opts, t election.Term) pass.Result {
	if err := p.d.Learn(ctx); err != nil {
		return pass.Result{Err: err}
	}
	if t.DrainFor > 0 {
		po.DrainFor = min(t.DrainFor, pass.DrainMax)
	}
	po.Keyed = p.d.Keyed()
	return p.d.Runner.Run(ctx, po)
}
