package schedule

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/xadm/relay/internal/store"
)

// This file is the Scheduler (relay.Scheduler is its public face): its jobs,
// each job's loop, Start and the bounded Stop (occurrence.go has one
// occurrence).

// toleranceDefault is the default of Config.Tolerance.
const toleranceDefault = 10 * time.Second

// toleranceMin is the least Tolerance New accepts.
const toleranceMin = time.Second

// Guard runs fn only while this process holds the election for key
// (relay.Guard, relay.PostgresGuard). It reports false, without running fn,
// when another session holds it.
type Guard interface {
	TryRun(ctx context.Context, key string, fn func(ctx context.Context) error) (ran bool, err error)
}

// Config is relay.SchedulerConfig's settings. The zero value is UTC and a
// tolerance of 10s.
type Config struct {
	Location  *time.Location // the zone cron specs are read in; nil: UTC
	Tolerance time.Duration  // the occurrence's window; 0: 10s, else at least 1s
}

// Deps is what a Scheduler works with.
type Deps struct {
	// Guard elects the replica that runs each occurrence.
	Guard Guard
	// Foreign says Guard is the adopter's own: the scheduler cannot end its
	// sessions, and its logs and Stop's error say so.
	Foreign bool
	// DB is the database whose clock decides each occurrence's window: a
	// pool of at least 2 connections, one for the lock and one for the clock.
	DB store.Querier
	// Logger receives the scheduler's logs as they are (the caller adds its
	// component). nil: slog.Default.
	Logger *slog.Logger
}

// Scheduler runs jobs on cron specs under the guard, each occurrence on one
// replica, once (doc.go).
type Scheduler struct {
	guard     Guard
	db        store.Querier
	location  *time.Location
	tolerance time.Duration
	logger    *slog.Logger

	foreignGuard bool // the guard is SchedulerConfig.Guard: the scheduler cannot end its sessions

	mu   sync.Mutex
	jobs []*scheduledJob
	keys map[string]bool
	run  *schedulerRun // nil until Start
}

// schedulerRun is one Start to Stop.
type schedulerRun struct {
	cancel context.CancelFunc // hard stop: cancels the jobs in flight
	halt   chan struct{}      // closed on Stop: no new occurrence
	halted sync.Once
	done   chan struct{} // closed when every loop and run has returned

	mu        sync.Mutex
	inFlight  map[*inFlight]bool // the occurrences whose guard has not returned
	abandoned []string           // the keys of the jobs abandoned so far
}

// inFlight is one occurrence in the guard's hands.
type inFlight struct {
	key string
	at  time.Time
}

func (r *schedulerRun) stop() { r.halted.Do(func() { close(r.halt) }) }

func (r *schedulerRun) enter(o *inFlight) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.inFlight[o] = true
}

func (r *schedulerRun) leave(o *inFlight) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.inFlight, o)
}

func (r *schedulerRun) abandon(key string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.abandoned = append(r.abandoned, key)
}

// stuck lists the occurrences whose guard has not returned, and the jobs
// abandoned.
func (r *schedulerRun) stuck() (guards, abandoned []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for o := range r.inFlight {
		guards = append(guards, o.key+"@"+o.at.UTC().Format(time.RFC3339))
	}
	slices.Sort(guards)
	return guards, slices.Clone(r.abandoned)
}

// Timings of a hard stop.
const (
	// jobGrace is how long a job whose context ended may take to return
	// before the scheduler abandons it.
	jobGrace = 250 * time.Millisecond
	// stopReleaseBound is how long Stop waits, once it has cancelled the jobs
	// and their grace has passed, for the guards to release the locks of the
	// jobs abandoned: the default guard ends the lock's session and waits for
	// the server to drop the lock (internal/election) within it.
	stopReleaseBound = 4 * time.Second
)

// scheduledJob is one Add.
type scheduledJob struct {
	key      string
	spec     string
	schedule cron.Schedule
	fn       func(ctx context.Context) error
	running  atomic.Bool // an occurrence of it runs in this process
}

