package pass_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/xadm/relay"
	"github.com/xadm/relay/internal/testkit/harness"
)

func TestConcurrency(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("UpToNInFlightUnderOneElection", func(t *testing.T) {
		t.Parallel()
		b := harness.Setup(t)
		keys := make([]string, 40)
		for i := range keys {
			keys[i] = fmt.Sprint("k", i)
		}
		b.Insert(t, "t", keys...)
		cfg := b.Config
		cfg.Concurrency = 6 // the pool has 8: one for the election, one to select, one per message in flight
		// The first sends wait until 6 are in flight at once, however slowly
		// the workers start on a loaded machine; a relay that never reaches 6
		// leaves them waiting until SendTimeout, and the test fails.
		var mu sync.Mutex
		inFlight := 0
		all := make(chan struct{})
		rec := harness.NewRecorder("t", func(ctx context.Context, _ relay.Message) error {
			mu.Lock()
			if inFlight++; inFlight == cfg.Concurrency {
				select {
				case <-all:
				default:
					close(all)
				}
			}
			mu.Unlock()
			defer func() {
				mu.Lock()
				inFlight--
				mu.Unlock()
			}()
			select {
			case <-all:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		})
		ran, err := b.NewRelay(t, cfg, rec).RunIfElected(ctx)
		require.NoError(t, err)
		require.True(t, ran)
		require.Equal(t, 40, b.CountStatus(t, "SENT"))
		require.Equal(t, 6, rec.MaxInFlight())
	})

	t.Run("OneKeyOneAtATimeInIdOrder", func(t *testing.T) {
		t.Parallel()
		b := harness.Setup(t)
		var keys []string
		for i := range 60 {
			keys = append(keys, fmt.Sprint("k", i%3))
		}
		b.Insert(t, "t", keys...)
		cfg := b.Config
		cfg.Concurrency = 8
		var mu sync.Mutex
		inFlight := map[string]bool{}
		last := map[string]int64{}
		var violations []string
		s := relay.SenderFunc("t", func(_ context.Context, m relay.Message) error {
			mu.Lock()
			if inFlight[m.Key] {
				violations = append(violations, fmt.Sprintf("key %s twice in flight", m.Key))
			}
			if m.ID < last[m.Key] {
				violations = append(violations, fmt.Sprintf("key %s: %d after %d", m.Key, m.ID, last[m.Key]))
			}
			inFlight[m.Key], last[m.Key] = true, m.ID
			mu.Unlock()
			time.Sleep(time.Millisecond)
			mu.Lock()
			inFlight[m.Key] = false
			mu.Unlock()
			return nil
		})
		n, err := b.NewRelay(t, cfg, s).Run(ctx)
		require.NoError(t, err)
		require.Equal(t, 60, n)
		require.Empty(t, violations)
	})
}

func TestGroupOutcomes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	for _, async := range []bool{false, true} {
		t.Run(fmt.Sprintf("AsyncCommit=%v", async), func(t *testing.T) {
			t.Parallel()
			b := harness.Setup(t)
			var keys []string
			for i := range 25 {
				keys = append(keys, fmt.Sprint("k", i))
			}
			ids := b.Insert(t, "t", keys...)
			cfg := b.Config
			cfg.GroupOutcomes = 10
			cfg.AsyncCommit = async
			cfg.Concurrency = 4
			cfg.MaxAttempts = 3
			r := b.NewRelay(t, cfg, relay.SenderFunc("t", func(_ context.Context, m relay.Message) error {
				switch m.Key {
				case "k3":
					return errors.New("retry me")
				case "k4":
					return relay.Permanent(errors.New("never"))
				case "k5":
					// moved on by someone else while in flight: fenced out
					b.Exec(t, "UPDATE %s SET status = 'SENT', last_error = 'elsewhere' WHERE id = $1", m.ID)
				}
				return nil
			}))
			n, err := r.Run(ctx)
			require.NoError(t, err)
			require.Equal(t, 24, n, "the stale row is not counted")
			require.Equal(t, 23, b.CountStatus(t, "SENT"))

			s := b.State(t, ids[3])
			require.Equal(t, "ERROR", s.Status)
			require.Equal(t, 1, s.Attempts)
			require.Equal(t, "retry me", *s.LastError)
			s = b.State(t, ids[4])
			require.Equal(t, "ERROR", s.Status)
			require.Equal(t, 3, s.Attempts, "a permanent failure is dead at once")
			s = b.State(t, ids[5])
			require.Equal(t, "elsewhere", *s.LastError)
			require.NotNil(t, b.State(t, ids[0]).SentAt)

			st := r.Stats()
			require.EqualValues(t, 22, st.Sent)
			require.EqualValues(t, 1, st.Failed)
			require.EqualValues(t, 1, st.Dead)
		})
	}

	t.Run("AGroupIsRecordedWithinItsDelay", func(t *testing.T) {
		t.Parallel()
		b := harness.Setup(t)
		ids := b.Insert(t, "t", "a", "b")
		cfg := b.Config
		cfg.GroupOutcomes = 100
		sentA := make(chan struct{})
		var seen string
		r := b.NewRelay(t, cfg, relay.SenderFunc("t", func(_ context.Context, m relay.Message) error {
			if m.Key == "a" {
				close(sentA)
				return nil
			}
			// b is slow: a's outcome must not wait for the group to fill.
			time.Sleep(500 * time.Millisecond)
			seen = b.State(t, ids[0]).Status
			return nil
		}))
		_, err := r.Run(ctx)
		require.NoError(t, err)
		<-sentA
		require.Equal(t, "SENT", seen, "a's outcome was recorded within the group delay, before the batch ended")
	})
}

