package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/xadm/relay/internal/pass"
	"github.com/xadm/relay/internal/store"
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
//     idle poll: one statement per Interval when idle), and which the loop
//     keeps between its passes while work keeps arriving (kept election);
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

// passOpts tune a pass: the engine's (internal/pass) and the election's. The
// zero value is Run's and RunIfElected's: one batch.
type passOpts struct {
	halt     <-chan struct{} // closed: start no new message or batch (graceful stop)
	drain    bool            // take batches while they come back full
	drainFor time.Duration   // how long at most; 0: pass.DrainMax
	parts    []int           // partitioned: deliver only these partitions (partitions.go)
	own      *ownSession     // the started relay's own session, for the idle poll; nil: the pool's
	// keep, for the loop's passes, says from the pass's result whether the
	// election is kept for the next pass (polledElection); nil: let go.
	keep func(passResult) bool
	// wake is the loop's wake-ups: one that comes while the pass waits for
	// its last messages has it select again at once. nil: none.
	wake <-chan struct{}
	// afterLoss says the loop's last pass lost its election: a lock found
	// taken now is most likely that election's own, whose session's backend
	// has not exited yet (or a server going down answered), so the pass
	// fails rather than coalesces (polledElection).
	afterLoss bool
}

// passResult is what a pass did: the engine's result, and whether it ran.
type passResult struct {
	sent, failed, dead int
	lag                time.Duration
	outcomesWaiting    int  // the most outcomes that waited to be written at once (PassReport.OutcomesWaiting)
	backlog            bool // draining stopped at pass.DrainMax with rows left
	woken              bool // a wake-up came during the pass, and it selected again (passOpts.wake)
	ran                bool // the pass ran: elected, or direct
	err                error
}

func (p *passResult) processed() int { return p.sent + p.failed + p.dead }

// coalesced says another session held the election: the pass neither ran nor failed.
func (p *passResult) coalesced() bool { return !p.ran && p.err == nil }

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
	// keeps reports whether the election is kept between the loop's passes
	// right now (polledElection), and for how long at most without work: the
	// loop's timer then comes no later.
	keeps() (bool, time.Duration)
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
	return &polledElection{r: r, own: own, keptIdle: keptIdle}, nil
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
func (noElection) keeps() (bool, time.Duration)                      { return false, 0 }
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
func (guardElection) keeps() (bool, time.Duration)                      { return false, 0 }
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
	return e.guard.TryRun(store.WithReplica(ctx, e.r.presence.id), e.r.key, fn)
}

// polledElection is the relay's own PostgresGuard on its pool. Its poll is one
// statement that wins the election for its own length and looks for work
// (pollSQL): without work, that is the whole pass, elected or coalesced, so
// an idle replica costs one statement per Interval, run on the started
// relay's own session (session.go) where it has one. With work, the pass
// takes the election for real.
//
// The loop keeps the election it won between its passes while work keeps
// arriving: a steady trickle's woken passes then take no lock and give none
// back (two round trips, and a pooled connection's hand-off, fewer on each
// message's path; on a busy host each is a wait for the server's backend to
// be scheduled). It lets go of it after a pass that fails, one that stops at
// drainMax with a backlog (as before), a stop, and the first pass that finds
// nothing after keptIdle without a wake-up: an idle replica is back to its
// one poll per Interval, holding nothing. Meanwhile the watch's heartbeat
// keeps the lease, and a lease that ran out (a frozen process) or a session
// lost between passes is let go of before the next pass, which elects anew.
// Passes that are not the loop's (RunIfElected) run on the kept election if
// there is one, and let go of it.
type polledElection struct {
	r   *Relay
	own *PostgresGuard

	mu       sync.Mutex
	kept     *heldElection // the election kept between the loop's passes; nil: none
	keptIdle time.Duration // keptIdle; a test may lengthen it
}

// keptIdle is how long, at most, the loop keeps the election without a
// wake-up or a row: the loop's next timer pass comes no later, and lets go
// of it if it finds nothing.
const keptIdle = time.Second

func (*polledElection) waits() bool { return false }
func (*polledElection) begin()      {}

func (e *polledElection) keeps() (bool, time.Duration) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.kept != nil, e.keptIdle
}

// take takes the kept election out, if there is one: the pass that runs on
// it, or the loop's end, lets go of it or keeps it again.
func (e *polledElection) take() *heldElection {
	e.mu.Lock()
	defer e.mu.Unlock()
	h := e.kept
	e.kept = nil
	return h
}

// errLockNotFreeYet is the failure of a pass that found the election taken
// just after this relay lost it (passOpts.afterLoss), or let go of a kept one
// it no longer trusted: most likely its own old session's lock, which the
// server frees only as that backend exits (or a server going down that still
// answers). Coalescing then would make a standby of this replica, leaving
// the next wake-ups to a holder that may be gone; the loop backs off and
// elects again.
var errLockNotFreeYet = fmt.Errorf("%w: the election's last session ended, and its lock was not free yet; electing again at the next pass", ErrElectionLost)

