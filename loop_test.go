package relay_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/xadm/relay"
)

func TestStartStop(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("DeliversPeriodicallyUntilStopped", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		rec := newRecorder("t", nil)
		r := b.newRelay(t, b.cfg, rec)
		require.NoError(t, r.Start(ctx))
		require.ErrorContains(t, r.Start(ctx), "already started")
		b.insert(t, "t", "a", "b")
		require.Eventually(t, func() bool { return b.countStatus(t, "SENT") == 2 }, 5*time.Second, 10*time.Millisecond)
		b.insert(t, "t", "c")
		require.Eventually(t, func() bool { return b.countStatus(t, "SENT") == 3 }, 5*time.Second, 10*time.Millisecond)
		require.NoError(t, r.Stop(ctx))
		require.NoError(t, r.Stop(ctx), "a second Stop is harmless")
		require.True(t, lockFree(t, b.cfg.AppName))

		b.insert(t, "t", "d")
		time.Sleep(5 * b.cfg.Interval)
		require.Equal(t, 1, b.countStatus(t, "PENDING"), "no pass after Stop")

		require.NoError(t, r.Start(ctx), "a stopped relay starts again")
		require.Eventually(t, func() bool { return b.countStatus(t, "PENDING") == 0 }, 5*time.Second, 10*time.Millisecond)
		require.NoError(t, r.Stop(ctx))
	})

	t.Run("StopWithoutStart", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		r := b.newRelay(t, b.cfg, newRecorder("t", nil))
		require.NoError(t, r.Stop(ctx))
	})

	t.Run("EnabledGatesOnlyTheTick", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.insert(t, "t", "a")
		cfg := b.cfg
		cfg.Enabled = false
		rec := newRecorder("t", nil)
		r := b.newRelay(t, cfg, rec)
		require.NoError(t, r.Start(ctx))
		time.Sleep(10 * cfg.Interval)
		require.Zero(t, rec.count(), "a disabled relay's ticker delivers nothing")
		require.Zero(t, r.Stats().PassesElected+r.Stats().PassesCoalesced)
		ran, err := r.RunIfElected(ctx)
		require.NoError(t, err)
		require.True(t, ran, "Enabled does not apply to RunIfElected")
		require.Equal(t, 1, rec.count())
		require.NoError(t, r.Stop(ctx))
	})

	t.Run("StopWaitsForThePassInFlightAndReleasesTheLock", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ids := b.insert(t, "t", "a", "b", "c")
		entered, leave := make(chan struct{}), make(chan struct{})
		var calls atomic.Int32
		r := b.newRelay(t, b.cfg, relay.SenderFunc("t", func(context.Context, relay.Message) error {
			if calls.Add(1) == 1 {
				close(entered)
				<-leave
			}
			return nil
		}))
		require.NoError(t, r.Start(ctx))
		<-entered
		stopped := make(chan error, 1)
		go func() { stopped <- r.Stop(ctx) }()
		select {
		case <-stopped:
			t.Fatal("Stop returned while a send was in flight")
		case <-time.After(50 * time.Millisecond):
		}
		close(leave)
		require.NoError(t, <-stopped)
		require.EqualValues(t, 1, calls.Load(), "after Stop the pass starts no new message")
		require.Equal(t, "SENT", b.state(t, ids[0]).Status, "the message in flight is recorded")
		require.Equal(t, "PENDING", b.state(t, ids[1]).Status, "the rest is left for another replica")
		require.True(t, lockFree(t, b.cfg.AppName))
		require.Zero(t, advisoryLocksHeldBy(t, b.pool))
	})

	t.Run("StopDeadlineCancelsTheSend", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		id := b.insert(t, "t", "a")[0]
		entered := make(chan struct{})
		r := b.newRelay(t, b.cfg, relay.SenderFunc("t", func(ctx context.Context, m relay.Message) error {
			close(entered)
			<-ctx.Done()
			return ctx.Err()
		}))
		require.NoError(t, r.Start(ctx))
		<-entered
		stopCtx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		require.ErrorIs(t, r.Stop(stopCtx), context.DeadlineExceeded)
		require.True(t, lockFree(t, b.cfg.AppName))
		s := b.state(t, id)
		require.Equal(t, "PENDING", s.Status, "a send cut short by the stop is not an attempt")
		require.Zero(t, s.Attempts)
	})

	t.Run("CancellingStartsContextStopsIt", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		rec := newRecorder("t", nil)
		r := b.newRelay(t, b.cfg, rec)
		runCtx, cancel := context.WithCancel(ctx)
		require.NoError(t, r.Start(runCtx))
		b.insert(t, "t", "a")
		require.Eventually(t, func() bool { return rec.count() == 1 }, 5*time.Second, 10*time.Millisecond)
		cancel()
		require.NoError(t, r.Stop(ctx)) // waits for the ticker to wind down
		b.insert(t, "t", "b")
		time.Sleep(5 * b.cfg.Interval)
		require.Equal(t, 1, rec.count())
	})

	t.Run("PassesNeverOverlap", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		keys := make([]string, 30)
		for i := range keys {
			keys[i] = string(rune('a' + i))
		}
		b.insert(t, "t", keys...)
		cfg := b.cfg
		cfg.Interval = time.Millisecond
		cfg.BatchSize = 3
		rec := newRecorder("t", func(context.Context, relay.Message) error {
			time.Sleep(2 * time.Millisecond)
			return nil
		})
		r := b.newRelay(t, cfg, rec)
		require.NoError(t, r.Start(ctx))
		require.Eventually(t, func() bool { return rec.count() == 30 }, 10*time.Second, 10*time.Millisecond)
		require.NoError(t, r.Stop(ctx))
		require.Equal(t, 1, rec.maxInFlight())
	})

	t.Run("APanickingPassIsRecovered", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		var logs logBuffer
		cfg := b.cfg
		cfg.Logger = logs.Logger()
		obs := &panicObserver{}
		cfg.Observer = obs
		rec := newRecorder("t", nil)
		r := b.newRelay(t, cfg, rec)
		require.NoError(t, r.Start(ctx))
		require.Eventually(t, func() bool { return obs.calls.Load() >= 3 }, 5*time.Second, 10*time.Millisecond)
		b.insert(t, "t", "a")
		require.Eventually(t, func() bool { return rec.count() == 1 }, 5*time.Second, 10*time.Millisecond)
		require.NoError(t, r.Stop(ctx))
		require.Contains(t, logs.String(), "panic")
		require.True(t, lockFree(t, b.cfg.AppName))
	})

	t.Run("DrainsABacklogUnderOneElection", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		keys := make([]string, 200)
		for i := range keys {
			keys[i] = "k" + string(rune('a'+i%26)) + string(rune('a'+i/26))
		}
		b.insert(t, "t", keys...)
		cfg := b.cfg
		cfg.Interval = time.Hour // one tick only: the backlog must not wait for the next
		cfg.BatchSize = 10
		rec := newRecorder("t", nil)
		r := b.newRelay(t, cfg, rec)
		require.NoError(t, r.Start(ctx))
		require.Eventually(t, func() bool { return rec.count() == 200 }, 10*time.Second, 10*time.Millisecond)
		require.NoError(t, r.Stop(ctx))
		require.EqualValues(t, 1, r.Stats().PassesElected, "twenty full batches, one election")
	})
}

