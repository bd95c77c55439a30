package relay_test

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/xadm/relay"
	"github.com/xadm/relay/internal/testkit/pgserver"
)

func TestNewScheduler(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	noop := func(context.Context) error { return nil }

	t.Run("BadConfig", func(t *testing.T) {
		t.Parallel()
		_, err := relay.NewScheduler(nil, relay.SchedulerConfig{})
		require.ErrorContains(t, err, "needs a *pgxpool.Pool")
		_, err = relay.NewScheduler(newPool(t, 2), relay.SchedulerConfig{Tolerance: -time.Second})
		require.ErrorContains(t, err, "SchedulerConfig.Tolerance must be 0 (the default, 10s) or at least 1s, got -1s")
		_, err = relay.NewScheduler(newPool(t, 2), relay.SchedulerConfig{Tolerance: time.Millisecond})
		require.ErrorContains(t, err, "SchedulerConfig.Tolerance must be 0 (the default, 10s) or at least 1s, got 1ms")
		_, err = relay.NewScheduler(newPool(t, 1), relay.SchedulerConfig{})
		require.ErrorContains(t, err, "pool_max_conns to at least 2")
	})

	t.Run("BadJobs", func(t *testing.T) {
		t.Parallel()
		s, err := relay.NewScheduler(newPool(t, 2), relay.SchedulerConfig{})
		require.NoError(t, err)
		for _, tc := range []struct {
			key, spec string
			job       func(context.Context) error
			want      string
		}{
			{"", "@daily", noop, "key must not be empty"},
			{"  ", "@daily", noop, "key must not be empty"},
			{"k", "", noop, `spec "": empty spec string`},
			{"k", "* * *", noop, `spec "* * *": expected exactly 5 fields`},
			{"k", "0 25 * * *", noop, `spec "0 25 * * *": end of range (25) above maximum (23)`},
			{"k", "@every", noop, `spec "@every"`},
			{"k", "@fortnightly", noop, `spec "@fortnightly"`},
			{"k", "CRON_TZ=UTC", noop, `spec "CRON_TZ=UTC": not a cron spec`},
			{"k", "CRON_TZ=Nowhere/Atlantis 0 2 * * *", noop, "bad location"},
			{"k", "0 0 30 2 *", noop, `spec "0 0 30 2 *" never fires`},
			{"k", "@daily", nil, `Scheduler.Add "k": job must not be nil`},
		} {
			err := s.Add(tc.key, tc.spec, tc.job)
			require.Error(t, err, "%q %q", tc.key, tc.spec)
			require.Contains(t, strings.ToLower(err.Error()), strings.ToLower(tc.want))
		}
		require.NoError(t, s.Add("k", "CRON_TZ=America/Sao_Paulo 0 2 * * *", noop))
		require.ErrorContains(t, s.Add("k", "@hourly", noop), `key "k" is already added`)
		require.NoError(t, s.Start(ctx))
		t.Cleanup(func() { require.NoError(t, s.Stop(ctx)) })
		require.ErrorContains(t, s.Add("other", "@hourly", noop), "add every job before Start")
		require.ErrorContains(t, s.Start(ctx), "already started")
	})

	t.Run("StopWithoutStartAndTwice", func(t *testing.T) {
		t.Parallel()
		s, err := relay.NewScheduler(newPool(t, 2), relay.SchedulerConfig{})
		require.NoError(t, err)
		require.NoError(t, s.Stop(ctx), "Stop without Start")
		require.NoError(t, s.Add("k", "@daily", noop))
		require.NoError(t, s.Start(ctx))
		require.NoError(t, s.Stop(ctx))
		require.NoError(t, s.Stop(ctx), "a second Stop")
		require.NoError(t, s.Start(ctx), "started again after Stop")
		require.NoError(t, s.Stop(ctx))
	})

	t.Run("ScheduledAtOutsideAJob", func(t *testing.T) {
		t.Parallel()
		_, ok := relay.ScheduledAt(ctx)
		require.False(t, ok)
	})
}

