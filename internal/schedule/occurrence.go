package schedule

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"sync/atomic"
	"time"

	"github.com/xadm/relay/internal/election"
	"github.com/xadm/relay/internal/lease"
	"github.com/xadm/relay/internal/store"
)

// This file is one occurrence of a scheduled job: elected under the guard,
// watched for a runner that vanishes mid-run, run under a recover, and its
// lock held until the occurrence's window has passed (scheduler.go has the
// Scheduler, its loop and its bounded Stop).

// occurrence runs the occurrence at of j under the guard, and logs how it
// went. It reports whether the job was abandoned, still running.
func (s *Scheduler) occurrence(ctx context.Context, r *schedulerRun, j *scheduledJob, at time.Time) (abandoned bool) {
	o := &inFlight{key: j.key, at: at}
	r.enter(o)
	defer r.leave(o)
	attrs := []slog.Attr{slog.String("key", j.key), slog.Time("scheduled_at", at)}
	// The guard may be the adopter's own: a panic in it is logged, and the
	// scheduler goes on.
	defer func() {
		if p := recover(); p != nil {
			s.logger.LogAttrs(ctx, slog.LevelError, "relay: scheduler: the guard panicked",
				append(attrs, slog.Any("panic", p), slog.String("stack", string(debug.Stack())))...)
		}
	}()
	start := time.Now()
	var ran, late, watching bool
	fn := func(ctx context.Context) error {
		var err error
		ran, late, err = s.elected(ctx, j, at, watching)
		if errors.Is(err, election.ErrJobAbandoned) {
			abandoned = true
			r.abandon(j.key)
		}
		return err
	}
	elected, err := s.guard.TryRun(ctx, j.key, fn)
	if !elected && err == nil {
		watching = true
		elected, err = s.watch(ctx, r.halt, j, at, fn)
	}
	attrs = append(attrs, slog.Duration("duration", time.Since(start)))
	switch {
	case abandoned:
		// logged by runJob
	case err != nil && ctx.Err() != nil && errors.Is(err, context.Canceled):
		s.logger.LogAttrs(ctx, slog.LevelInfo, "relay: scheduler: job cancelled by a hard stop", attrs...)
	case errors.As(err, new(*jobPanic)):
		var p *jobPanic
		errors.As(err, &p)
		s.logger.LogAttrs(ctx, slog.LevelError, "relay: scheduler: job panicked",
			append(attrs, slog.Any("panic", p.value), slog.String("stack", p.stack))...)
	case err != nil && !ran && errors.Is(err, store.ErrTransactionPooling):
		// the guard logged it at Error once, when it checked the pool
		s.logger.LogAttrs(ctx, slog.LevelDebug, "relay: scheduler: occurrence not run", append(attrs, slog.Any("error", err))...)
	case err != nil && !ran:
		s.logger.LogAttrs(ctx, slog.LevelError, "relay: scheduler: occurrence not run", append(attrs, slog.Any("error", err))...)
	case err != nil:
		s.logger.LogAttrs(ctx, slog.LevelError, "relay: scheduler: job failed", append(attrs, slog.Any("error", err))...)
	case !elected:
		s.logger.LogAttrs(ctx, slog.LevelDebug, "relay: scheduler: another session holds the job's lock; occurrence skipped", attrs...)
	case late:
		// logged by elected, with how late
	default:
		s.logger.LogAttrs(ctx, slog.LevelDebug, "relay: scheduler: job done", attrs...)
	}
	return abandoned
}