func (e *polledElection) poll(ctx context.Context, o passOpts) (res passResult, work bool) {
	if kept, _ := e.keeps(); kept {
		return passResult{ran: true}, true // the kept election's pass looks for work itself
	}
	r := e.r
	if err := r.learnTable(ctx); err != nil {
		return passResult{err: err}, false
	}
	pctx, cancel := context.WithTimeout(ctx, guardLockTimeout)
	defer cancel()
	var readOnly, won bool
	types := r.runner.Lanes().Sendable() // a paused type's rows are no work until its pause ends
	// On the relay's own session (session.go) when it has one: no pooled
	// connection to take, and so no ping of pgxpool's before it.
	err := o.own.do(pctx, func(ctx context.Context, conn *pgx.Conn, pid uint32) error {
		var got uint32
		var err error
		readOnly, won, work, got, err = r.repo.Poll(ctx, conn, r.presence.mark(), r.cfg.MaxAttempts, types, r.key)
		if err == nil && got != pid {
			err = errPresenceMoved
		}
		return err
	})
	if errors.Is(err, errNoSession) {
		var c *pgxpool.Conn
		if c, err = store.Acquire(pctx, r.pool, "poll for work"); err != nil {
			return passResult{err: err}, false
		}
		readOnly, won, work, _, err = r.repo.Poll(pctx, c, "", r.cfg.MaxAttempts, types, r.key)
		c.Release()
	}
	switch {
	case err != nil:
		return passResult{err: fmt.Errorf("relay: poll %s for work: %w", r.cfg.Table, err)}, false
	case readOnly:
		return passResult{err: fmt.Errorf("%w: not electing %q on it: a lock taken on a standby excludes nobody on the primary", ErrReadOnly, r.key)}, false
	case !won && o.afterLoss:
		return passResult{err: errLockNotFreeYet}, false
	case !won:
		return passResult{}, false // coalesced
	}
	return passResult{ran: true}, work
}

// run runs the pass on the kept election, or on one it wins now, and keeps
// it afterwards when o.keep says the loop goes on with work arriving.
func (e *polledElection) run(ctx context.Context, o passOpts) (res passResult) {
	r := e.r
	h := e.take()
	lost := false
	if h != nil && !h.usable() {
		// Frozen past the lease, or the session lost between passes: let go
		// (the server may have freed the lock already) and elect anew.
		err := h.release(ctx, h.w.lease.Valid(time.Now()))
		r.logger.LogAttrs(ctx, slog.LevelWarn, "relay: the election kept since the last pass is no longer trusted; electing again",
			slog.String("key", r.key), slog.Any("error", err))
		h, lost = nil, true
	}
	if h == nil {
		var err error
		h, err = e.own.elect(store.WithReplica(ctx, r.presence.id), r.key)
		switch {
		case err != nil:
			return passResult{err: err}
		case h == nil && (lost || o.afterLoss):
			// Most likely the lock of the session just ended, which the
			// server frees as its backend exits: fail rather than coalesce,
			// so that this replica does not become a standby that leaves the
			// next wake-ups to a holder that may be gone.
			return passResult{err: errLockNotFreeYet}
		case h == nil:
			return passResult{}
		}
	}
	keep := false
	defer func() { // also when the pass panics: the panic goes on once the lock is let go of
		if keep {
			e.mu.Lock()
			e.kept = h
			e.mu.Unlock()
			return
		}
		res.err = h.release(ctx, res.err)
	}()
	err := h.run(ctx, func(ctx context.Context) error {
		res = r.dispatch(ctx, o)
		return res.err
	})
	res.err, res.ran = err, true
	keep = o.keep != nil && o.keep(res)
	return res
}

func (e *polledElection) end(ctx context.Context) {
	h := e.take()
	if h == nil {
		return
	}
	if err := h.release(ctx, nil); err != nil {
		e.r.logger.LogAttrs(ctx, slog.LevelWarn, "relay: stop: letting go of the kept election", slog.String("key", e.r.key), slog.Any("error", err))
	}
}

// memberElection is the partitioned election (partitions.go): a pass runs
// for the partitions this replica holds. While the loop runs, the membership
// lasts between passes; otherwise each pass joins and leaves.
type memberElection struct{ m *membership }

func (memberElection) waits() bool                  { return false }
func (memberElection) keeps() (bool, time.Duration) { return false, 0 }

// poll is idleCheck: after an idle pass that rebalanced, the next timer pass
// looks for work on the relay's own session and is over when it finds none.
func (e *memberElection) poll(ctx context.Context, o passOpts) (passResult, bool) {
	if e.m.idleCheck(ctx, o.own) {
		return passResult{}, true
	}
	return passResult{ran: true}, false
}

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
	o.drainFor = min(m.r.cfg.Interval, pass.DrainMax)
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
