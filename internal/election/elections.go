package election

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

	"github.com/xadm/relay/internal/lease"
	"github.com/xadm/relay/internal/session"
	"github.com/xadm/relay/internal/store"
)

// This file is how a pass is elected, chosen once, in relay.New, as one of
// four elections:
//
//   - None: ClusterLock off (the escape hatch), and Run's direct pass;
//   - Guarded: a Guard of the adopter's own, run as given;
//   - Polled: the relay's own Guard on its pool, whose timer passes first
//     look for work in the statement that tries the lock (the idle poll: one
//     statement per Interval when idle), and which the loop keeps between
//     its passes while work keeps arriving (kept election);
//   - Member: the partitioned election (Partitions > 1, partitions.go).
//
// An election is a gate: it says whether this replica holds the election
// and runs the job it is given under what it holds (Term: the lease in the
// job's ctx, the partitions), in the shape of relay.Guard's TryRun, since an
// adopter's Guard hands its ctx over only inside fn. It never knows what the
// job does: the caller (the loop) runs the pass in it. What it holds between
// passes it publishes (Keeps, Partitions).

// Deps are what the elections take of the relay they elect for, built once
// in relay.New.
type Deps struct {
	Pool        *pgxpool.Pool
	Logger      *slog.Logger
	Key         string // the election key: AppName + "_relay_m2m"
	Table       string // as configured, for messages
	Types       []string
	MaxAttempts int
	Partitions  int
	Interval    time.Duration
	Sessions    *session.SessionCheck // that the pool keeps its sessions; nil without an election on the pool
	Presence    *session.Presence
	Statements  *store.Table // the idle poll's and the partitions' check for work
}

// Opts are what a pass asks of its election. The zero value is Run's and
// RunIfElected's.
type Opts struct {
	Own *session.OwnSession // the started relay's own session, for the idle poll; nil: the pool's
	// Types are the types whose rows may be sent now, which the idle poll
	// looks for (Polls): a paused type's rows are no work until its pause
	// ends.
	Types []string
	// Keep, for the loop's passes, says once the job has returned whether
	// the election is kept for the next pass (Polled); nil: let go.
	Keep func() bool
	// Woken says a wake-up (or its follow-up) started the loop's pass: a
	// partitioned member then looks at its own partitions only, unless its
	// last rebalance is an Interval old (partitions.go).
	Woken bool
	// AfterLoss says the loop's last pass lost its election: a lock found
	// taken now is most likely that election's own, whose session's backend
	// has not exited yet (or a server going down answered), so the pass
	// fails rather than coalesces (Polled).
	AfterLoss bool
}

// Term is what an election holds for one pass, handed to the job it runs;
// the job's ctx carries the lease and ends when the election is lost.
type Term struct {
	// Parts are the partitions held (Member): the job delivers only these.
	// nil: the whole table.
	Parts []int
	// DrainFor is how long at most the job drains, so that the election is
	// looked at again that often (Member: Interval); 0: the job's own bound.
	DrainFor time.Duration
}

// Election decides whether this replica runs a pass: it runs the job it is
// given under what it holds, and never knows what the job does.
type Election interface {
	// Waits reports whether a pass waits for one of this relay in flight
	// instead of coalescing: without an election nothing is held that a
	// second pass could coalesce on.
	Waits() bool
	// Polls reports whether Poll reads the outbox table now (Polled, with no
	// election kept): the caller learns the table first, and says which
	// types may be sent (Opts.Types).
	Polls() bool
	// Poll looks for work at the cost of as little as it can: a pass that
	// finds none is over, elected (ran) or coalesced, or failed (err).
	// Elections without a poll report work at once.
	Poll(ctx context.Context, o Opts) (ran, work bool, err error)
	// Run runs job under the election, with what it holds; ran is false,
	// and job not called, when it coalesced (err nil) or failed before.
	Run(ctx context.Context, o Opts, job func(ctx context.Context, t Term) error) (ran bool, err error)
	// Begin and End bracket the started loop: what outlasts one pass (a
	// partitioned membership) lasts from Begin to End, after the last pass.
	Begin()
	End(ctx context.Context)
	// Keeps reports whether the election is kept between the loop's passes
	// right now (Polled), and for how long at most without work: the loop's
	// timer then comes no later.
	Keeps() (bool, time.Duration)
	// Partitions are the partitions this replica holds now (Member), as the
	// membership publishes them: a partition leaves them before another
	// replica can take it. nil for the other elections.
	Partitions() []int
}

// TryRunner is a Guard of the adopter's own (relay.Guard).
type TryRunner interface {
	TryRun(ctx context.Context, key string, fn func(ctx context.Context) error) (ran bool, err error)
}

// NewNone is the election of ClusterLock off, and of Run.
func NewNone(r *Deps) Election { return noElection{r} }

