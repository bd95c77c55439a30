package relay_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/xadm/relay"
)

// observer records every report it receives; it is safe for concurrent use.
type observer struct {
	mu       sync.Mutex
	passes   []relay.PassReport
	messages []relay.MessageReport
}

func (o *observer) PassDone(p relay.PassReport) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.passes = append(o.passes, p)
}

func (o *observer) MessageDone(m relay.MessageReport) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.messages = append(o.messages, m)
}

func (o *observer) reports() ([]relay.PassReport, []relay.MessageReport) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.passes), slices.Clone(o.messages)
}

// failByKey fails the keys that start with "fail" and fails permanently the
// keys that start with "perm"; it sends the others.
func failByKey(_ context.Context, m relay.Message) error {
	time.Sleep(time.Millisecond) // a destination that takes a moment
	switch {
	case strings.HasPrefix(m.Key, "fail"):
		return errors.New("503 unavailable")
	case strings.HasPrefix(m.Key, "perm"):
		return relay.Permanent(errors.New("422 unprocessable"))
	}
	return nil
}

func TestStats(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("CountsEveryOutcome", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ids := b.insert(t, "t", "ok-1", "ok-2", "fail-1", "fail-last", "perm-1")
		b.exec(t, "UPDATE %s SET status = 'ERROR', attempts = 2 WHERE id = $1", ids[3]) // one attempt left
		cfg := b.cfg
		cfg.MaxAttempts = 3
		r := b.newRelay(t, cfg, relay.SenderFunc("t", failByKey))
		require.Equal(t, relay.Stats{}, r.Stats(), "all zero before the first pass")

		before := time.Now()
		n, err := r.Run(ctx)
		require.NoError(t, err)
		require.Equal(t, 5, n)
		st := r.Stats()
		require.EqualValues(t, 1, st.PassesElected)
		require.Zero(t, st.PassesCoalesced)
		require.Zero(t, st.PassesFailed)
		require.EqualValues(t, 2, st.Sent)
		require.EqualValues(t, 1, st.Failed, "fail-1 will be retried")
		require.EqualValues(t, 2, st.Dead, "fail-last reached the ceiling, perm-1 is permanent")
		require.NoError(t, st.LastPassErr)
		require.False(t, st.LastPassAt.Before(before))

		n, err = r.Run(ctx) // fail-1 again: dead or failed, the totals go on adding up
		require.NoError(t, err)
		require.Equal(t, 1, n)
		st = r.Stats()
		require.EqualValues(t, 2, st.PassesElected)
		require.EqualValues(t, 2, st.Failed)
		require.EqualValues(t, 2, st.Sent)
	})

	t.Run("CoalescedPasses", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.insert(t, "t", "a")
		r := b.newRelay(t, b.cfg, newRecorder("t", nil))
		release := holdLikeJVM(t, b.cfg.AppName)
		for range 3 {
			ran, err := r.RunIfElected(ctx)
			require.NoError(t, err)
			require.False(t, ran)
		}
		st := r.Stats()
		require.EqualValues(t, 3, st.PassesCoalesced)
		require.Zero(t, st.PassesElected)
		require.Zero(t, st.Sent)
		require.False(t, st.LastPassAt.IsZero(), "a coalesced pass is a pass")

		release()
		ran, err := r.RunIfElected(ctx)
		require.NoError(t, err)
		require.True(t, ran)
		st = r.Stats()
		require.EqualValues(t, 1, st.PassesElected)
		require.EqualValues(t, 3, st.PassesCoalesced)
		require.EqualValues(t, 1, st.Sent)
	})

	t.Run("LastPassErr", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.insert(t, "t", "a")
		obs := &observer{}
		cfg := b.cfg
		cfg.Observer = obs
		r := b.newRelay(t, cfg, newRecorder("t", nil))

		// The table goes away under the relay (a migration gone wrong), then comes back.
		moved := pgx.Identifier{b.table + "_moved"}.Sanitize()
		b.exec(t, "ALTER TABLE %s RENAME TO "+moved)
		_, err := r.Run(ctx)
		require.Error(t, err)
		st := r.Stats()
		require.Error(t, st.LastPassErr)
		require.ErrorContains(t, st.LastPassErr, b.table)
		require.EqualValues(t, 1, st.PassesFailed)
		require.EqualValues(t, 1, st.PassesElected, "it ran, and failed")
		passes, _ := obs.reports()
		require.Len(t, passes, 1)
		require.True(t, passes[0].Ran)
		require.Error(t, passes[0].Err)

		_, err = b.pool.Exec(ctx, "ALTER TABLE "+moved+" RENAME TO "+pgx.Identifier{b.table}.Sanitize())
		require.NoError(t, err)
		n, err := r.Run(ctx)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		st = r.Stats()
		require.NoError(t, st.LastPassErr, "the next good pass clears it")
		require.EqualValues(t, 1, st.PassesFailed, "the count of failed passes stays")
	})

	t.Run("Lag", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.insert(t, "t", "old", "older")
		b.exec(t, "UPDATE %s SET created_at = now() - interval '1 hour'")
		r := b.newRelay(t, b.cfg, newRecorder("t", nil))

		release := holdLikeJVM(t, b.cfg.AppName)
		ran, err := r.RunIfElected(ctx)
		require.NoError(t, err)
		require.False(t, ran)
		require.Zero(t, r.Stats().Lag, "a coalesced pass read nothing")
		release()

		ran, err = r.RunIfElected(ctx)
		require.NoError(t, err)
		require.True(t, ran)
		lag := r.Stats().Lag
		require.GreaterOrEqual(t, lag, time.Hour, "the age of the oldest deliverable row")
		require.Less(t, lag, time.Hour+time.Minute)

		release = holdLikeJVM(t, b.cfg.AppName)
		_, err = r.RunIfElected(ctx)
		require.NoError(t, err)
		require.Equal(t, lag, r.Stats().Lag, "a coalesced pass keeps the last lag it cannot know better")
		release()

		_, err = r.Run(ctx)
		require.NoError(t, err)
		require.Zero(t, r.Stats().Lag, "nothing left to deliver: no lag")
	})

	t.Run("ObserverReceivesPassesAndMessages", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct {
			name          string
			concurrency   int
			groupOutcomes int
		}{
			{"OneAtATime", 1, 0},
			{"Concurrent", 4, 0},
			{"ConcurrentGrouped", 4, 5},
		} {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				b := setup(t)
				want := map[int64]relay.Outcome{} // id → outcome
				for i := range 24 {
					var key string
					var outcome relay.Outcome
					switch {
					case i%6 == 1:
						key, outcome = fmt.Sprintf("fail-%d", i), relay.OutcomeError
					case i%6 == 4:
						key, outcome = fmt.Sprintf("perm-%d", i), relay.OutcomeDead
					default:
						key, outcome = fmt.Sprintf("ok-%d", i), relay.OutcomeSent
					}
					want[b.insert(t, "t", key)[0]] = outcome
				}
				obs := &observer{}
				cfg := b.cfg
				cfg.Observer = obs
				cfg.Concurrency = tc.concurrency
				cfg.GroupOutcomes = tc.groupOutcomes
				cfg.MaxAttempts = 5
				r := b.newRelay(t, cfg, relay.SenderFunc("t", failByKey))

				ran, err := r.RunIfElected(ctx)
				require.NoError(t, err)
				require.True(t, ran)
				passes, messages := obs.reports()
				require.Len(t, passes, 1)
				p := passes[0]
				require.True(t, p.Ran)
				require.False(t, p.Coalesced)
				require.Equal(t, 16, p.Sent)
				require.Equal(t, 4, p.Failed)
				require.Equal(t, 4, p.Dead)
				require.NoError(t, p.Err)
				require.Positive(t, p.Duration)

				require.Len(t, messages, len(want), "one report per message")
				for _, m := range messages {
					outcome, ok := want[m.ID]
					require.True(t, ok, "report of an unknown id %d", m.ID)
					delete(want, m.ID) // each id once
					require.Equal(t, "t", m.Type)
					require.Equal(t, outcome, m.Outcome, "id %d", m.ID)
					require.GreaterOrEqual(t, m.Duration, time.Millisecond, "the send's duration")
					switch outcome {
					case relay.OutcomeSent:
						require.NoError(t, m.Err)
						require.Zero(t, m.Attempts)
					case relay.OutcomeError:
						require.ErrorContains(t, m.Err, "503")
						require.Equal(t, 1, m.Attempts)
					case relay.OutcomeDead:
						require.True(t, relay.IsPermanent(m.Err))
						require.Equal(t, cfg.MaxAttempts, m.Attempts, "a permanent failure is dead at the ceiling")
					}
				}

				release := holdLikeJVM(t, b.cfg.AppName)
				ran, err = r.RunIfElected(ctx)
				require.NoError(t, err)
				require.False(t, ran)
				release()
				passes, after := obs.reports()
				require.Len(t, passes, 2)
				require.True(t, passes[1].Coalesced)
				require.False(t, passes[1].Ran)
				require.Zero(t, passes[1].Sent+passes[1].Failed+passes[1].Dead)
				require.Len(t, after, len(messages), "a coalesced pass reports no message")
			})
		}
	})
}

