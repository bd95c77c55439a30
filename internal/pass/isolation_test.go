package pass_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/xadm/relay"
	"github.com/xadm/relay/internal/testkit/harness"
)

// sickReceiver is the destination of type x: it behaves as its mode says
// until the test heals it, then accepts. It counts the Sends running in it,
// abandoned ones included, and each key's accepted ids in order.
type sickReceiver struct {
	mode    string        // "hang": blocks until its context ends; "ignore": until release; "slow": until a token
	release chan struct{} // closed: an "ignore" Send returns
	tokens  chan struct{} // one per "slow" Send
	healed  atomic.Bool
	running atomic.Int32
	calls   atomic.Int32

	mu       sync.Mutex
	accepted map[string][]int64
	starts   []time.Time // when each Send began
}

func newSickReceiver(mode string) *sickReceiver {
	return &sickReceiver{mode: mode, release: make(chan struct{}), tokens: make(chan struct{}), accepted: map[string][]int64{}}
}

func (s *sickReceiver) Type() string { return "x" }

func (s *sickReceiver) Send(ctx context.Context, m relay.Message) error {
	s.mu.Lock()
	s.starts = append(s.starts, time.Now())
	s.mu.Unlock()
	s.calls.Add(1)
	s.running.Add(1)
	defer s.running.Add(-1)
	if !s.healed.Load() {
		switch s.mode {
		case "hang":
			<-ctx.Done()
			return context.Cause(ctx)
		case "ignore":
			<-s.release // ignores its context
			return errors.New("answered after the relay gave up")
		case "slow":
			select {
			case <-s.tokens:
			case <-ctx.Done():
				return context.Cause(ctx)
			}
		}
	}
	s.mu.Lock()
	s.accepted[m.Key] = append(s.accepted[m.Key], m.ID)
	s.mu.Unlock()
	return nil
}

// TestIsolation: one relay, types x and y, Concurrency 4. x's receiver
// hangs until each Send's deadline, ignores its context, or answers one
// message at a time; y's messages, written one by one meanwhile, are each
// sent while x's keys still wait. A sick x is paused (the reason says why),
// its rows keep their status, and once it heals every x message is delivered,
// in order per key, none lost, and no x Send is left running.
func TestIsolation(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"hang", "ignore", "slow"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			b := harness.Setup(t)
			keys := 20
			if mode == "slow" {
				keys = 60
			}
			var xs []int64
			for i := range keys {
				k := fmt.Sprintf("x%02d", i)
				n := 1
				if i%5 == 0 {
					n = 2 // a key with two messages: their order is kept
				}
				for range n {
					xs = append(xs, b.Insert(t, "x", k)...)
				}
			}
			x := newSickReceiver(mode)
			var ySent sync.Map
			y := relay.SenderFunc("y", func(_ context.Context, m relay.Message) error {
				ySent.Store(m.ID, true)
				return nil
			})
			cfg := b.Config
			cfg.Concurrency = 4
			cfg.SendTimeout = time.Second
			cfg.Interval = 200 * time.Millisecond
			cfg.RetryBackoff = 0
			r, err := relay.New(harness.NewPool(t, 12), cfg, x, y)
			require.NoError(t, err)
			require.NoError(t, r.Start(ctx))
			defer func() { require.NoError(t, r.Stop(ctx)) }()
			t.Cleanup(func() {
				if !x.healed.Load() {
					x.healed.Store(true)
				}
				select {
				case <-x.release:
				default:
					close(x.release)
				}
			})

			// A sick x is paused; while it is, its rows change only by the
			// Sends in flight when it paused, and its probes, one row each.
			var before map[int64]harness.State
			var callsBefore int32
			var pause relay.PausedType
			if mode != "slow" {
				require.Eventually(t, func() bool { return len(r.Stats().Paused) == 1 }, 30*time.Second, 5*time.Millisecond, "x is paused")
				pause = r.Stats().Paused[0]
				callsBefore = x.calls.Load()
				before = map[int64]harness.State{}
				for _, id := range xs {
					before[id] = b.State(t, id)
				}
			}

			// y's messages, one at a time, each sent while x's keys wait.
			for i := range 8 {
				id, err := relay.Enqueue(ctx, b.Pool, b.Table, relay.Outgoing{Type: "y", Key: fmt.Sprint("y", i), Payload: []byte(`{}`)})
				require.NoError(t, err)
				require.Eventually(t, func() bool {
					if mode == "slow" {
						select { // x's receiver answers one message each time the test looks
						case x.tokens <- struct{}{}:
						default:
						}
					}
					_, ok := ySent.Load(id)
					return ok
				}, 30*time.Second, 5*time.Millisecond, "y message %d", i)
			}
			sentX := 0
			for _, id := range xs {
				if b.State(t, id).Status == "SENT" {
					sentX++
				}
			}
			require.Less(t, sentX, len(xs), "y went ahead of x's backlog")

			if mode != "slow" {
				paused := r.Stats().Paused
				require.Len(t, paused, 1, "x is paused")
				require.Equal(t, "x", paused[0].Type)
				require.NotEmpty(t, paused[0].Reason)
				if mode == "ignore" {
					// Each stuck Send is a failure (its SendTimeout): x pauses
					// after PauseAfter of them, with the Sends then in flight
					// left to join them.
					require.LessOrEqual(t, x.running.Load(), int32(cfg.PauseAfter+cfg.Concurrency-1),
						"stuck x Sends still running: at most PauseAfter + Concurrency - 1")
					stuck := r.Stats().Stuck
					require.Len(t, stuck, 1, "Stats says which type has stuck Sends")
					require.Equal(t, "x", stuck[0].Type)
					require.Positive(t, stuck[0].Sends)
				}
				x.mu.Lock()
				for _, at := range x.starts[callsBefore:] {
					require.False(t, at.Before(pause.Until), "an x Send began during its pause, not as its probe")
				}
				x.mu.Unlock()
				changed := 0
				for _, id := range xs {
					if s := b.State(t, id); s.Status != before[id].Status || s.Attempts != before[id].Attempts {
						changed++
					}
				}
				// In flight when it paused: a Send on each worker at most. Their
				// outcomes may be recorded after the snapshot above, even those
				// whose Sends had returned when it was taken (x.running counts
				// the Sends, not their outcomes still to be written).
				require.LessOrEqual(t, int32(changed), int32(cfg.Concurrency)+x.calls.Load()-callsBefore,
					"a paused type's rows keep their status and attempts, but for the Sends in flight and the probes")
			}

			// x heals: every x message is delivered, in order per key.
			x.healed.Store(true)
			if mode == "ignore" {
				close(x.release)
			}
			require.Eventually(t, func() bool { return b.CountStatus(t, "SENT") == len(xs)+8 }, time.Minute, 20*time.Millisecond)
			require.Eventually(t, func() bool { return x.running.Load() == 0 }, 30*time.Second, 5*time.Millisecond,
				"no x Send left running")
			x.mu.Lock()
			defer x.mu.Unlock()
			for k, ids := range x.accepted {
				for i := 1; i < len(ids); i++ {
					require.Less(t, ids[i-1], ids[i], "key %s out of order", k)
				}
			}
			require.Empty(t, r.Stats().Paused)
		})
	}
}