// occurrences records which replica ran which occurrence, by its scheduled time.
type occurrences struct {
	mu   sync.Mutex
	runs map[time.Time][]int
}

func (o *occurrences) job(replica int) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		at, ok := relay.ScheduledAt(ctx)
		if !ok {
			return fmt.Errorf("replica %d: no scheduled time in the job's ctx", replica)
		}
		o.mu.Lock()
		defer o.mu.Unlock()
		if o.runs == nil {
			o.runs = make(map[time.Time][]int)
		}
		o.runs[at] = append(o.runs[at], replica)
		return nil
	}
}

func (o *occurrences) distinct() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.runs)
}

// lateGuard stands for a replica whose timers fire late: it waits before each
// try of the lock, lates[(tries + offset) % len(lates)], so that replicas
// sharing lates with different offsets take turns being the earliest.
type lateGuard struct {
	relay.Guard
	lates  []time.Duration
	offset int
	tries  atomic.Int32
}

func (g *lateGuard) TryRun(ctx context.Context, key string, fn func(ctx context.Context) error) (bool, error) {
	late := g.lates[(int(g.tries.Add(1))+g.offset)%len(g.lates)]
	select {
	case <-time.After(late):
	case <-ctx.Done():
		return false, ctx.Err()
	}
	return g.Guard.TryRun(ctx, key, fn)
}

// stubbornGuard is an adopter's guard that, whatever fn returns, keeps the
// lock until release is closed.
type stubbornGuard struct {
	relay.Guard
	release <-chan struct{}

	mu  sync.Mutex
	err error
}

func (g *stubbornGuard) TryRun(ctx context.Context, key string, fn func(ctx context.Context) error) (bool, error) {
	return g.Guard.TryRun(ctx, key, func(ctx context.Context) error {
		err := fn(ctx)
		g.mu.Lock()
		g.err = err
		g.mu.Unlock()
		<-g.release
		return nil
	})
}

func (g *stubbornGuard) fnErr() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.err
}

// countingGuard counts the tries that found the lock held elsewhere.
type countingGuard struct {
	relay.Guard
	coalesced atomic.Int32
}

func (g *countingGuard) TryRun(ctx context.Context, key string, fn func(ctx context.Context) error) (bool, error) {
	ran, err := g.Guard.TryRun(ctx, key, fn)
	if !ran && err == nil {
		g.coalesced.Add(1)
	}
	return ran, err
}

func newScheduler(t *testing.T, pool *pgxpool.Pool, cfg relay.SchedulerConfig) *relay.Scheduler {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t)
	}
	s, err := relay.NewScheduler(pool, cfg)
	require.NoError(t, err)
	return s
}

// TestSchedulerReplicas runs one job @every 1s on three replicas, each with its
// own pool, two of them late by 40ms and 700ms at each occurrence (in turns):
// each occurrence runs exactly once. The job takes no time, so without the hold
// past the job a late replica would find the lock free and run it again.
func TestSchedulerReplicas(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	key := pgserver.Name(t)
	const want = 6

	var occ occurrences
	// 40ms: within the window (500ms for @every 1s), the winner still holds
	// the lock. 700ms: past the window, the lock is free again, and the
	// database's clock says the occurrence is over.
	lates := []time.Duration{0, 40 * time.Millisecond, 700 * time.Millisecond}
	schedulers := make([]*relay.Scheduler, len(lates))
	for i := range lates {
		pool := newPool(t, 3)
		s := newScheduler(t, pool, relay.SchedulerConfig{Guard: &lateGuard{Guard: relay.NewPostgresGuard(pool), lates: lates, offset: i}})
		require.NoError(t, s.Add(key, "@every 1s", occ.job(i)))
		schedulers[i] = s
	}
	for _, s := range schedulers {
		require.NoError(t, s.Start(ctx))
	}
	require.Eventually(t, func() bool { return occ.distinct() >= want }, 2*time.Minute, 10*time.Millisecond)
	for _, s := range schedulers {
		require.NoError(t, s.Stop(ctx))
	}

	occ.mu.Lock()
	defer occ.mu.Unlock()
	times := make([]time.Time, 0, len(occ.runs))
	won := make([]int, len(lates))
	for at, replicas := range occ.runs {
		require.Len(t, replicas, 1, "occurrence %s ran on replicas %v", at.Format(time.RFC3339Nano), replicas)
		require.Zero(t, at.Nanosecond(), "@every 1s falls on whole seconds")
		require.Equal(t, time.UTC, at.Location(), "in the default Location")
		times = append(times, at)
		won[replicas[0]]++
	}
	slices.SortFunc(times, time.Time.Compare)
	missed := int(times[len(times)-1].Sub(times[0])/time.Second) + 1 - len(times)
	t.Logf("%d occurrences from %s to %s, each run once; won by replica (lateness taking turns among %v): %v; missed by every replica: %d",
		len(times), times[0].Format(time.TimeOnly), times[len(times)-1].Format(time.TimeOnly), lates, won, missed)
}