// blockingObserver blocks its first MessageDone until release is closed: an
// adopter's Observer that pushes metrics to a server that hangs.
type blockingObserver struct {
	first   atomic.Bool
	blocked chan int64 // the id whose report blocks
	release chan struct{}
}

func (o *blockingObserver) PassDone(relay.PassReport) {}

func (o *blockingObserver) MessageDone(m relay.MessageReport) {
	if o.first.CompareAndSwap(false, true) {
		o.blocked <- m.ID
		<-o.release
	}
}

// TestSlowObserverDelaysOnlyItsWorker proves that the relay calls the
// Observer with no lock of its own held: while the report of a message
// blocks, the other worker's key is sent and recorded to its end. (When the
// report ran under the recorder's lock, every worker stalled behind it.)
func TestSlowObserverDelaysOnlyItsWorker(t *testing.T) {
	t.Parallel()
	for _, group := range []int{0, 4} {
		t.Run(fmt.Sprintf("GroupOutcomes%d", group), func(t *testing.T) {
			t.Parallel()
			b := harness.Setup(t)
			var keys []string
			for range 5 {
				keys = append(keys, "a", "b")
			}
			ids := b.Insert(t, "t", keys...)
			keyOf := map[int64]string{}
			for i, id := range ids {
				keyOf[id] = keys[i]
			}
			obs := &blockingObserver{blocked: make(chan int64, 1), release: make(chan struct{})}
			var released sync.Once
			release := func() { released.Do(func() { close(obs.release) }) }
			t.Cleanup(release) // a failing test lets the pass end
			cfg := b.Config
			cfg.Concurrency = 2
			cfg.GroupOutcomes = group
			cfg.Observer = obs
			rec := harness.NewRecorder("t", nil)
			r := b.NewRelay(t, cfg, rec)
			passed := make(chan error, 1)
			go func() {
				_, err := r.Run(context.Background())
				passed <- err
			}()
			<-obs.blocked
			sentOf := func(key string) int {
				n := 0
				for _, id := range rec.IDs() {
					if keyOf[id] == key {
						n++
					}
				}
				return n
			}
			// The goroutine that reports is stuck: the worker whose writer
			// wrote the outcome (with GroupOutcomes, whichever filled the
			// group) waits for it. The other key is delivered meanwhile.
			require.Eventually(t, func() bool { return sentOf("a") == 5 || sentOf("b") == 5 }, 20*time.Second, 5*time.Millisecond,
				"a key is delivered while the report of a message blocks")
			release()
			require.NoError(t, <-passed)
			require.Equal(t, 10, b.CountStatus(t, "SENT"))
		})
	}
}

// TestGroupOutcomesWrittenBehind is decision 0037's bound for GroupOutcomes
// N > 1: a full group is written while the worker goes on sending, and the
// next full group waits for that write, so at most 2N sent messages have
// their outcomes unwritten in groups (a crash re-delivers them), beside the
// worker's writer's pipeline (8, as before) and its Send in flight. The test
// holds a lock on the first row: the first group's write waits for it, and
// the worker sends 2N messages and at most those 9 more, then waits too (the
// tree before, which wrote a full group before the next send, stopped at
// N + 9: the Eventually fails on it). Released, every message is
// recorded once.
func TestGroupOutcomesWrittenBehind(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := harness.Setup(t)
	const n, pipeline = 10, 8
	var keys []string
	for i := range 5 * n {
		keys = append(keys, fmt.Sprint("k", i))
	}
	ids := b.Insert(t, "t", keys...)
	tx, err := b.Pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, "SELECT 1 FROM "+pgx.Identifier{b.Table}.Sanitize()+" WHERE id = $1 FOR UPDATE", ids[0])
	require.NoError(t, err)

	cfg := b.Config
	cfg.GroupOutcomes, cfg.Concurrency = n, 1
	var sends atomic.Int32
	r := b.NewRelay(t, cfg, relay.SenderFunc("t", func(context.Context, relay.Message) error {
		sends.Add(1)
		return nil
	}))
	done := make(chan error, 1)
	go func() {
		_, err := r.Run(ctx)
		done <- err
	}()
	require.Eventually(t, func() bool { return sends.Load() >= 2*n }, 20*time.Second, time.Millisecond,
		"the worker sends the next group while the first is written")
	time.Sleep(300 * time.Millisecond) // time for a send past the bound, and for the group timer (100ms)
	require.LessOrEqual(t, sends.Load(), int32(2*n+pipeline+1),
		"no more than two groups unwritten, the worker's writer's pipeline and its Send in flight")
	require.Zero(t, b.CountStatus(t, "SENT"), "the first group's write waits for the lock")

	require.NoError(t, tx.Rollback(ctx))
	require.NoError(t, <-done)
	require.Equal(t, 5*n, b.CountStatus(t, "SENT"))
	require.EqualValues(t, 5*n, sends.Load(), "each message once")
}