// watch is a replica that did not get the job's lock at the occurrence's
// time: it tries the lock again, every eighth of the window (50ms to 1s),
// until the window has passed, or Stop. The runner holds the lock until the
// window has passed; if it comes free before, the runner vanished (its lock's
// session was terminated, its process died), and the replica whose try wins
// runs the occurrence again, itself holding the lock until the window has
// passed: once more per death, never after the window. A try that wins after
// the window finds the occurrence over, as in elected. fn is the occurrence
// under the lock; watch reports what the winning TryRun did.
func (s *Scheduler) watch(ctx context.Context, halt <-chan struct{}, j *scheduledJob, at time.Time, fn func(context.Context) error) (bool, error) {
	window := s.window(j, at)
	deadline := at.Add(window)
	every := min(max(window/8, 50*time.Millisecond), time.Second)
	t := time.NewTimer(every)
	defer t.Stop()
	for {
		select {
		case <-halt:
			return false, nil
		case <-ctx.Done():
			return false, nil
		case <-t.C:
		}
		if !time.Now().Before(deadline) { // the local clock: the watch never reaches the next occurrence
			return false, nil
		}
		if elected, err := s.guard.TryRun(ctx, j.key, fn); elected || err != nil {
			return elected, err
		}
		t.Reset(every)
	}
}

// elected is the occurrence under the job's lock: the window's check on the
// database's clock, the job, and the hold until the window has passed. It
// reports whether the job ran, and whether the occurrence was already over.
// watching says the lock was won by watch, after a first try found it held:
// within the window, the runner vanished.
func (s *Scheduler) elected(ctx context.Context, j *scheduledJob, at time.Time, watching bool) (ran, late bool, err error) {
	deadline := at.Add(s.window(j, at))
	now, err := store.DatabaseNow(ctx, s.db)
	if err != nil {
		return false, false, fmt.Errorf("relay: scheduler: read the database's clock: %w", err)
	}
	switch {
	case !now.Before(deadline) && watching:
		return false, true, nil // the runner held the lock to the window's end: the usual case
	case watching:
		s.logger.LogAttrs(ctx, slog.LevelWarn, "relay: scheduler: the occurrence's runner vanished: the job's lock came free "+
			"within the occurrence's window; running it again here",
			slog.String("key", j.key), slog.Time("scheduled_at", at), slog.Duration("late", now.Sub(at)),
			slog.Duration("window", deadline.Sub(at)),
			slog.String("hint", "the replica that ran it lost the lock's session (pg_terminate_backend, a failover, "+
				"its process killed) or stopped before the window's end, or another session held the key at the scheduled time "+
				"and let it go; the job may have run in part, or whole"))
	case !now.Before(deadline):
		s.logger.LogAttrs(ctx, slog.LevelWarn, "relay: scheduler: occurrence skipped: started too late, past its window",
			slog.String("key", j.key), slog.Time("scheduled_at", at), slog.Duration("late", now.Sub(at)),
			slog.Duration("window", deadline.Sub(at)),
			slog.String("hint", "another replica may have run it; raise SchedulerConfig.Tolerance if every replica is this late"))
		return false, true, nil
	}
	if err = s.runJob(ctx, j, at); errors.Is(err, election.ErrJobAbandoned) {
		return true, false, err
	}
	s.hold(ctx, j, at, s.holdUntil(ctx, j, at, deadline))
	return true, false, err
}