// TestSchedulerLockHeldElsewhere: while a session holds the job's key exactly
// as a JVM relay (or relayctl pause) holds an election, no replica runs it.
func TestSchedulerLockHeldElsewhere(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	app := pgserver.Name(t)
	release := holdLikeJVM(t, app)

	var occ occurrences
	guards := make([]*countingGuard, 2)
	schedulers := make([]*relay.Scheduler, 2)
	for i := range schedulers {
		pool := newPool(t, 3)
		guards[i] = &countingGuard{Guard: relay.NewPostgresGuard(pool)}
		schedulers[i] = newScheduler(t, pool, relay.SchedulerConfig{Guard: guards[i]})
		require.NoError(t, schedulers[i].Add(app+relay.LockKeySuffix, "@every 1s", occ.job(i)))
		require.NoError(t, schedulers[i].Start(ctx))
	}
	require.Eventually(t, func() bool { return guards[0].coalesced.Load() >= 2 && guards[1].coalesced.Load() >= 2 },
		2*time.Minute, 10*time.Millisecond, "every replica tries and finds the lock held")
	require.Zero(t, occ.distinct(), "no replica runs the job while another session holds its key")

	release()
	require.Eventually(t, func() bool { return occ.distinct() >= 1 }, 2*time.Minute, 10*time.Millisecond,
		"once the session lets go, the job runs")
	for _, s := range schedulers {
		require.NoError(t, s.Stop(ctx))
	}
	require.True(t, lockFree(t, app), "stopped schedulers hold no lock")
}

func TestSchedulerJobFailures(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("PanicIsLoggedAndLaterOccurrencesRun", func(t *testing.T) {
		t.Parallel()
		var logs logBuffer
		var calls atomic.Int32
		s := newScheduler(t, newPool(t, 3), relay.SchedulerConfig{Logger: logs.Logger()})
		require.NoError(t, s.Add(pgserver.Name(t), "@every 1s", func(context.Context) error {
			if calls.Add(1) == 1 {
				panic("boom")
			}
			return nil
		}))
		require.NoError(t, s.Start(ctx))
		require.Eventually(t, func() bool { return calls.Load() >= 3 }, 2*time.Minute, 10*time.Millisecond)
		require.NoError(t, s.Stop(ctx))
		out := logs.String()
		require.Contains(t, out, "relay: scheduler: job panicked")
		require.Contains(t, out, "panic=boom")
		require.Contains(t, out, "schedule_test.go", "the stack is logged")
	})

	t.Run("ErrorIsLogged", func(t *testing.T) {
		t.Parallel()
		var logs logBuffer
		var calls atomic.Int32
		s := newScheduler(t, newPool(t, 3), relay.SchedulerConfig{Logger: logs.Logger()})
		require.NoError(t, s.Add(pgserver.Name(t), "@every 1s", func(context.Context) error {
			calls.Add(1)
			return fmt.Errorf("the report's destination is down")
		}))
		require.NoError(t, s.Start(ctx))
		require.Eventually(t, func() bool { return calls.Load() >= 2 }, 2*time.Minute, 10*time.Millisecond)
		require.NoError(t, s.Stop(ctx))
		require.Contains(t, logs.String(), `level=ERROR msg="relay: scheduler: job failed"`)
		require.Contains(t, logs.String(), "the report's destination is down")
	})
}