// TestPassReportOutcomesWaiting: a pass reports the most outcomes that waited
// at once to be written. Another transaction holds the table in SHARE mode,
// which lets the relay select its rows but holds back every write of an
// outcome: the worker sends on while the outcomes queue, so when the last send
// starts, all the others are waiting. Nothing is left waiting at the pass's
// end, and a pass with nothing to send reports none.
func TestPassReportOutcomesWaiting(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name          string
		groupOutcomes int
	}{{"Default", 0}, {"Grouped", 100}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			b := setup(t)
			const rows = 31 // within a worker's pipeline (64) and a group (100)
			keys := make([]string, rows)
			for i := range keys {
				keys[i] = fmt.Sprintf("k%02d", i)
			}
			b.insert(t, "t", keys...)

			lock, err := b.pool.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = lock.Rollback(ctx) }()
			_, err = lock.Exec(ctx, "LOCK TABLE "+pgx.Identifier{b.table}.Sanitize()+" IN SHARE MODE")
			require.NoError(t, err)

			last, release := make(chan struct{}), make(chan struct{})
			var calls atomic.Int32
			send := func(ctx context.Context, _ relay.Message) error {
				if calls.Add(1) == rows {
					close(last)
					select {
					case <-release:
					case <-ctx.Done():
						return ctx.Err()
					}
				}
				return nil
			}
			obs := &observer{}
			cfg := b.cfg
			cfg.Observer, cfg.Concurrency, cfg.GroupOutcomes = obs, 1, tc.groupOutcomes
			r := b.newRelay(t, cfg, relay.SenderFunc("t", send))

			type result struct {
				n   int
				err error
			}
			done := make(chan result, 1)
			go func() {
				n, err := r.Run(ctx)
				done <- result{n, err}
			}()
			select {
			case <-last: // every other send returned, and none of its outcomes could be written
			case res := <-done:
				t.Fatalf("the pass ended before its last send: %d rows, %v", res.n, res.err)
			}
			require.NoError(t, lock.Commit(ctx))
			close(release)
			res := <-done
			require.NoError(t, res.err)
			require.Equal(t, rows, res.n)

			passes, _ := obs.reports()
			require.Len(t, passes, 1)
			require.GreaterOrEqual(t, passes[0].OutcomesWaiting, rows-1, "all but the last were waiting when it was sent")
			require.LessOrEqual(t, passes[0].OutcomesWaiting, rows)

			n, err := r.Run(ctx)
			require.NoError(t, err)
			require.Zero(t, n)
			passes, _ = obs.reports()
			require.Len(t, passes, 2)
			require.Zero(t, passes[1].OutcomesWaiting, "nothing sent, nothing waited")
		})
	}
}
