package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/xadm/relay/internal/election"
	"github.com/xadm/relay/internal/schedule"
)

// This file is the scheduler's public face: its machinery, one occurrence
// under the guard and the bounded Stop, is internal/schedule.

// SchedulerConfig configures a [Scheduler]. Its zero value is ready to use:
// every field has a default.
type SchedulerConfig struct {
	// Location is the time zone in which cron specs are read: "0 2 * * *" is
	// 02:00 there, and @daily its midnight. A spec may name its own with a
	// "CRON_TZ=America/Sao_Paulo " prefix. Every replica must read a job's spec
	// in the same zone, or they disagree on its occurrences; that is why the
	// default is not the host's zone, which differs between a container and a
	// laptop. Defaults to UTC.
	Location *time.Location

	// Tolerance is how late, on the database's clock, a replica may still start
	// an occurrence, and so how long the replica that ran it keeps the job's
	// lock past the occurrence's scheduled time, so that no replica starts it
	// again. It absorbs timers that fire late (a loaded machine, a GC pause, a
	// slow connection) and each replica's clock offset from the database's. It
	// is capped, occurrence by occurrence, at half the gap to the next one (so
	// @every 1s allows 500ms). At least 1s; defaults to 10s.
	Tolerance time.Duration

	// Guard elects the replica that runs each occurrence. nil means a
	// [PostgresGuard] on the scheduler's pool.
	Guard Guard

	// Logger receives the scheduler's logs. Defaults to [slog.Default].
	Logger *slog.Logger
}

// Scheduler runs jobs on cron schedules under the election: on N replicas,
// each with its own Scheduler and the same jobs, every occurrence of a job runs
// on one replica, once. Build it with [NewScheduler], [Scheduler.Add] the jobs,
// then [Scheduler.Start] it; [Scheduler.Stop] stops it gracefully.
//
// # Once per occurrence
//
// A try-lock alone does not dedupe occurrences: replica A fires at 02:00:00.000,
// runs a 5ms job and unlocks; replica B's timer fires 40ms later, finds the lock
// free and runs the same occurrence again. So each occurrence has a window, and
// one clock decides it, the database's (clock_timestamp()), not the replicas':
//
//  1. At the occurrence's scheduled time T, each replica tries the job's lock
//     through the [Guard]. Those that do not get it skip the occurrence.
//  2. The replica that gets it reads the database's clock. If it is past
//     T + window, the occurrence is over: it logs how late it was and skips.
//  3. Otherwise it runs the job, then keeps holding the lock until the
//     database's clock has passed T + window (or, after a run that outlasted
//     the next occurrences, the last one's window), and only then unlocks.
//
// A replica that tries while the winner holds the lock fails to get it; one
// that gets it after the unlock finds the database's clock past the window.
// Either way nobody runs T again, however late its timer fired and however far
// the replicas' clocks drift apart. The window is [SchedulerConfig.Tolerance]
// (10s by default), capped at half the gap between T and the next occurrence,
// so the hold ends before the next occurrence is due on the database's clock.
//
// The price is the converse: an occurrence that no replica reaches within its
// window (every replica down, or late, or the lock held elsewhere) is skipped,
// not run late; the next occurrence runs as usual. A job that runs longer than
// its gap holds the lock across the next occurrence, which every replica then
// skips: runs of one job never overlap, in one process or across replicas.
//
// # A runner that vanishes
//
// The replicas that did not get the lock at T keep trying it, every eighth of
// the window (50ms to 1s), until T + window. Since the runner holds it that
// long, a try that wins within the window means the runner vanished: its
// lock's session was terminated (pg_terminate_backend, a failover,
// idle_session_timeout), its process died, or it was stopped with a deadline
// that cut its hold short. That replica logs "the occurrence's runner
// vanished" (WARN, with the key and how late) and runs T again, holding the
// lock until T + window in turn: T runs at most once more per death, and never
// after its window; a runner that dies after the window is not replaced (the
// next occurrence runs as usual). A job that dies mid-run may have done part of
// its work, or all of it (a death during the hold after the job), so a job
// should tolerate a second run, as retention does. The runner that lost its
// lock has its job's ctx cancelled with [ErrElectionLost].
//
// # Keys
//
// A job's key is its lock: the default guard takes
// pg_try_advisory_lock(hashtext(key)), computed by the server, the same lock
// space as the relay's election (hashtext(AppName || '_relay_m2m')). Any session
// holding that lock — a JVM relay, relayctl pause, psql — makes every replica
// skip the job's occurrences while it holds it (one it lets go of within an
// occurrence's window runs then, as after a runner's death). Give each job its own key
// (hashtext is 32 bits: a collision makes two jobs exclude each other, never
// run together), and not the relay's own election key unless delivery should
// pause while the job runs and its window lasts.
type Scheduler struct {
	s *schedule.Scheduler
	_ [0]func() // not comparable, as before its machinery moved out
}