// TestSchedulerOverlap: a run still going when the next occurrence is due
// makes that occurrence skipped, logged, in its own process, and holds the
// lock against the other replicas: runs never overlap.
func TestSchedulerOverlap(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	key := pgserver.Name(t)
	var logs logBuffer

	var mu sync.Mutex
	var inFlight, maxInFlight int
	var ats []time.Time
	release := make(chan struct{})
	job := func(ctx context.Context) error {
		at, _ := relay.ScheduledAt(ctx)
		mu.Lock()
		inFlight++
		maxInFlight = max(maxInFlight, inFlight)
		first := len(ats) == 0
		ats = append(ats, at)
		mu.Unlock()
		if first {
			<-release
		}
		mu.Lock()
		inFlight--
		mu.Unlock()
		return nil
	}
	var schedulers []*relay.Scheduler
	for range 2 {
		s := newScheduler(t, newPool(t, 3), relay.SchedulerConfig{Logger: logs.Logger()})
		require.NoError(t, s.Add(key, "@every 1s", job))
		require.NoError(t, s.Start(ctx))
		schedulers = append(schedulers, s)
	}
	require.Eventually(t, func() bool {
		return strings.Contains(logs.String(), "occurrence skipped: the previous run is still going")
	}, 2*time.Minute, 10*time.Millisecond)
	// The skipped occurrence's window (its Tolerance: half the 1s gap) closes
	// before the first run ends: a replica whose timer for it fires late, on a
	// loaded machine, after the run ended, may otherwise still start it, as it
	// would for a runner that vanished.
	mu.Lock()
	first := ats[0]
	mu.Unlock()
	require.Eventually(t, func() bool { return time.Now().After(first.Add(time.Second + 600*time.Millisecond)) },
		time.Minute, 10*time.Millisecond, "the skipped occurrence's window closes")
	close(release)
	runs := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(ats)
	}
	require.Eventually(t, func() bool { return runs() >= 3 }, 2*time.Minute, 10*time.Millisecond)
	for _, s := range schedulers {
		require.NoError(t, s.Stop(ctx))
	}
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, 1, maxInFlight, "runs of one job never overlap, in one process or across replicas")
	require.Greater(t, ats[1].Sub(ats[0]), time.Second, "the occurrence due while the first run went on was skipped")
	require.NotContains(t, logs.String(), "level=ERROR")
}

