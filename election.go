package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// This file is the one seam that runs a pass. [Relay.pass] is the only
// function that takes the pass slot (one pass of a relay at a time) and the
// only one that reports a pass; Run, RunIfElected and the loop's timer and
// wake-up passes all go through it. How a pass is elected is decided once, in
// New (chooseElection), as one of four elections:
//
//   - noElection: ClusterLock off (the escape hatch), and Run's direct pass;
//   - guardElection: a Guard of the adopter's own, run as given;
//   - polledElection: the relay's own PostgresGuard on its pool, whose timer
//     passes first look for work in the statement that tries the lock (the
//     idle poll: one statement per Interval when idle);
//   - memberElection: the partitioned election (Partitions > 1).
//
// Nothing looks at the Guard's concrete type after New.

// passKind is why a pass runs.
type passKind int

const (
	passDirect  passKind = iota // Run: no election; waits for a pass in flight
	passElected                 // RunIfElected and the loop's woken passes: straight to the election
	passTimed                   // the loop's timer: the election's idle poll first, where it has one
)

// election decides whether this replica runs a pass, and runs it.
type election interface {
	// waits reports whether a pass waits for one of this relay in flight
	// instead of coalescing: without an election nothing is held that a
	// second pass could coalesce on.
	waits() bool
	// poll looks for work at the cost of as little as it can: a pass that
	// finds none is over, elected or coalesced, with res. Elections without a
	// poll report work at once.
	poll(ctx context.Context, o passOpts) (res passResult, work bool)
	// run runs the engine under the election; res.ran is false when it coalesced.
	run(ctx context.Context, o passOpts) passResult
	// begin and end bracket the started loop: what outlasts one pass (a
	// partitioned membership) lasts from begin to end, after the last pass.
	begin()
	end(ctx context.Context)
}

// chooseElection picks the relay's election, once. With ClusterLock and no
// Guard it is the relay's own PostgresGuard on its pool, as it is when the
// adopter passes one on that same pool.
func (r *Relay) chooseElection(guard Guard) (election, error) {
	if !r.cfg.ClusterLock {
		return noElection{r}, nil
	}
	own, _ := guard.(*PostgresGuard)
	if guard == nil {
		own = NewPostgresGuard(r.pool)
		own.logger = r.logger
	}
	onPool := own != nil && own.pool == r.pool
	// The election would hold the pool's only connection while the pass waits
	// for another: fail now rather than at every pass.
	if onPool && r.maxConns < 2 {
		return nil, fmt.Errorf("relay: the pool allows %d connection; the election holds one for the whole pass "+
			"and the pass needs another: set pool_max_conns to at least 2", r.maxConns)
	}
	switch { // the check that the pool keeps its sessions, shared with the guard on it
	case onPool:
		r.sessions = own.sessions
	case r.cfg.Partitions > 1:
		r.sessions = &sessionCheck{}
	}
	switch {
	case r.cfg.Partitions > 1:
		return &memberElection{m: newMembership(r)}, nil
	case !onPool:
		return guardElection{r: r, guard: guard}, nil
	}
	return polledElection{guardElection{r: r, guard: own}}, nil
}