// ErrJobAbandoned is what the function a [Scheduler] hands its [Guard]
// returns when the job did not return within a short grace after its context
// ended (a hard [Scheduler.Stop], a lost election): the scheduler leaves the
// job's goroutine to it and goes on. The job may still be working, so a Guard
// should not wait for it, and should free the lock by ending the lock's
// session. [PostgresGuard] closes the lock's connection (it never goes back to
// the pool) and waits until pg_locks no longer shows the lock. The scheduler
// cannot force a Guard of [SchedulerConfig.Guard]: Stop returns even if it does
// not, and says so.
var ErrJobAbandoned = election.ErrJobAbandoned

// NewScheduler returns a scheduler with no jobs. pool is the database whose
// clock decides each occurrence's window, and, when cfg.Guard is nil, where the
// default [PostgresGuard] takes its locks. Each running occurrence holds one
// connection for its lock (for the job and the rest of its window) while the
// scheduler reads the clock and the job works on others: NewScheduler refuses
// a pool of fewer than 2, and jobs that may run at once need one more each.
func NewScheduler(pool *pgxpool.Pool, cfg SchedulerConfig) (*Scheduler, error) {
	if pool == nil {
		return nil, errors.New("relay: NewScheduler needs a *pgxpool.Pool, got nil: its database's clock decides each occurrence")
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.Default()
	}
	logger = logger.With(slog.String("component", "scheduler"))
	d := schedule.Deps{Guard: cfg.Guard, Foreign: cfg.Guard != nil, DB: pool, Logger: logger}
	if cfg.Guard == nil {
		g := NewPostgresGuard(pool) // builds, connects to nothing
		g.g.SetLogger(logger)
		d.Guard = g
	}
	s, err := schedule.New(schedule.Config{Location: cfg.Location, Tolerance: cfg.Tolerance}, d)
	if err != nil {
		return nil, err
	}
	if n := pool.Config().MaxConns; n < 2 {
		return nil, fmt.Errorf("relay: NewScheduler: the pool allows %d connection; a job's lock holds one while the "+
			"scheduler reads the database's clock on another: set pool_max_conns to at least 2", n)
	}
	return &Scheduler{s: s}, nil
}

// Add schedules job under key on spec, a cron spec read by robfig/cron's
// standard parser: five fields (minute, hour, day of month, month, day of
// week: "30 2 * * *"), or a descriptor (@yearly, @monthly, @weekly, @daily,
// @hourly, or @every with a duration of whole seconds, "@every 5m"), optionally
// prefixed by "CRON_TZ=<zone> ". The occurrences of @every d fall on multiples
// of d since 0001-01-01 UTC (@every 1h on the hour, @every 5m at :00, :05…), not
// from when each replica started, so that replicas agree on them.
//
// key names the job's lock (see "Keys" on [Scheduler]); every replica must add
// the job under the same key and spec. The job's ctx carries its occurrence's
// scheduled time ([ScheduledAt]), and is cancelled when the election is lost
// (with cause [ErrElectionLost]) or when [Scheduler.Stop]'s ctx ends.
//
// Add returns an error, naming the argument, for an empty key, a key already
// added, a spec that does not parse or never fires, and a nil job, and after
// Start.
func (s *Scheduler) Add(key, spec string, job func(ctx context.Context) error) error {
	return s.s.Add(key, spec, job)
}