func TestSchedulerStop(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("WaitsForTheRunInFlightAndReleasesTheLock", func(t *testing.T) {
		t.Parallel()
		app := pgserver.Name(t)
		pool := newPool(t, 3)
		entered, leave := make(chan struct{}), make(chan struct{})
		var finished atomic.Bool
		var calls atomic.Int32
		s := newScheduler(t, pool, relay.SchedulerConfig{})
		require.NoError(t, s.Add(app+relay.LockKeySuffix, "@every 1s", func(context.Context) error {
			if calls.Add(1) == 1 {
				close(entered)
				<-leave
				finished.Store(true)
			}
			return nil
		}))
		require.NoError(t, s.Start(ctx))
		<-entered
		stopped := make(chan error, 1)
		go func() { stopped <- s.Stop(ctx) }()
		select {
		case <-stopped:
			t.Fatal("Stop returned while the job ran")
		case <-time.After(50 * time.Millisecond):
		}
		close(leave)
		require.NoError(t, <-stopped)
		require.True(t, finished.Load(), "Stop returned after the job")
		require.EqualValues(t, 1, calls.Load(), "no occurrence starts after Stop")
		require.True(t, lockFree(t, app))
		require.Zero(t, advisoryLocksHeldBy(t, pool))
	})

	t.Run("DeadlineCancelsTheJob", func(t *testing.T) {
		t.Parallel()
		app := pgserver.Name(t)
		entered := make(chan struct{})
		cancelled := make(chan error, 1)
		s := newScheduler(t, newPool(t, 3), relay.SchedulerConfig{})
		require.NoError(t, s.Add(app+relay.LockKeySuffix, "@every 1s", func(ctx context.Context) error {
			close(entered)
			<-ctx.Done()
			cancelled <- ctx.Err()
			return ctx.Err()
		}))
		require.NoError(t, s.Start(ctx))
		<-entered
		stopCtx, cancel := context.WithCancel(ctx)
		cancel()
		require.ErrorIs(t, s.Stop(stopCtx), context.Canceled)
		require.ErrorIs(t, <-cancelled, context.Canceled)
		require.True(t, lockFree(t, app))
	})

	// Issue 22: a job that ignores its context held Stop, the process and
	// the job's lock forever.
	t.Run("AbandonsAJobThatIgnoresItsContext", func(t *testing.T) {
		t.Parallel()
		app := pgserver.Name(t)
		key := app + relay.LockKeySuffix
		var logs logBuffer
		pool := newPool(t, 3)
		entered, release := make(chan struct{}), make(chan struct{})
		t.Cleanup(func() { close(release) }) // before the pool's Close, which waits for the job's connections
		var calls atomic.Int32
		s := newScheduler(t, pool, relay.SchedulerConfig{Logger: logs.Logger()})
		require.NoError(t, s.Add(key, "@every 1s", func(context.Context) error {
			if calls.Add(1) == 1 {
				close(entered)
			}
			<-release // ignores its ctx
			return nil
		}))
		require.NoError(t, s.Start(ctx))
		<-entered
		require.False(t, lockFree(t, app), "the runner holds the job's lock")

		const deadline = 300 * time.Millisecond
		stopCtx, cancel := context.WithTimeout(ctx, deadline)
		defer cancel()
		start := time.Now()
		stopped := make(chan error, 1)
		go func() { stopped <- s.Stop(stopCtx) }()
		var err error
		select {
		case err = <-stopped:
		case <-time.After(deadline + 30*time.Second):
			t.Fatal("Stop did not return: the job that ignores its context holds it")
		}
		elapsed := time.Since(start)
		t.Logf("Stop with a %s deadline returned after %s", deadline, elapsed)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.ErrorContains(t, err, "abandoned the jobs")
		require.ErrorContains(t, err, key)
		require.Less(t, elapsed, deadline+5*time.Second, "Stop is bounded by its ctx, plus the grace and the lock's release")
		require.True(t, lockFree(t, app), "another replica can take the job's lock at once")
		require.Len(t, logs.Lines("level=ERROR", "abandoned", "key="+key, "scheduled_at=", "running_for="), 1, logs.String())
		require.EqualValues(t, 1, calls.Load())
	})

	t.Run("AForeignGuardIsNotForced", func(t *testing.T) {
		t.Parallel()
		app := pgserver.Name(t)
		key := app + relay.LockKeySuffix
		pool := newPool(t, 3)
		var logs logBuffer
		entered, release := make(chan struct{}), make(chan struct{})
		var once sync.Once
		t.Cleanup(func() { once.Do(func() { close(release) }) })
		g := &stubbornGuard{Guard: relay.NewPostgresGuard(pool), release: release}
		s := newScheduler(t, pool, relay.SchedulerConfig{Logger: logs.Logger(), Guard: g})
		var calls atomic.Int32
		require.NoError(t, s.Add(key, "@every 1s", func(context.Context) error {
			if calls.Add(1) == 1 {
				close(entered)
			}
			<-release
			return nil
		}))
		require.NoError(t, s.Start(ctx))
		<-entered
		stopCtx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		stopped := make(chan error, 1)
		go func() { stopped <- s.Stop(stopCtx) }()
		var err error
		select {
		case err = <-stopped:
		case <-time.After(30 * time.Second):
			t.Fatal("Stop did not return: the foreign guard holds it")
		}
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.ErrorContains(t, err, "a foreign Guard cannot be forced")
		require.ErrorIs(t, g.fnErr(), relay.ErrJobAbandoned, "the guard is told")
		require.NotEmpty(t, logs.Lines("level=ERROR", "their locks may still be held", key), logs.String())
		require.False(t, lockFree(t, app), "what Stop says is true: the guard that ignored ErrJobAbandoned still holds the lock")
		once.Do(func() { close(release) })
		require.Eventually(t, func() bool { return lockFree(t, app) }, time.Minute, 10*time.Millisecond)
	})

	t.Run("CancellingStartsContextStopsIt", func(t *testing.T) {
		t.Parallel()
		var calls atomic.Int32
		s := newScheduler(t, newPool(t, 3), relay.SchedulerConfig{})
		require.NoError(t, s.Add(pgserver.Name(t), "@every 1s", func(context.Context) error { calls.Add(1); return nil }))
		startCtx, cancel := context.WithCancel(ctx)
		require.NoError(t, s.Start(startCtx))
		require.Eventually(t, func() bool { return calls.Load() >= 1 }, 2*time.Minute, 10*time.Millisecond)
		cancel()
		require.NoError(t, s.Stop(ctx), "waits for the scheduler to wind down")
		require.NoError(t, s.Start(ctx), "it can start again")
		require.NoError(t, s.Stop(ctx))
	})
}