// pass runs one pass of kind: it takes the pass slot (waiting for it, or
// coalescing when it is taken), elects, runs the engine and reports the pass.
func (r *Relay) pass(ctx context.Context, kind passKind, o passOpts) passResult {
	e := r.election
	if kind == passDirect {
		e = noElection{r}
	}
	start := time.Now()
	if e.waits() {
		select {
		case r.slot <- struct{}{}:
		case <-ctx.Done():
			return passResult{err: ctx.Err()}
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
	work := true
	if kind == passTimed {
		res, work = e.poll(ctx, o)
	}
	if work {
		res = e.run(ctx, o)
	}
	r.passDone(res, start)
	return res
}

// noElection runs every pass directly: ClusterLock off, or Run.
type noElection struct{ r *Relay }

func (noElection) waits() bool                                       { return true }
func (noElection) poll(context.Context, passOpts) (passResult, bool) { return passResult{}, true }
func (noElection) begin()                                            {}
func (noElection) end(context.Context)                               {}
func (e noElection) run(ctx context.Context, o passOpts) passResult {
	res := e.r.dispatch(ctx, o)
	res.ran = true
	return res
}

// guardElection runs the pass under a Guard's TryRun.
type guardElection struct {
	r     *Relay
	guard Guard
}

func (guardElection) waits() bool                                       { return false }
func (guardElection) poll(context.Context, passOpts) (passResult, bool) { return passResult{}, true }
func (guardElection) begin()                                            {}
func (guardElection) end(context.Context)                               {}

func (e guardElection) run(ctx context.Context, o passOpts) passResult {
	var res passResult
	ran, err := e.tryRun(ctx, func(ctx context.Context) error {
		res = e.r.dispatch(ctx, o)
		return res.err
	})
	res.err, res.ran = err, ran
	return res
}

// tryRun runs fn under the guard. A Guard of the adopter's own that panics
// is recovered here: the pass fails, the relay goes on.
func (e guardElection) tryRun(ctx context.Context, fn func(ctx context.Context) error) (ran bool, err error) {
	defer func() {
		if p := recover(); p != nil {
			e.r.logger.LogAttrs(ctx, slog.LevelError, "relay: the election panicked", slog.Any("panic", p), slog.String("stack", string(debug.Stack())))
			err = fmt.Errorf("relay: the election panicked: %v", p)
		}
	}()
	return e.guard.TryRun(withReplica(ctx, e.r.presence.id), e.r.key, fn)
}

// polledElection is the relay's own PostgresGuard on its pool. Its poll is one
// statement that wins the election for its own length and looks for work
// (pollSQL): without work, that is the whole pass, elected or coalesced, so
// an idle replica costs one statement per Interval, run on the started
// relay's own session (session.go) where it has one. With work, the pass
// takes the election for real.
type polledElection struct{ guardElection }

func (e polledElection) poll(ctx context.Context, o passOpts) (res passResult, work bool) {
	r := e.r
	if err := r.learnTable(ctx); err != nil {
		return passResult{err: err}, false
	}
	pctx, cancel := context.WithTimeout(ctx, guardLockTimeout)
	defer cancel()
	var readOnly, won bool
	// On the relay's own session (session.go) when it has one: no pooled
	// connection to take, and so no ping of pgxpool's before it.
	err := o.own.do(pctx, func(ctx context.Context, conn *pgx.Conn, pid uint32) error {
		var got uint32
		var err error
		readOnly, won, work, got, err = r.repo.poll(ctx, conn, r.presence.mark, r.cfg.MaxAttempts, r.types, r.key)
		if err == nil && got != pid {
			err = errPresenceMoved
		}
		return err
	})
	if errors.Is(err, errNoSession) {
		var c *pgxpool.Conn
		if c, err = acquire(pctx, r.pool, "poll for work"); err != nil {
			return passResult{err: err}, false
		}
		readOnly, won, work, _, err = r.repo.poll(pctx, c, "", r.cfg.MaxAttempts, r.types, r.key)
		c.Release()
	}
	switch {
	case err != nil:
		return passResult{err: fmt.Errorf("relay: poll %s for work: %w", r.cfg.Table, err)}, false
	case readOnly:
		return passResult{err: fmt.Errorf("%w: not electing %q on it: a lock taken on a standby excludes nobody on the primary", ErrReadOnly, r.key)}, false
	case !won:
		return passResult{}, false // coalesced
	}
	return passResult{ran: true}, work
}

// memberElection is the partitioned election (partitions.go): a pass runs
// for the partitions this replica holds. While the loop runs, the membership
// lasts between passes; otherwise each pass joins and leaves.
type memberElection struct{ m *membership }

func (memberElection) waits() bool                                       { return false }
func (memberElection) poll(context.Context, passOpts) (passResult, bool) { return passResult{}, true }

func (e *memberElection) begin() {
	e.m.turn.Lock()
	defer e.m.turn.Unlock()
	e.m.stay = true
}

func (e *memberElection) end(ctx context.Context) {
	e.m.turn.Lock()
	defer e.m.turn.Unlock()
	e.m.stay = false
	e.m.leave(ctx)
}

func (e *memberElection) run(ctx context.Context, o passOpts) passResult {
	m := e.m
	m.turn.Lock()
	defer m.turn.Unlock()
	var res passResult
	o.drainFor = min(m.r.cfg.Interval, drainMax)
	ran, err := m.pass(ctx, func(ctx context.Context, parts []int) error {
		o.parts = parts
		res = m.r.dispatch(ctx, o)
		return res.err
	})
	res.err, res.ran = err, ran
	if !m.stay {
		m.leave(ctx)
	}
	return res
}
