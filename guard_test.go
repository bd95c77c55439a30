package relay_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/xadm/relay"
)

func TestRunIfElected(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("CoalescesWhileTheJVMHoldsTheLock", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.insert(t, "t", "a", "b")
		rec := newRecorder("t", nil)
		r := b.newRelay(t, b.cfg, rec)

		release := holdLikeJVM(t, b.cfg.AppName)
		ran, err := r.RunIfElected(ctx)
		require.NoError(t, err)
		require.False(t, ran)
		require.Zero(t, rec.count(), "nothing is dispatched while another session holds the election")
		require.Equal(t, 2, b.countStatus(t, "PENDING"))
		require.EqualValues(t, 1, r.Stats().PassesCoalesced)

		release()
		ran, err = r.RunIfElected(ctx)
		require.NoError(t, err)
		require.True(t, ran)
		require.Equal(t, 2, rec.count())
		require.True(t, lockFree(t, b.cfg.AppName), "the election is released after the pass")
	})

	t.Run("TheJVMCoalescesWhileTheRelayHoldsTheLock", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.insert(t, "t", "a")
		var jvmGot atomic.Bool
		r := b.newRelay(t, b.cfg, relay.SenderFunc("t", func(context.Context, relay.Message) error {
			conn, err := pgx.Connect(ctx, server().URL)
			if err != nil {
				return err
			}
			defer conn.Close(ctx)
			var ok bool
			err = conn.QueryRow(ctx, "SELECT pg_try_advisory_lock(hashtext('"+b.cfg.AppName+"_relay_m2m'))").Scan(&ok)
			jvmGot.Store(ok)
			return err
		}))
		ran, err := r.RunIfElected(ctx)
		require.NoError(t, err)
		require.True(t, ran)
		require.False(t, jvmGot.Load(), "the JVM's own statement must not get the lock while the Go relay holds it")
	})

	t.Run("TwoAppsDoNotBlockEachOther", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.insert(t, "orders", "a")
		b.insert(t, "invoices", "b")
		holdLikeJVM(t, b.cfg.AppName) // app one is busy elsewhere
		other := b.cfg
		other.AppName = b.cfg.AppName + "_other"
		rec := newRecorder("invoices", nil)
		ran, err := b.newRelay(t, other, rec).RunIfElected(ctx)
		require.NoError(t, err)
		require.True(t, ran)
		require.Equal(t, 1, rec.count())
	})

	t.Run("ClusterLockOffIsADirectPass", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.insert(t, "t", "a")
		holdLikeJVM(t, b.cfg.AppName)
		cfg := b.cfg
		cfg.ClusterLock = false
		rec := newRecorder("t", nil)
		ran, err := b.newRelay(t, cfg, rec).RunIfElected(ctx)
		require.NoError(t, err)
		require.True(t, ran)
		require.Equal(t, 1, rec.count())
	})

	t.Run("NoLockLeftAfterPanicFailureOrCancel", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.insert(t, "t", "fail", "panic", "cancel")
		runCtx, cancel := context.WithCancel(ctx)
		defer cancel()
		r := b.newRelay(t, b.cfg, relay.SenderFunc("t", func(ctx context.Context, m relay.Message) error {
			switch m.Key {
			case "fail":
				return errors.New("no")
			case "panic":
				panic("sender panic")
			default:
				cancel() // the caller gives up mid-pass: the unlock must still reach the server
				<-ctx.Done()
				return ctx.Err()
			}
		}))
		ran, err := r.RunIfElected(runCtx)
		require.True(t, ran)
		require.ErrorIs(t, err, context.Canceled)
		require.Zero(t, advisoryLocksHeldBy(t, b.pool))
		require.True(t, lockFree(t, b.cfg.AppName))
		require.Equal(t, "PENDING", b.statusOfKey(t, "cancel"), "a send cut short by the caller is not an attempt")
	})

	t.Run("ThePoolsConnectionsAreReused", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		r := b.newRelay(t, b.cfg, newRecorder("t", nil))
		for range 20 {
			ran, err := r.RunIfElected(ctx)
			require.NoError(t, err)
			require.True(t, ran)
		}
		require.LessOrEqual(t, b.pool.Stat().TotalConns(), int32(3), "a clean unlock gives the connection back to the pool")
		require.Zero(t, advisoryLocksHeldBy(t, b.pool))
	})

	t.Run("InProcessPassesCoalesce", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.insert(t, "t", "a")
		entered, leave := make(chan struct{}), make(chan struct{})
		r := b.newRelay(t, b.cfg, relay.SenderFunc("t", func(context.Context, relay.Message) error {
			close(entered)
			<-leave
			return nil
		}))
		done := make(chan error, 1)
		go func() { _, err := r.RunIfElected(ctx); done <- err }()
		<-entered
		ran, err := r.RunIfElected(ctx)
		require.NoError(t, err)
		require.False(t, ran, "a second pass of the same relay coalesces instead of stacking the lock")
		close(leave)
		require.NoError(t, <-done)
	})
}