// TestRetentionJob runs the retention job under a scheduler: it deletes only
// the outbound SENT rows older than the age, one chunk per statement, each
// committed on its own: while a row of the second chunk is locked, the first
// chunk is already gone.
func TestRetentionJob(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	const old = 2*relay.PurgeChunk + 17
	b.exec(t, `INSERT INTO %s (type, natural_key, payload, status, sent_at)
		SELECT 't', 'old' || g, '{}', 'SENT', now() - interval '2 days' FROM generate_series(1, $1) g`, old)
	recent := b.insert(t, "t", "recent", "pending", "retrying", "inbound")
	b.exec(t, "UPDATE %s SET status = 'SENT', sent_at = now() - interval '1 hour' WHERE id = $1", recent[0])
	b.exec(t, "UPDATE %s SET status = 'ERROR', attempts = 1 WHERE id = $1", recent[2])
	b.exec(t, "UPDATE %s SET direction = 'IN', status = 'SENT', sent_at = now() - interval '3 days' WHERE id = $1", recent[3])
	oldSent := func() int {
		var n int
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{b.table}.Sanitize()+
			" WHERE direction = 'OUT' AND status = 'SENT' AND sent_at < now() - interval '1 day'").Scan(&n))
		return n
	}

	// A session locks the first row of the second chunk.
	locker, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = locker.Rollback(ctx) }()
	var lockerPID uint32
	require.NoError(t, locker.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&lockerPID))
	// (FOR UPDATE with OFFSET would lock the rows it skips too: select first.)
	table := pgx.Identifier{b.table}.Sanitize()
	_, err = locker.Exec(ctx, "SELECT id FROM "+table+" WHERE id = (SELECT id FROM "+table+
		" WHERE status = 'SENT' AND direction = 'OUT' AND sent_at < now() - interval '1 day' ORDER BY id OFFSET $1 LIMIT 1) FOR UPDATE",
		relay.PurgeChunk)
	require.NoError(t, err)

	var logs logBuffer
	admin := b.newAdmin(t)
	s := newScheduler(t, newPool(t, 3), relay.SchedulerConfig{Logger: logs.Logger()})
	require.NoError(t, s.Add(b.table+"_retention", "@every 1s", relay.RetentionJob(admin, 24*time.Hour)))
	require.NoError(t, s.Start(ctx))

	blocked := func() bool {
		var n int
		require.NoError(t, b.pool.QueryRow(ctx,
			"SELECT count(*) FROM pg_stat_activity WHERE $1::int = ANY(pg_blocking_pids(pid))", lockerPID).Scan(&n))
		return n > 0
	}
	require.Eventually(t, blocked, 2*time.Minute, 10*time.Millisecond, "the purge reaches the locked row")
	require.Equal(t, old-relay.PurgeChunk, oldSent(), "the first chunk is committed while the second waits")
	require.NoError(t, locker.Commit(ctx))

	require.Eventually(t, func() bool { return oldSent() == 0 }, 2*time.Minute, 10*time.Millisecond)
	require.NoError(t, s.Stop(ctx))
	for _, id := range recent {
		require.True(t, b.rowExists(t, id), "row %d: recent SENT, live and inbound rows stay", id)
	}
	require.Contains(t, logs.String(), fmt.Sprintf("rows=%d", old), "the job logs what it purged")
}