// New returns a scheduler with no jobs. It refuses a Tolerance below 1s, other
// than 0.
func New(cfg Config, d Deps) (*Scheduler, error) {
	if cfg.Tolerance != 0 && cfg.Tolerance < toleranceMin {
		return nil, fmt.Errorf("relay: SchedulerConfig.Tolerance must be 0 (the default, %s) or at least %s, got %s: "+
			"a replica's timer and lock take time, and an occurrence no replica starts within it is skipped",
			toleranceDefault, toleranceMin, cfg.Tolerance)
	}
	if d.Guard == nil || d.DB == nil {
		return nil, errors.New("relay: scheduler: a guard and a database are needed")
	}
	s := &Scheduler{
		guard:     d.Guard,
		db:        d.DB,
		location:  cfg.Location,
		tolerance: cfg.Tolerance,
		logger:    d.Logger,
		keys:      make(map[string]bool),

		foreignGuard: d.Foreign,
	}
	if s.location == nil {
		s.location = time.UTC
	}
	if s.tolerance == 0 {
		s.tolerance = toleranceDefault
	}
	if s.logger == nil {
		s.logger = slog.Default()
	}
	return s, nil
}

// Add schedules job under key on spec (relay.Scheduler.Add).
func (s *Scheduler) Add(key, spec string, job func(ctx context.Context) error) error {
	if strings.TrimSpace(key) == "" {
		return errors.New("relay: Scheduler.Add: key must not be empty: it names the job's lock")
	}
	schedule, err := parseSpec(spec)
	if err != nil {
		return fmt.Errorf("relay: Scheduler.Add %q: spec %q: %w", key, spec, err)
	}
	if schedule.Next(time.Now().In(s.location)).IsZero() { // cron gives up after five years
		return fmt.Errorf("relay: Scheduler.Add %q: spec %q never fires", key, spec)
	}
	if job == nil {
		return fmt.Errorf("relay: Scheduler.Add %q: job must not be nil", key)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.run != nil {
		return fmt.Errorf("relay: Scheduler.Add %q: the scheduler is started; add every job before Start", key)
	}
	if s.keys[key] {
		return fmt.Errorf("relay: Scheduler.Add: key %q is already added: each job needs its own key", key)
	}
	s.keys[key] = true
	s.jobs = append(s.jobs, &scheduledJob{key: key, spec: spec, schedule: schedule, fn: job})
	return nil
}

// parseSpec parses spec with cron's standard parser, and aligns @every.
func parseSpec(spec string) (schedule cron.Schedule, err error) {
	// cron v3.0.1 panics on "CRON_TZ=<zone>" with nothing after it.
	defer func() {
		if p := recover(); p != nil {
			schedule, err = nil, fmt.Errorf("not a cron spec: %v", p)
		}
	}()
	schedule, err = cron.ParseStandard(spec)
	if err != nil {
		return nil, err
	}
	if d, ok := schedule.(cron.ConstantDelaySchedule); ok {
		return alignedEvery(d.Delay), nil
	}
	return schedule, nil
}

// alignedEvery is @every d on multiples of d since the zero time, the same on
// every replica, where cron's own @every counts from each replica's start.
type alignedEvery time.Duration

func (e alignedEvery) Next(t time.Time) time.Time {
	return t.Truncate(time.Duration(e)).Add(time.Duration(e))
}

// Start starts the scheduler in the background (relay.Scheduler.Start).
func (s *Scheduler) Start(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.run != nil {
		select {
		case <-s.run.done:
		default:
			return errors.New("relay: Scheduler.Start: already started; Stop it first")
		}
	}
	runCtx, cancel := context.WithCancel(ctx)
	r := &schedulerRun{cancel: cancel, halt: make(chan struct{}), done: make(chan struct{}), inFlight: make(map[*inFlight]bool)}
	var wg sync.WaitGroup
	for _, j := range s.jobs {
		wg.Go(func() { s.loop(runCtx, r, &wg, j) })
	}
	go func() {
		select {
		case <-runCtx.Done():
		case <-r.halt:
		}
		wg.Wait() // the loops and the runs in flight
		cancel()
		close(r.done)
	}()
	s.run = r
	keys := make([]string, len(s.jobs))
	for i, j := range s.jobs {
		keys[i] = j.key
	}
	s.logger.LogAttrs(ctx, slog.LevelInfo, "relay: scheduler: started", slog.Any("jobs", keys),
		slog.String("location", s.location.String()), slog.Duration("tolerance", s.tolerance))
	return nil
}

// Stop stops the scheduler, bounded by ctx (relay.Scheduler.Stop): it waits
// for the runs in flight and their windows; once ctx ends it cancels the jobs,
// abandons those that ignore it after jobGrace, and waits stopReleaseBound
// at most for the guards to let go of their locks.
func (s *Scheduler) Stop(ctx context.Context) error {
	s.mu.Lock()
	r := s.run
	s.mu.Unlock()
	if r == nil {
		return nil
	}
	r.stop()
	select {
	case <-r.done:
		return nil
	case <-ctx.Done():
	}
	r.cancel()
	bound := time.NewTimer(jobGrace + stopReleaseBound)
	defer bound.Stop()
	select {
	case <-r.done:
	case <-bound.C:
	}
	err := fmt.Errorf("relay: Scheduler.Stop: %w", ctx.Err())
	guards, abandoned := r.stuck()
	if len(abandoned) > 0 {
		err = fmt.Errorf("%w; abandoned the jobs %q, which ignored their context", err, abandoned)
		if s.foreignGuard && len(guards) == 0 {
			err = fmt.Errorf("%w; SchedulerConfig.Guard is the adopter's own: whether it freed their locks is up to it", err)
		}
	}
	if len(guards) > 0 {
		s.logger.LogAttrs(ctx, slog.LevelError, "relay: scheduler: Stop returns while the guard still holds occurrences: "+
			"it did not return after their jobs were cancelled and abandoned; their locks may still be held",
			slog.Any("occurrences", guards), slog.Bool("foreign_guard", s.foreignGuard),
			slog.String("hint", "a Guard of SchedulerConfig.Guard cannot be forced: it should end the lock's session "+
				"when the job's function returns ErrJobAbandoned"))
		err = fmt.Errorf("%w; the guard did not return for %q, whose locks may still be held (a foreign Guard cannot be forced)", err, guards)
	}
	return err
}

// loop waits for each occurrence of j and starts its run, unless the previous
// run is still going: then it logs the occurrence as skipped.
func (s *Scheduler) loop(ctx context.Context, r *schedulerRun, wg *sync.WaitGroup, j *scheduledJob) {
	halt := r.halt
	next := s.next(j, time.Now())
	timer := time.NewTimer(time.Until(next))
	defer timer.Stop()
	for {
		if next.IsZero() {
			s.logger.LogAttrs(ctx, slog.LevelWarn, "relay: scheduler: the job's spec fires no more",
				slog.String("key", j.key), slog.String("spec", j.spec))
			return
		}
		select {
		case <-halt:
			return
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		select {
		case <-halt: // Stop and the timer together: Stop wins
			return
		default:
		}
		// A wall clock set back makes the timer early: wait the rest.
		if early := time.Until(next); early > 0 {
			timer.Reset(early)
			continue
		}
		at := next
		if j.running.CompareAndSwap(false, true) {
			wg.Go(func() {
				if !s.occurrence(ctx, r, j, at) {
					j.running.Store(false)
				} // else the abandoned job's goroutine does, when it returns
			})
		} else {
			s.logger.LogAttrs(ctx, slog.LevelWarn, "relay: scheduler: occurrence skipped: the previous run is still going",
				slog.String("key", j.key), slog.Time("scheduled_at", at))
		}
		next = s.next(j, time.Now())
		timer.Reset(time.Until(next))
	}
}

// next is j's first occurrence after t, read in the scheduler's Location;
// zero if it never fires again.
func (s *Scheduler) next(j *scheduledJob, t time.Time) time.Time {
	return j.schedule.Next(t.In(s.location))
}