// NewGuarded runs each pass under guard's TryRun.
func NewGuarded(r *Deps, guard TryRunner) Election { return guardElection{r: r, guard: guard} }

// NewPolled is the relay's own guard on its pool, with its idle poll and its
// kept election.
func NewPolled(r *Deps, own *Guard) Election {
	return &polledElection{r: r, own: own}
}

// NewMember is the partitioned election.
func NewMember(r *Deps) Election { return &memberElection{m: newMembership(r)} }

// noElection runs every pass directly: ClusterLock off, or Run.
type noElection struct{ r *Deps }

func (noElection) Waits() bool                                            { return true }
func (noElection) Polls() bool                                            { return false }
func (noElection) Poll(context.Context, Opts) (ran, work bool, err error) { return false, true, nil }
func (noElection) Begin()                                                 {}
func (noElection) Keeps() (bool, time.Duration)                           { return false, 0 }
func (noElection) End(context.Context)                                    {}
func (noElection) Partitions() []int                                      { return nil }
func (noElection) Run(ctx context.Context, _ Opts, job func(context.Context, Term) error) (bool, error) {
	return true, job(ctx, Term{})
}

// guardElection runs the pass under a Guard's TryRun.
type guardElection struct {
	r     *Deps
	guard TryRunner
}

func (guardElection) Waits() bool                                            { return false }
func (guardElection) Polls() bool                                            { return false }
func (guardElection) Poll(context.Context, Opts) (ran, work bool, err error) { return false, true, nil }
func (guardElection) Begin()                                                 {}
func (guardElection) Keeps() (bool, time.Duration)                           { return false, 0 }
func (guardElection) End(context.Context)                                    {}
func (guardElection) Partitions() []int                                      { return nil }

func (e guardElection) Run(ctx context.Context, _ Opts, job func(context.Context, Term) error) (bool, error) {
	return e.tryRun(ctx, func(ctx context.Context) error { return job(ctx, Term{}) })
}

// tryRun runs fn under the guard. A Guard of the adopter's own that panics
// is recovered here: the pass fails, the relay goes on.
func (e guardElection) tryRun(ctx context.Context, fn func(ctx context.Context) error) (ran bool, err error) {
	defer func() {
		if p := recover(); p != nil {
			e.r.Logger.LogAttrs(ctx, slog.LevelError, "relay: the election panicked", slog.Any("panic", p), slog.String("stack", string(debug.Stack())))
			err = fmt.Errorf("relay: the election panicked: %v", p)
		}
	}()
	return e.guard.TryRun(store.WithReplica(ctx, e.r.Presence.ID()), e.r.Key, fn)
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
	r   *Deps
	own *Guard

	mu   sync.Mutex
	kept *Held // the election kept between the loop's passes; nil: none
}

// keptIdle is how long, at most, the loop keeps the election without a
// wake-up or a row: the loop's next timer pass comes no later, and lets go
// of it if it finds nothing.
const keptIdle = time.Second

func (*polledElection) Waits() bool       { return false }
func (*polledElection) Begin()            {}
func (*polledElection) Partitions() []int { return nil }

// Polls: the idle poll reads the table, unless an election is kept (its
// pass looks for work itself).
func (e *polledElection) Polls() bool {
	kept, _ := e.Keeps()
	return !kept
}

func (e *polledElection) Keeps() (bool, time.Duration) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.kept != nil, keptIdle
}

// take takes the kept election out, if there is one: the pass that runs on
// it, or the loop's end, lets go of it or keeps it again.
func (e *polledElection) take() *Held {
	e.mu.Lock()
	defer e.mu.Unlock()
	h := e.kept
	e.kept = nil
	return h
}

// errLockNotFreeYet is the failure of a pass that found the election taken
// just after this relay lost it (Opts.afterLoss), or let go of a kept one
// it no longer trusted: most likely its own old session's lock, which the
// server frees only as that backend exits (or a server going down that still
// answers). Coalescing then would make a standby of this replica, leaving
// the next wake-ups to a holder that may be gone; the loop backs off and
// elects again.
var errLockNotFreeYet = fmt.Errorf("%w: the election's last session ended, and its lock was not free yet; electing again at the next pass", lease.ErrLost)