// TestRetentionDoesNotBlockProducers purges a long SENT history while a
// producer inserts, and watches the producer's session: it never waits on a
// lock. It logs the producer's insert latency before and during the purge.
func TestRetentionDoesNotBlockProducers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	const old = 50 * relay.PurgeChunk
	// Autovacuum's truncation of the emptied table takes a lock that would
	// block inserts: that is VACUUM's doing, not the purge's.
	b.exec(t, "ALTER TABLE %s SET (autovacuum_enabled = off)")
	b.exec(t, `INSERT INTO %s (type, natural_key, payload, status, sent_at)
		SELECT 't', 'old' || g, '{"n": 1}', 'SENT', now() - interval '2 days' FROM generate_series(1, $1) g`, old)

	producer, err := pgx.Connect(ctx, server().URL)
	require.NoError(t, err)
	defer producer.Close(ctx)
	insert := "INSERT INTO " + pgx.Identifier{b.table}.Sanitize() + " (type, natural_key, payload) VALUES ('t', $1, '{}')"
	produce := func(until func(n int) bool) []time.Duration {
		var lat []time.Duration
		for n := 0; !until(n); n++ {
			start := time.Now()
			_, err := producer.Exec(ctx, insert, fmt.Sprint("new", n))
			require.NoError(t, err)
			lat = append(lat, time.Since(start))
		}
		return lat
	}
	baseline := produce(func(n int) bool { return n == 500 })

	// A watcher samples the producer's session for lock waits.
	pid := producer.PgConn().PID()
	watcher, err := pgx.Connect(ctx, server().URL)
	require.NoError(t, err)
	defer watcher.Close(ctx)
	var samples, lockWaits atomic.Int32
	purgeDone, watchDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(watchDone)
		for {
			select {
			case <-purgeDone:
				return
			default:
			}
			var waiting bool
			if err := watcher.QueryRow(ctx, "SELECT coalesce(wait_event_type = 'Lock', false) OR cardinality(pg_blocking_pids($1)) > 0 "+
				"FROM pg_stat_activity WHERE pid = $1", pid).Scan(&waiting); err != nil {
				t.Errorf("watch the producer: %v", err)
				return
			}
			samples.Add(1)
			if waiting {
				lockWaits.Add(1)
			}
		}
	}()

	admin := b.newAdmin(t)
	var purged atomic.Int64
	var purgeTook time.Duration
	go func() {
		defer close(purgeDone)
		start := time.Now()
		n, err := admin.PurgeSent(ctx, time.Hour) // what RetentionJob runs
		purgeTook = time.Since(start)
		purged.Store(n)
		if err != nil {
			t.Errorf("purge: %v", err)
		}
	}()
	during := produce(func(int) bool {
		select {
		case <-purgeDone:
			return true
		default:
			return false
		}
	})
	<-watchDone

	require.EqualValues(t, old, purged.Load())
	require.Zero(t, b.countStatus(t, "SENT"))
	require.Equal(t, 500+len(during), b.countStatus(t, "PENDING"), "every insert landed")
	require.Zero(t, lockWaits.Load(), "the producer never waited on a lock (%d samples)", samples.Load())
	t.Logf("purge of %d SENT rows in %d chunks took %s; producer's insert latency before: %s; during (%d inserts, %d lock-wait samples of %d): %s",
		old, old/relay.PurgeChunk, purgeTook.Round(time.Millisecond), latencies(baseline), len(during), lockWaits.Load(), samples.Load(), latencies(during))
}