// Start starts the scheduler in the background and returns at once: each job
// waits for its next occurrence (the first one after Start, never one already
// past). Cancelling ctx stops the scheduler and cancels the jobs in flight;
// [Scheduler.Stop] stops it gracefully. Start returns an error if the scheduler
// is already started.
func (s *Scheduler) Start(ctx context.Context) error { return s.s.Start(ctx) }

// Stop stops the scheduler: no new occurrence starts, and the runs in flight
// finish, each keeping its lock until its window has passed (see "Once per
// occurrence" on [Scheduler]). Stop waits for that, or until ctx ends: then it
// cancels the jobs' contexts and waits for them to return and their locks to
// be released, and returns ctx's error; a window cut short so may let a
// replica whose timer is late run that occurrence again.
//
// Stop is bounded by ctx: a job that has not returned a short grace (250ms)
// after its context was cancelled is abandoned — logged at ERROR with its key,
// its scheduled time and how long it has run — and its goroutine left to it.
// The default guard then releases the job's lock by closing the lock's
// session (never returning it to the pool) and waits until the server has
// dropped the lock, so that another replica can run the job's next
// occurrence; Stop returns within a few seconds of ctx's end whatever the job
// does. A Guard of [SchedulerConfig.Guard] cannot be forced: it gets
// [ErrJobAbandoned] from the job's function; if it has not returned a few
// seconds later, Stop returns anyway, and both its log and its error say which
// job's lock may still be held. Stop without Start, and a second Stop, are
// harmless.
func (s *Scheduler) Stop(ctx context.Context) error {
	if s.s == nil {
		return nil // a zero Scheduler never started
	}
	return s.s.Stop(ctx)
}

// ScheduledAt returns the scheduled time of the occurrence whose job runs with
// ctx, in the scheduler's [SchedulerConfig.Location]; false outside a job of a
// [Scheduler]. Replicas agree on it: it names the occurrence.
func ScheduledAt(ctx context.Context) (time.Time, bool) { return schedule.ScheduledAt(ctx) }

// RetentionJob returns a job for [Scheduler.Add] that purges the SENT rows of
// admin's table older than age, with [Admin.PurgeSent]: oldest first, one
// short statement per chunk of at most [PurgeChunk] rows, so producers'
// inserts and the relays' passes never wait on it (it deletes only SENT rows,
// which no pass touches again, and holds each chunk's row locks for one
// statement). It logs how many rows it deleted. age must not be negative: the
// job fails, every time, if it is.
//
// It purges the Admin's scope ([Admin.Scope]): while no relay of the app is
// live and the Admin was given no types ([AdminTypes], [AdminAllTypes]), it
// purges nothing and fails with [ErrScopeUnknown].
//
// Purge is idempotent, so a rare second run of an occurrence is harmless. Use
// a key per table:
//
//	s.Add("mensagem_m2m_retention", "@hourly", relay.RetentionJob(admin, 7*24*time.Hour))
func RetentionJob(admin *Admin, age time.Duration) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		if admin == nil {
			return errors.New("relay: RetentionJob: admin is nil")
		}
		start := time.Now()
		n, err := admin.PurgeSent(ctx, age)
		if logger, ok := schedule.JobLogger(ctx); ok && n > 0 {
			logger.LogAttrs(ctx, slog.LevelInfo, "relay: retention: purged SENT rows",
				slog.String("table", admin.table), slog.Int64("rows", n), slog.Duration("age", age),
				slog.Duration("duration", time.Since(start)))
		}
		return err
	}
}