func TestElectionLost(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	ids := b.insert(t, "t", "a", "b", "c")
	var killed, noticed atomic.Bool
	rec := newRecorder("t", func(ctx context.Context, m relay.Message) error {
		if killed.CompareAndSwap(false, true) {
			// Kill the session that holds the election, as a failover or an
			// operator's pg_terminate_backend would, and wait until it is gone.
			bg := context.WithoutCancel(ctx) // the relay cancels ctx as soon as it notices
			conn, err := pgx.Connect(bg, server().URL)
			if err != nil {
				return err
			}
			defer conn.Close(bg)
			_, err = conn.Exec(bg, `SELECT pg_terminate_backend(l.pid) FROM pg_locks l
				WHERE l.locktype = 'advisory' AND l.objid = (hashtext($1)::bigint & 4294967295)::oid`, b.cfg.AppName+"_relay_m2m")
			if err != nil {
				return err
			}
			// The relay learns of the loss while this send is in flight and
			// cancels its context; the destination had accepted the message.
			select {
			case <-ctx.Done():
				noticed.Store(errors.Is(context.Cause(ctx), relay.ErrElectionLost))
			case <-time.After(5 * time.Second):
			}
		}
		return nil
	})
	r := b.newRelay(t, b.cfg, rec)
	ran, err := r.RunIfElected(ctx)
	require.True(t, ran)
	require.ErrorIs(t, err, relay.ErrElectionLost)
	require.True(t, noticed.Load(), "the send in flight is cancelled with ErrElectionLost as its cause")
	require.Equal(t, []int64{ids[0]}, rec.ids(), "the pass stops before its next message")
	// The server frees the lock as the terminated backend exits, a moment after its goodbye.
	require.Eventually(t, func() bool { return lockFree(t, b.cfg.AppName) }, 5*time.Second, 5*time.Millisecond)
	require.Equal(t, "SENT", b.state(t, ids[0]).Status, "the message already sent is still recorded")
	require.Equal(t, "PENDING", b.state(t, ids[1]).Status)

	ran, err = r.RunIfElected(ctx)
	require.NoError(t, err)
	require.True(t, ran, "the next pass elects again on a fresh connection")
	require.Equal(t, 0, b.countStatus(t, "PENDING"))
}

func TestPostgresGuard(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("AnyJobOnOneReplica", func(t *testing.T) {
		t.Parallel()
		pool := newPool(t, 4)
		key := t.Name()
		g1, g2 := relay.NewPostgresGuard(pool), relay.NewPostgresGuard(newPool(t, 4))
		ran, err := g1.TryRun(ctx, key, func(ctx context.Context) error {
			ran, err := g2.TryRun(ctx, key, func(context.Context) error {
				t.Error("the second replica must not run")
				return nil
			})
			require.NoError(t, err)
			require.False(t, ran)
			return nil
		})
		require.NoError(t, err)
		require.True(t, ran)
	})

	t.Run("JobErrorIsReturnedAndLockReleased", func(t *testing.T) {
		t.Parallel()
		pool := newPool(t, 2)
		g := relay.NewPostgresGuard(pool)
		boom := errors.New("boom")
		ran, err := g.TryRun(ctx, t.Name(), func(context.Context) error { return boom })
		require.True(t, ran)
		require.ErrorIs(t, err, boom)
		require.Zero(t, advisoryLocksHeldBy(t, pool))
	})

	t.Run("PanicReleasesTheLock", func(t *testing.T) {
		t.Parallel()
		pool := newPool(t, 2)
		g := relay.NewPostgresGuard(pool)
		require.PanicsWithValue(t, "job panic", func() {
			_, _ = g.TryRun(ctx, t.Name(), func(context.Context) error { panic("job panic") })
		})
		require.Zero(t, advisoryLocksHeldBy(t, pool))
		ran, err := g.TryRun(ctx, t.Name(), func(context.Context) error { return nil })
		require.NoError(t, err)
		require.True(t, ran)
	})

	t.Run("ALockLeftOnAPooledSessionIsNotStacked", func(t *testing.T) {
		t.Parallel()
		pool := newPool(t, 1)
		// Someone took the lock on a pooled session and gave it back still holding it.
		_, err := pool.Exec(ctx, "SELECT pg_advisory_lock(hashtext($1))", t.Name())
		require.NoError(t, err)
		g := relay.NewPostgresGuard(pool)
		ran, err := g.TryRun(ctx, t.Name(), func(context.Context) error { return nil })
		require.NoError(t, err)
		require.False(t, ran, "the key is held, on this very session: coalesce rather than stack")
		require.Equal(t, 1, advisoryLocksHeldBy(t, pool), "the other holder keeps its lock")

		// Once that holder lets go, the guard is elected on the same session.
		var unlocked bool
		require.NoError(t, pool.QueryRow(ctx, "SELECT pg_advisory_unlock(hashtext($1))", t.Name()).Scan(&unlocked))
		require.True(t, unlocked)
		ran, err = g.TryRun(ctx, t.Name(), func(context.Context) error { return nil })
		require.NoError(t, err)
		require.True(t, ran)
		require.Zero(t, advisoryLocksHeldBy(t, pool))
	})

	t.Run("PoolOfOneWorksForAJobThatNeedsNoOtherConnection", func(t *testing.T) {
		t.Parallel()
		pool := newPool(t, 1)
		ran, err := relay.NewPostgresGuard(pool).TryRun(ctx, t.Name(), func(context.Context) error { return nil })
		require.NoError(t, err)
		require.True(t, ran)
	})

	t.Run("ConcurrentContendersRunOneAtATime", func(t *testing.T) {
		t.Parallel()
		var inside, most atomic.Int32
		var wg sync.WaitGroup
		for range 6 {
			g := relay.NewPostgresGuard(newPool(t, 2))
			wg.Go(func() {
				for range 20 {
					_, err := g.TryRun(ctx, t.Name(), func(context.Context) error {
						n := inside.Add(1)
						for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
						}
						time.Sleep(time.Millisecond)
						inside.Add(-1)
						return nil
					})
					require.NoError(t, err)
				}
			})
		}
		wg.Wait()
		require.EqualValues(t, 1, most.Load())
	})
}

