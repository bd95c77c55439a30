package loop

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/xadm/relay/internal/election"
	"github.com/xadm/relay/internal/lease"
	"github.com/xadm/relay/internal/pass"
	"github.com/xadm/relay/internal/session"
	"github.com/xadm/relay/internal/wake"
)

// This file is the one scheduling loop: one goroutine per started relay that
// waits on a timer, a wake-up and a stop, and runs the periodic pass. It
// applies the Enabled gate and runs the pass through the slot (passes.go),
// which drains a backlog under one election.

// Timings of the loop.
const (
	// backoffMax caps the delay after failed passes: Interval doubles with
	// each failure in a row up to it (or Interval, if longer).
	backoffMax = 5 * time.Second
	// stopUnwind is how long Stop waits, once its ctx has ended and the sends
	// in flight are cancelled, for the pass to record what it finished and
	// release the election. Past it Stop returns, and what is left finishes
	// in the background within pass.OutcomeTimeout + session.UnlockTimeout.
	stopUnwind = time.Second
	// warmConns is how many pooled connections the first message's path
	// takes (the election's, the select's, a writer's), which warm opens;
	// warmTimeout bounds that.
	warmConns   = 3
	warmTimeout = 2 * time.Second
)

// Loop is one run of the scheduling loop, from Start to Stop.
type Loop struct {
	p         *Passes
	cancel    context.CancelFunc // hard stop: cancels the sends in flight
	halt      chan struct{}      // closed on Stop: no new message, batch or pass
	halted    sync.Once
	wake      chan struct{}       // a pass is wanted now (buffered: wake-ups coalesce)
	listening chan struct{}       // closed when the wake-up listener has returned (at once without one)
	attempted chan struct{}       // closed once the listener's first LISTEN has succeeded or failed (at once without one)
	done      chan struct{}       // closed when the loop has returned: its last pass unwound
	own       *session.OwnSession // the relay's own session, for the idle poll (internal/session)
	// afterLoss: the last pass lost its election, and this one, at once,
	// elects again; only the loop's goroutine reads and writes it.
	afterLoss bool
}

// Listen runs a started relay's wake-up listener until ctx ends, on own,
// calling wakeUp for each wake-up and attempted once its first LISTEN has
// succeeded or failed.
type Listen func(ctx context.Context, own *session.OwnSession, wakeUp, attempted func())

// Start starts the loop on ctx, which cancel ends, and returns at once: the
// listener (with Enabled; it carries presence even without WakeOnCommit) and
// the loop run in goroutines of their own. The first pass starts once the
// listener has tried its LISTEN.
func (p *Passes) Start(ctx context.Context, cancel context.CancelFunc, listen Listen) *Loop {
	l := &Loop{p: p, cancel: cancel, halt: make(chan struct{}), wake: make(chan struct{}, 1),
		listening: make(chan struct{}), attempted: make(chan struct{}), done: make(chan struct{}), own: session.NewOwnSession()}
	if p.d.Enabled {
		go func() {
			defer close(l.listening)
			listen(ctx, l.own, l.wakeUp, func() { close(l.attempted) })
		}()
	} else {
		close(l.listening)
		close(l.attempted)
	}
	go l.run(ctx)
	return l
}

// Done is closed when the loop has returned: its last pass unwound.
func (l *Loop) Done() <-chan struct{} { return l.done }

// Own is the relay's own session while the loop runs.
func (l *Loop) Own() *session.OwnSession { return l.own }

// Halt stops the loop gracefully: no new pass starts, and the pass in flight
// starts no new message or batch. A second Halt is harmless.
func (l *Loop) Halt() { l.halted.Do(func() { close(l.halt) }) }

// Wait waits for the halted loop to return, or until ctx ends: then it
// cancels the sends still in flight, gives the pass stopUnwind more to record
// what it finished and release the election, and returns ctx's error.
func (l *Loop) Wait(ctx context.Context) error {
	select {
	case <-l.done:
		return nil
	case <-ctx.Done():
	}
	l.cancel()
	t := time.NewTimer(stopUnwind)
	defer t.Stop()
	select {
	case <-l.done:
	case <-t.C:
		l.p.d.Logger.LogAttrs(context.Background(), slog.LevelWarn,
			"relay: stop: returning while the last pass still unwinds; it records what it finished and releases the election in the background",
			slog.String("within", (pass.OutcomeTimeout+session.UnlockTimeout).Round(time.Microsecond).String()))
	}
	return fmt.Errorf("relay: stop: %w", ctx.Err())
}