func (e *polledElection) Poll(ctx context.Context, o Opts) (ran, work bool, err error) {
	if kept, _ := e.Keeps(); kept {
		return true, true, nil // the kept election's pass looks for work itself
	}
	r := e.r
	pctx, cancel := context.WithTimeout(ctx, session.LockTimeout)
	defer cancel()
	var readOnly, won bool
	// On the relay's own session (session.go) when it has one: no pooled
	// connection to take, and so no ping of pgxpool's before it.
	err = o.Own.Do(pctx, func(ctx context.Context, conn *pgx.Conn, pid uint32) error {
		var got uint32
		var err error
		readOnly, won, work, got, err = r.Statements.Poll(ctx, conn, r.Presence.Mark(), r.MaxAttempts, o.Types, r.Key)
		if err == nil && got != pid {
			err = session.ErrPresenceMoved
		}
		return err
	})
	if errors.Is(err, session.ErrNoSession) {
		var c *pgxpool.Conn
		if c, err = store.Acquire(pctx, r.Pool, "poll for work"); err != nil {
			return false, false, err
		}
		readOnly, won, work, _, err = r.Statements.Poll(pctx, c, "", r.MaxAttempts, o.Types, r.Key)
		c.Release()
	}
	switch {
	case err != nil:
		return false, false, fmt.Errorf("relay: poll %s for work: %w", r.Table, err)
	case readOnly:
		return false, false, fmt.Errorf("%w: not electing %q on it: a lock taken on a standby excludes nobody on the primary", store.ErrReadOnly, r.Key)
	case !won && o.AfterLoss:
		return false, false, errLockNotFreeYet
	case !won:
		return false, false, nil // coalesced
	}
	return true, work, nil
}

// Run runs job on the kept election, or on one it wins now, and keeps it
// afterwards when o.Keep says the loop goes on with work arriving.
func (e *polledElection) Run(ctx context.Context, o Opts, job func(context.Context, Term) error) (ran bool, err error) {
	r := e.r
	h := e.take()
	lost := false
	if h != nil && !h.Usable() {
		// Frozen past the lease, or the session lost between passes: let go
		// (the server may have freed the lock already) and elect anew.
		err := h.Release(ctx, h.w.lease.Valid(time.Now()))
		r.Logger.LogAttrs(ctx, slog.LevelWarn, "relay: the election kept since the last pass is no longer trusted; electing again",
			slog.String("key", r.Key), slog.Any("error", err))
		h, lost = nil, true
	}
	if h == nil {
		var err error
		h, err = e.own.Elect(store.WithReplica(ctx, r.Presence.ID()), r.Key)
		switch {
		case err != nil:
			return false, err
		case h == nil && (lost || o.AfterLoss):
			// Most likely the lock of the session just ended, which the
			// server frees as its backend exits: fail rather than coalesce,
			// so that this replica does not become a standby that leaves the
			// next wake-ups to a holder that may be gone.
			return false, errLockNotFreeYet
		case h == nil:
			return false, nil
		}
	}
	keep := false
	defer func() { // also when the job panics: the panic goes on once the lock is let go of
		if keep {
			e.mu.Lock()
			e.kept = h
			e.mu.Unlock()
			return
		}
		err = h.Release(ctx, err)
	}()
	err = h.Run(ctx, func(ctx context.Context) error { return job(ctx, Term{}) })
	keep = o.Keep != nil && o.Keep()
	return true, err
}

func (e *polledElection) End(ctx context.Context) {
	h := e.take()
	if h == nil {
		return
	}
	if err := h.Release(ctx, nil); err != nil {
		e.r.Logger.LogAttrs(ctx, slog.LevelWarn, "relay: stop: letting go of the kept election", slog.String("key", e.r.Key), slog.Any("error", err))
	}
}

// memberElection is the partitioned election (partitions.go): a pass runs
// for the partitions this replica holds. While the loop runs, the membership
// lasts between passes; otherwise each pass joins and leaves.
type memberElection struct{ m *membership }

func (memberElection) Waits() bool                  { return false }
func (memberElection) Polls() bool                  { return false }
func (memberElection) Keeps() (bool, time.Duration) { return false, 0 }
func (e *memberElection) Partitions() []int         { return e.m.partitions() }

// Poll is idleCheck: after an idle pass that rebalanced, the next timer pass
// looks for work on the relay's own session and is over when it finds none.
func (e *memberElection) Poll(ctx context.Context, o Opts) (ran, work bool, err error) {
	if e.m.idleCheck(ctx, o.Own) {
		return false, true, nil
	}
	return true, false, nil
}

func (e *memberElection) Begin() {
	e.m.turn.Lock()
	defer e.m.turn.Unlock()
	e.m.stay = true
}

func (e *memberElection) End(ctx context.Context) {
	e.m.turn.Lock()
	defer e.m.turn.Unlock()
	e.m.stay = false
	e.m.leave(ctx)
}

func (e *memberElection) Run(ctx context.Context, o Opts, job func(context.Context, Term) error) (ran bool, err error) {
	m := e.m
	m.turn.Lock()
	defer m.turn.Unlock()
	// Partitioned passes drain for at most Interval, so that the member
	// rebalances at least that often.
	ran, err = m.pass(ctx, o.Woken, func(ctx context.Context, parts []int) error {
		return job(ctx, Term{Parts: parts, DrainFor: m.r.Interval})
	})
	if !m.stay {
		m.leave(ctx)
	}
	return ran, err
}