// TestOneBadKeyDoesNotHoldItsType is issue 45's probe case, from outside:
// x's destination is down (every Send fails fast) and x is paused, into its
// longest pause after a good key's probe failed; then the destination
// answers for nine keys of ten, and the tenth, whose rows have the lowest
// ids (the next probe's first candidate), keeps failing for good. The nine keys are all delivered within the longest
// pause (PauseMax) plus a margin of the heal, whatever the probe picks, with
// RetryBackoff 0 and with the default: a probe asks about the destination,
// not about one key. The bad key's rows die alone, each at MaxAttempts.
func TestOneBadKeyDoesNotHoldItsType(t *testing.T) {
	t.Parallel()
	for _, backoff := range []string{"0", "default"} {
		t.Run("RetryBackoff="+backoff, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			b := harness.Setup(t)
			cfg := b.Config
			cfg.Interval, cfg.MaxAttempts = relay.DefaultConfig().Interval, 3
			if backoff == "default" {
				cfg.RetryBackoff = relay.DefaultConfig().RetryBackoff
			}
			var down atomic.Bool
			down.Store(true)
			var mu sync.Mutex
			sent := map[string]int{}
			lastFailed := ""
			x := relay.SenderFunc("x", func(_ context.Context, m relay.Message) error {
				if down.Load() || m.Key == "x-bad" {
					mu.Lock()
					lastFailed = m.Key
					mu.Unlock()
					return errors.New("PUT http://x/" + m.Key + ": 503 Service Unavailable")
				}
				mu.Lock()
				sent[m.Key]++
				mu.Unlock()
				return nil
			})
			bad := b.Insert(t, "x", "x-bad", "x-bad")
			var good []string
			for i := range 9 {
				good = append(good, fmt.Sprint("x", i), fmt.Sprint("x", i))
			}
			b.Insert(t, "x", good...)
			r, err := relay.New(harness.NewPool(t, 8), cfg, x)
			require.NoError(t, err)
			require.NoError(t, r.Start(ctx))
			defer func() { require.NoError(t, r.Stop(ctx)) }()

			// Into the longest pause, after a probe of a good key failed:
			// the next probe's first candidate is then the bad key.
			require.Eventually(t, func() bool {
				p := r.Stats().Paused
				mu.Lock()
				defer mu.Unlock()
				return len(p) == 1 && time.Until(p[0].Until) > cfg.PauseMax*3/4 && lastFailed != "x-bad" && lastFailed != ""
			}, time.Minute, 10*time.Millisecond, "x paused for PauseMax, after a good key's probe failed")
			healed := time.Now()
			down.Store(false)
			require.Eventually(t, func() bool {
				mu.Lock()
				defer mu.Unlock()
				return len(sent) == 9
			}, time.Minute, 10*time.Millisecond, "the nine keys delivered")
			took := time.Since(healed)
			require.Less(t, took, cfg.PauseMax+5*time.Second, "resumed within the longest pause and a margin")
			require.Eventually(t, func() bool { return b.CountStatus(t, "SENT") == len(good) }, time.Minute, 10*time.Millisecond)
			mu.Lock()
			for k, n := range sent {
				require.Equal(t, 2, n, "key %s: each message once", k)
			}
			mu.Unlock()

			// The bad key's rows die alone, the first before the second (its
			// order), each after MaxAttempts Sends.
			require.Eventually(t, func() bool { return b.DeadCount(t, cfg.MaxAttempts) == 2 }, 2*time.Minute, 20*time.Millisecond,
				"the bad key's rows dead")
			for _, id := range bad {
				s := b.State(t, id)
				require.Equal(t, "ERROR", s.Status)
				require.Equal(t, cfg.MaxAttempts, s.Attempts)
				require.Contains(t, *s.LastError, "503 Service Unavailable")
			}
			t.Logf("RetryBackoff %s: the nine keys delivered %s after the heal", backoff, took.Round(time.Millisecond))
		})
	}
}