// latencies summarises insert latencies as p50, p99 and max.
func latencies(d []time.Duration) string {
	if len(d) == 0 {
		return "no inserts"
	}
	s := slices.Clone(d)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	q := func(p float64) time.Duration { return s[min(len(s)-1, int(p*float64(len(s))))].Round(time.Microsecond) }
	return fmt.Sprintf("p50 %s, p99 %s, max %s", q(0.50), q(0.99), s[len(s)-1].Round(time.Microsecond))
}

// TestSchedulerRunnerVanishes kills the lock's session of the replica running
// an occurrence, mid-run, with pg_terminate_backend (issue 22): of the two
// other replicas watching the lock, one notices within the occurrence's
// window, says so, and runs it again, exactly once more.
func TestSchedulerRunnerVanishes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	key := pgserver.Name(t) + relay.LockKeySuffix
	var logs logBuffer
	type run struct {
		replica int
		at      time.Time
	}
	var mu sync.Mutex
	var runs []run
	runsOf := func(at time.Time) (n int, later bool, replicas []int) {
		mu.Lock()
		defer mu.Unlock()
		for _, r := range runs {
			if r.at.Equal(at) {
				n++
				replicas = append(replicas, r.replica)
			}
			later = later || r.at.After(at)
		}
		return n, later, replicas
	}
	type first struct {
		replica int
		at      time.Time
	}
	firsts := make(chan first, 1)
	var calls atomic.Int32
	guards := make([]*countingGuard, 3)
	for i := range 3 {
		pool := newPool(t, 3)
		guards[i] = &countingGuard{Guard: relay.NewPostgresGuard(pool)}
		s := newScheduler(t, pool, relay.SchedulerConfig{Tolerance: 5 * time.Second, Logger: logs.Logger(), Guard: guards[i]})
		require.NoError(t, s.Add(key, "@every 10s", func(ctx context.Context) error {
			at, _ := relay.ScheduledAt(ctx)
			mu.Lock()
			runs = append(runs, run{i, at})
			mu.Unlock()
			if calls.Add(1) == 1 {
				firsts <- first{i, at}
				<-ctx.Done() // until its lock's session is killed
				return context.Cause(ctx)
			}
			return nil
		}))
		require.NoError(t, s.Start(ctx))
		t.Cleanup(func() { require.NoError(t, s.Stop(ctx)) })
	}
	f := <-firsts
	at := f.at
	// The others have tried and found the lock held: they watch it now (a
	// replica whose timer fired after the kill would simply win, unaware).
	require.Eventually(t, func() bool {
		for i, g := range guards {
			if i != f.replica && g.coalesced.Load() == 0 {
				return false
			}
		}
		return true
	}, time.Minute, 5*time.Millisecond)

	admin, err := pgx.Connect(ctx, server().URL)
	require.NoError(t, err)
	defer admin.Close(ctx)
	var terminated bool
	require.NoError(t, admin.QueryRow(ctx, `SELECT pg_terminate_backend(pid) FROM pg_locks
WHERE locktype = 'advisory' AND granted AND objsubid = 1
  AND classid = ((hashtext($1)::bigint >> 32) & 4294967295)::oid AND objid = (hashtext($1)::bigint & 4294967295)::oid`, key).Scan(&terminated))
	require.True(t, terminated, "the runner's lock session is terminated")

	require.Eventually(t, func() bool { n, _, _ := runsOf(at); return n >= 2 }, 30*time.Second, 10*time.Millisecond,
		"another replica runs the occurrence again")
	require.Eventually(t, func() bool { _, later, _ := runsOf(at); return later }, time.Minute, 10*time.Millisecond,
		"the next occurrence runs: the watches of the first are over")
	n, _, replicas := runsOf(at)
	require.Equal(t, 2, n, "exactly once more")
	require.NotEqual(t, replicas[0], replicas[1], "on another replica")
	require.Len(t, logs.Lines("level=WARN", "the occurrence's runner vanished", "key="+key), 1, logs.String())
}