// runJob calls the job on a goroutine of its own, so that a job that ignores its
// ctx cannot hold the occurrence, its lock and Stop forever: once ctx has
// ended, the job has jobGrace to return; then run logs it, leaves the
// goroutine to it and returns ErrJobAbandoned, on which the guard releases the
// lock without waiting for the job. Until the abandoned job returns, this
// process starts none of its occurrences (it still runs).
func (s *Scheduler) runJob(ctx context.Context, j *scheduledJob, at time.Time) error {
	const (
		running = iota
		returned
		abandoned
	)
	var state atomic.Int32
	done := make(chan error, 1)
	start := time.Now()
	go func() {
		err := s.call(ctx, j, at)
		if !state.CompareAndSwap(running, returned) {
			j.running.Store(false)
			s.logger.LogAttrs(context.WithoutCancel(ctx), slog.LevelWarn, "relay: scheduler: an abandoned job returned at last",
				slog.String("key", j.key), slog.Time("scheduled_at", at), slog.Duration("running_for", time.Since(start)),
				slog.Any("error", err))
		}
		done <- err
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	grace := time.NewTimer(jobGrace)
	defer grace.Stop()
	select {
	case err := <-done:
		return err
	case <-grace.C:
	}
	if !state.CompareAndSwap(running, abandoned) {
		return <-done // it returned just now
	}
	hint := "the job's lock is released by closing its session; another replica may run its next occurrence while it still runs here"
	if s.foreignGuard {
		hint = "SchedulerConfig.Guard is the adopter's own: it got ErrJobAbandoned and should end the lock's session; the scheduler cannot force it"
	}
	s.logger.LogAttrs(ctx, slog.LevelError, "relay: scheduler: the job did not return after its context ended; abandoned",
		slog.String("key", j.key), slog.Time("scheduled_at", at), slog.Duration("running_for", time.Since(start)),
		slog.String("cause", context.Cause(ctx).Error()), slog.String("hint", hint))
	return fmt.Errorf("%w: key %q, scheduled at %s", election.ErrJobAbandoned, j.key, at.Format(time.RFC3339))
}

// holdUntil is how long the lock is held after a run of occurrence at:
// deadline, or, when the run outlasted the next occurrences, the end of the
// last one's window, so that a replica whose timer fired late for one of them
// and finds the lock free finds that occurrence over too.
func (s *Scheduler) holdUntil(ctx context.Context, j *scheduledJob, at, deadline time.Time) time.Time {
	now, err := store.DatabaseNow(ctx, s.db)
	if err != nil {
		now = time.Now()
	}
	for o := s.next(j, at); !o.IsZero() && !o.After(now); o = s.next(j, o) {
		if end := o.Add(s.window(j, o)); end.After(deadline) {
			deadline = end
		}
	}
	return deadline
}

// window is how long after at the occurrence may start: the tolerance, capped
// at half the gap to the next occurrence.
func (s *Scheduler) window(j *scheduledJob, at time.Time) time.Duration {
	w := s.tolerance
	if next := s.next(j, at); !next.IsZero() {
		w = min(w, next.Sub(at)/2)
	}
	return w
}

// call runs the job, turning a panic into a *jobPanic error.
func (s *Scheduler) call(ctx context.Context, j *scheduledJob, at time.Time) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = &jobPanic{value: p, stack: string(debug.Stack())}
		}
	}()
	ctx = context.WithValue(ctx, scheduledAtKey{}, at)
	ctx = context.WithValue(ctx, schedulerLoggerKey{}, s.logger.With(slog.String("key", j.key)))
	return j.fn(ctx)
}

// hold returns once the database's clock has passed deadline, so that the
// guard's unlock comes after it, or when ctx ends (a hard stop, a lost
// election). If the clock cannot be read, it waits on the local clock.
func (s *Scheduler) hold(ctx context.Context, j *scheduledJob, at, deadline time.Time) {
	for {
		now, err := store.DatabaseNow(ctx, s.db)
		if err != nil {
			now = time.Now()
		}
		wait := deadline.Sub(now)
		if wait <= 0 {
			return
		}
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			if cause := context.Cause(ctx); errors.Is(cause, lease.ErrLost) {
				s.logger.LogAttrs(ctx, slog.LevelWarn, "relay: scheduler: the election was lost within the occurrence's window; "+
					"another replica runs it again if it notices within the window", slog.String("key", j.key), slog.Time("scheduled_at", at))
			}
			return
		}
		if err != nil {
			return
		}
	}
}

// jobPanic is a job's panic, recovered with its stack.
type jobPanic struct {
	value any
	stack string
}

func (p *jobPanic) Error() string { return fmt.Sprintf("relay: scheduler: job panicked: %v", p.value) }

// The keys of what a job's ctx carries.
type (
	scheduledAtKey     struct{}
	schedulerLoggerKey struct{}
)

// ScheduledAt returns the scheduled time of the occurrence whose job runs
// with ctx (relay.ScheduledAt); false outside a job.
func ScheduledAt(ctx context.Context) (time.Time, bool) {
	t, ok := ctx.Value(scheduledAtKey{}).(time.Time)
	return t, ok
}

// JobLogger returns the scheduler's logger, with the job's key, in a job's
// ctx (relay.RetentionJob logs with it); false outside a job.
func JobLogger(ctx context.Context) (*slog.Logger, bool) {
	l, ok := ctx.Value(schedulerLoggerKey{}).(*slog.Logger)
	return l, ok
}