// wakeUp asks for a pass now; wake-ups that come while one is pending merge.
func (l *Loop) wakeUp() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// run is the loop: wait for the timer, a wake-up or a stop; pass; schedule the
// next pass Interval after this one ended, at once while a backlog remains,
// soon after a woken pass that delivered (for rows whose producers did not
// notify), or later, doubling, while passes fail.
//
// A replica whose last pass coalesced is a standby: another holds the
// election and is awake to the same notifications, so the standby leaves
// them to it and only polls, once every Interval: one statement.
func (l *Loop) run(ctx context.Context) {
	defer close(l.done)
	d := l.p.d
	// What the election keeps between passes (a partitioned membership)
	// lasts while the loop runs; the loop's end lets go of it, after its last pass.
	d.Election.Begin()
	defer d.Election.End(ctx)
	defer func() { <-l.listening }()
	defer l.cancel()
	// The first pass starts once the listener is listening (or could not):
	// a row committed after its select is then always notified.
	select {
	case <-ctx.Done():
		return
	case <-l.halt:
		return
	case <-l.attempted:
	}
	if d.Enabled {
		l.warm(ctx)
	}
	timer := time.NewTimer(0)
	defer timer.Stop()
	standby, followUp := false, false
	for {
		woken := false
		select {
		case <-ctx.Done():
			return
		case <-l.halt:
			return
		case <-timer.C:
		case <-l.wake:
			if standby {
				continue
			}
			woken = true
		}
		if !d.Enabled {
			timer.Stop()
			continue // only a stop ends the wait now
		}
		next, coalesced := l.periodic(ctx, woken || followUp)
		standby, followUp = coalesced, next == wake.FollowUp
		timer.Reset(next)
	}
}

// periodic runs the periodic pass, recovering from a panic, and returns the
// delay until the next one and whether it coalesced. A pass the timer
// started begins with the idle poll; one a wake-up started goes straight to
// the election. A woken pass that delivered, or a follow-up of one that
// delivered, is followed up wake.FollowUp later: Enqueues that came densely
// did not all notify (internal/wake), and the follow-ups find their rows until one
// finds nothing. A pass that lost its election is followed at once, once.
func (l *Loop) periodic(ctx context.Context, woken bool) (next time.Duration, coalesced bool) {
	d := l.p.d
	next = d.Interval
	defer func() {
		if p := recover(); p != nil {
			d.Logger.LogAttrs(ctx, slog.LevelError, "relay: a pass panicked; the loop goes on",
				slog.Any("panic", p), slog.String("stack", string(debug.Stack())))
		}
	}()
	kind := Timed
	if woken {
		kind = Elected
	}
	// The election is kept for the next pass while work keeps arriving: not
	// after a failure, a backlog cut at drainMax, a stop, or a quiet
	// Interval's pass that found nothing.
	keep := func(res Result) bool {
		select {
		case <-l.halt:
			return false
		default:
		}
		return res.Err == nil && !res.Backlog && (woken || res.Woken || res.Processed() > 0)
	}
	res := l.p.Pass(ctx, kind, Opts{
		Pass:     pass.Opts{Halt: l.halt, Drain: true, Wake: l.wake},
		Election: election.Opts{Own: l.own, Woken: woken, AfterLoss: l.afterLoss},
		Keep:     keep,
	})
	l.afterLoss = false
	switch n := d.Failing(); {
	case res.Backlog && res.Err == nil:
		next = 0
	case (woken || res.Woken) && res.Processed() > 0 && res.Err == nil:
		next = wake.FollowUp
	case n <= 1 && errors.Is(res.Err, lease.ErrLost):
		// The election was lost (its session ended, its lease ran out), not
		// the database (a loss does not count as a failure in a row): elect
		// again at once, so that the rows this pass took from a wake-up do
		// not wait an Interval. A loss after a failure backs off as any other.
		next, l.afterLoss = 0, true
	case n > 0:
		next = min(d.Interval<<min(n-1, 16), max(d.Interval, backoffMax))
	}
	if kept, idle := d.Election.Keeps(); kept {
		next = min(next, idle) // the pass that lets go of it, if nothing comes
	}
	return next, res.Coalesced()
}

// warm opens, before the first pass, the pooled connections the first
// message's path takes (the election's, the select's and one writer's), as
// far as the pool has room for them now, and gives them back at once: the
// pool keeps them idle. Without it, an idle relay's polls run on its own
// session and open none, so the first pass after the start opened them on its
// first message's path, a new server backend each: the first message of a
// quiet machine took 37 ms from its commit instead of 19 (medians,
// docs/performance.md). What cannot be opened now (a full pool, the database
// away) is left to that pass, as before; a stop cuts it short.
func (l *Loop) warm(ctx context.Context) {
	pool := l.p.d.Pool
	st := pool.Stat()
	n := min(warmConns, int(st.MaxConns()-st.AcquiredConns()))
	if n <= 0 {
		return
	}
	wctx, cancel := context.WithTimeout(ctx, warmTimeout)
	defer cancel()
	go func() {
		select {
		case <-l.halt:
			cancel()
		case <-wctx.Done():
		}
	}()
	// Asked for at once, so that each is a connection of its own: one given
	// back before the next was asked for would be handed out again.
	conns := make(chan *pgxpool.Conn, n)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			if c, err := pool.Acquire(wctx); err == nil {
				conns <- c
			}
		})
	}
	wg.Wait()
	close(conns)
	for c := range conns {
		c.Release()
	}
}
