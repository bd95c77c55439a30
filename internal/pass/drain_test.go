package pass_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/xadm/relay"
	"github.com/xadm/relay/internal/testkit/harness"
)

// TestDrain covers the periodic pass through a backlog, with several workers,
// where the next batch is selected while the last one's messages are in flight.
func TestDrain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	for _, group := range []int{0, 7} {
		t.Run(fmt.Sprintf("ExactlyOnceInKeyOrder/GroupOutcomes=%d", group), func(t *testing.T) {
			t.Parallel()
			b := harness.Setup(t)
			var keys []string
			for i := range 300 {
				keys = append(keys, fmt.Sprint("k", i%40))
			}
			ids := b.Insert(t, "t", keys...)
			cfg := b.Config
			cfg.Interval = time.Hour // one tick: the whole backlog in one election
			cfg.BatchSize = 10
			cfg.Concurrency = 8
			cfg.GroupOutcomes = group
			var mu sync.Mutex
			sends := map[int64]int{}
			last := map[string]int64{}
			var disorder []string
			r := b.NewRelay(t, cfg, relay.SenderFunc("t", func(_ context.Context, m relay.Message) error {
				mu.Lock()
				defer mu.Unlock()
				sends[m.ID]++
				if m.ID < last[m.Key] {
					disorder = append(disorder, fmt.Sprintf("%s: %d after %d", m.Key, m.ID, last[m.Key]))
				}
				last[m.Key] = m.ID
				return nil
			}))
			require.NoError(t, r.Start(ctx))
			require.Eventually(t, func() bool { return b.CountStatus(t, "SENT") == len(ids) }, 20*time.Second, 10*time.Millisecond)
			require.NoError(t, r.Stop(ctx))
			mu.Lock()
			defer mu.Unlock()
			require.Len(t, sends, len(ids))
			for id, n := range sends {
				require.Equal(t, 1, n, "row %d sent %d times", id, n)
			}
			require.Empty(t, disorder)
			require.EqualValues(t, 1, r.Stats().PassesElected)
		})
	}

	t.Run("AFailureIsNotRetriedWithinTheDrain", func(t *testing.T) {
		t.Parallel()
		b, cfg := drainSetup(t)
		ids := b.Insert(t, "t", harness.DistinctKeys("k", 100)...)
		var mu sync.Mutex
		calls := 0
		r := b.NewRelay(t, cfg, relay.SenderFunc("t", func(_ context.Context, m relay.Message) error {
			if m.ID == ids[0] {
				mu.Lock()
				calls++
				mu.Unlock()
				return errors.New("down")
			}
			return nil
		}))
		require.NoError(t, r.Start(ctx))
		require.Eventually(t, func() bool { return r.Stats().PassesElected == 1 }, 10*time.Second, 10*time.Millisecond)
		require.NoError(t, r.Stop(ctx))
		mu.Lock()
		defer mu.Unlock()
		require.Equal(t, 1, calls, "with RetryBackoff 0 a failed row waits for the next tick, not the next batch")
		require.Equal(t, 1, b.State(t, ids[0]).Attempts)
	})

	t.Run("AHungSendDoesNotHoldTheOtherWorkers", func(t *testing.T) {
		t.Parallel()
		b, cfg := drainSetup(t)
		ids := b.Insert(t, "t", harness.DistinctKeys("k", 60)...)
		release := make(chan struct{})
		r := b.NewRelay(t, cfg, relay.SenderFunc("t", func(ctx context.Context, m relay.Message) error {
			if m.ID == ids[0] {
				select {
				case <-release:
				case <-ctx.Done():
				}
			}
			return nil
		}))
		require.NoError(t, r.Start(ctx))
		// The 59 others are delivered while the first one is still in flight:
		// the next batches are selected without waiting for it.
		require.Eventually(t, func() bool { return b.CountStatus(t, "SENT") == 59 }, 10*time.Second, 10*time.Millisecond)
		require.Equal(t, "PENDING", b.State(t, ids[0]).Status)
		close(release)
		require.Eventually(t, func() bool { return b.CountStatus(t, "SENT") == 60 }, 10*time.Second, 10*time.Millisecond)
		require.NoError(t, r.Stop(ctx))
	})

	t.Run("WholeBatchesOfAKeyLeftBehind", func(t *testing.T) {
		// a1 and b1 go out in the first batch; every select past them, while
		// a1 is in flight, finds only a's later rows, left behind. Once
		// nothing is in flight the next such batch must still be selected
		// past, not waited on: the pass used to hang there for ever.
		t.Parallel()
		b, cfg := drainSetup(t)
		cfg.BatchSize = 2
		cfg.Concurrency = 2
		keys := []string{"a", "b"}
		for range 20 {
			keys = append(keys, "a")
		}
		ids := b.Insert(t, "t", keys...)
		var mu sync.Mutex
		var sent []int64
		r := b.NewRelay(t, cfg, relay.SenderFunc("t", func(_ context.Context, m relay.Message) error {
			mu.Lock()
			defer mu.Unlock()
			sent = append(sent, m.ID)
			return nil
		}))
		require.NoError(t, r.Start(ctx))
		require.Eventually(t, func() bool { return b.CountStatus(t, "SENT") == len(ids) }, 20*time.Second, 10*time.Millisecond)
		stop, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		require.NoError(t, r.Stop(stop))
		mu.Lock()
		defer mu.Unlock()
		var want, got []int64
		for i, id := range ids {
			if keys[i] == "a" {
				want = append(want, id)
			}
		}
		for _, id := range sent {
			if id != ids[1] {
				got = append(got, id)
			}
		}
		require.Equal(t, want, got, "a's rows once each, in order")
		require.EqualValues(t, 1, r.Stats().PassesElected)
	})
}

// drainSetup is a bundle and a config whose one tick drains a backlog in
// batches of 10 with 4 workers.
func drainSetup(t *testing.T) (*harness.Bundle, relay.Config) {
	b := harness.Setup(t)
	cfg := b.Config
	cfg.Interval = time.Hour
	cfg.BatchSize = 10
	cfg.Concurrency = 4
	return b, cfg
}