// TestKeptElectionLetGoOfAtStop: Stop lets go of the election a started
// relay's loop keeps between its passes before it returns. (The kept election
// itself, every pass under one election and a standby's coalescing on it,
// is internal/election's TestKeptElectionUntilEnd.)
func TestKeptElectionLetGoOfAtStop(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg := b.cfg
	cfg.Interval = time.Hour
	rec := newRecorder("t", nil)
	r := b.newRelay(t, cfg, rec)
	startRelay(t, r)
	admin, err := relay.NewAdmin(b.pool, cfg)
	require.NoError(t, err)
	for n := 0; ; n++ { // kept after a delivery, until a quiet second
		b.trickle(t, rec, n, 1)
		hs, err := admin.Election(context.Background())
		require.NoError(t, err)
		if len(hs) == 1 {
			break
		}
	}
	require.NoError(t, r.Stop(context.Background()))
	require.True(t, lockFree(t, cfg.AppName), "Stop lets go of the kept election before it returns")
}

// panicObserver panics in its first passes, as a buggy metrics exporter might.
type panicObserver struct{ calls atomic.Int32 }

func (o *panicObserver) PassDone(relay.PassReport) {
	if o.calls.Add(1) <= 3 {
		panic("observer bug")
	}
}

func (o *panicObserver) MessageDone(relay.MessageReport) {}