func TestReplicas(t *testing.T) {
	t.Parallel()
	const rows = 200

	drain := func(t *testing.T, clusterLock bool) (sends map[int64]int) {
		b := setup(t)
		keys := make([]string, rows)
		for i := range keys {
			keys[i] = "k" + string(rune('a'+i%26)) + time.Now().Format("150405.000000000")
		}
		b.insert(t, "t", keys...)
		var mu sync.Mutex
		sends = map[int64]int{}
		// Without the guard, each replica's first send waits until the other
		// has started its own: both selected the same oldest rows, so they
		// overlap by construction, not by the scheduler's grace.
		var entered atomic.Int32
		both := make(chan struct{})
		sender := func() relay.Sender {
			var first sync.Once
			return relay.SenderFunc("t", func(ctx context.Context, m relay.Message) error {
				mu.Lock()
				sends[m.ID]++
				mu.Unlock()
				if !clusterLock {
					first.Do(func() {
						if entered.Add(1) == 2 {
							close(both)
						}
						select {
						case <-both:
						case <-ctx.Done():
						}
					})
				}
				time.Sleep(200 * time.Microsecond) // a destination that takes a moment
				return nil
			})
		}
		cfg := b.cfg
		cfg.ClusterLock = clusterLock
		cfg.BatchSize = 20
		var replicas []*relay.Relay
		for range 2 {
			r, err := relay.New(newPool(t, 4), cfg, sender())
			require.NoError(t, err)
			replicas = append(replicas, r)
		}
		start := make(chan struct{})
		var wg sync.WaitGroup
		for _, r := range replicas {
			wg.Go(func() {
				<-start
				for b.countStatus(t, "PENDING") > 0 {
					_, err := r.RunIfElected(context.Background())
					require.NoError(t, err)
				}
			})
		}
		close(start)
		wg.Wait()
		require.Equal(t, rows, b.countStatus(t, "SENT"))
		return sends
	}

	t.Run("GuardedDeliverEveryRowExactlyOnce", func(t *testing.T) {
		t.Parallel()
		sends := drain(t, true)
		require.Len(t, sends, rows)
		for id, n := range sends {
			require.Equal(t, 1, n, "row %d", id)
		}
	})

	t.Run("UnguardedDuplicate", func(t *testing.T) {
		t.Parallel()
		sends := drain(t, false)
		require.Len(t, sends, rows)
		dups := 0
		for _, n := range sends {
			if n > 1 {
				dups++
			}
		}
		require.Positive(t, dups, "with the guard off both replicas deliver the same rows: decision 0035's point")
		t.Logf("guard off: %d of %d rows delivered more than once", dups, rows)
	})
}
