package relay_test

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/xadm/relay"
)

func TestNew(t *testing.T) {
	t.Parallel()
	pool := newPool(t, 4)
	ok := relay.SenderFunc("t", func(context.Context, relay.Message) error { return nil })

	t.Run("ZeroConfigRefused", func(t *testing.T) {
		_, err := relay.New(pool, relay.Config{AppName: "x", Table: "t", ClusterLock: true}, ok)
		require.ErrorContains(t, err, "relay.DefaultConfig()")
	})
	t.Run("BadValuesNameTheField", func(t *testing.T) {
		for field, mutate := range map[string]func(*relay.Config){
			"AppName":      func(c *relay.Config) { c.AppName = " " },
			"Table":        func(c *relay.Config) { c.Table = "x; DROP TABLE y" },
			"Interval":     func(c *relay.Config) { c.Interval = 0 },
			"BatchSize":    func(c *relay.Config) { c.BatchSize = 0 },
			"MaxAttempts":  func(c *relay.Config) { c.MaxAttempts = 0 },
			"RetryBackoff": func(c *relay.Config) { c.RetryBackoff = -time.Second },
			"SendTimeout":  func(c *relay.Config) { c.SendTimeout = 0 },
			"Concurrency":  func(c *relay.Config) { c.Concurrency = 0 },
		} {
			cfg := relay.DefaultConfig()
			mutate(&cfg)
			_, err := relay.New(pool, cfg, ok)
			require.ErrorContains(t, err, "Config."+field, field)
			var fe *relay.FieldError
			require.ErrorAs(t, err, &fe)
			require.Equal(t, field, fe.Field)
		}
	})
	t.Run("Senders", func(t *testing.T) {
		cfg := relay.DefaultConfig()
		_, err := relay.New(pool, cfg)
		require.ErrorContains(t, err, "at least one Sender")
		_, err = relay.New(pool, cfg, ok, nil)
		require.ErrorContains(t, err, "sender 1 is nil")
		_, err = relay.New(pool, cfg, relay.SenderFunc("", nil))
		require.ErrorContains(t, err, "empty type")
		_, err = relay.New(pool, cfg, ok, relay.SenderFunc("t", nil))
		require.ErrorContains(t, err, `two senders for type "t"`)
		_, err = relay.New(nil, cfg, ok)
		require.ErrorContains(t, err, "nil")
	})
	t.Run("PoolOfOneRefusedWithTheElection", func(t *testing.T) {
		one := newPool(t, 1)
		_, err := relay.New(one, relay.DefaultConfig(), ok)
		require.ErrorContains(t, err, "pool_max_conns")
		withGuard := relay.DefaultConfig()
		withGuard.Guard = relay.NewPostgresGuard(one)
		_, err = relay.New(one, withGuard, ok)
		require.ErrorContains(t, err, "pool_max_conns", "the same guard, passed explicitly")
		cfg := relay.DefaultConfig()
		cfg.ClusterLock = false
		_, err = relay.New(one, cfg, ok)
		require.NoError(t, err, "a direct relay needs one connection only")
	})
	t.Run("ClusterLockOffWarns", func(t *testing.T) {
		var logs logBuffer
		cfg := relay.DefaultConfig()
		cfg.ClusterLock = false
		cfg.Logger = logs.Logger()
		_, err := relay.New(pool, cfg, ok)
		require.NoError(t, err)
		require.Contains(t, logs.String(), "level=WARN")
		require.Contains(t, logs.String(), "ClusterLock is off")
	})
}

func TestDefaultConfig(t *testing.T) {
	t.Parallel()
	cfg := relay.DefaultConfig()
	require.Equal(t, "app", cfg.AppName)
	require.Equal(t, "mensagem_m2m", cfg.Table)
	require.True(t, cfg.Enabled)
	require.True(t, cfg.ClusterLock)
	require.Positive(t, cfg.Interval)
	require.Positive(t, cfg.BatchSize)
	require.Positive(t, cfg.MaxAttempts)
	require.Positive(t, cfg.SendTimeout)
	require.Equal(t, 2*time.Second, cfg.RetryBackoff, "an ERROR row waits 2s, 4s, 8s...: a 15-minute outage kills nothing")
	require.Equal(t, 1, cfg.Concurrency)
	require.Zero(t, cfg.GroupOutcomes, "one transaction per outcome unless asked")
	require.True(t, cfg.AsyncCommit, "outcomes commit without waiting for their WAL flush")
}

func TestConfigFromEnv(t *testing.T) {
	t.Setenv("RELAY_APP_NAME", "billing")
	t.Setenv("RELAY_TABLE", "outbox.msgs")
	t.Setenv("RELAY_ENABLED", "false")
	t.Setenv("RELAY_CLUSTER_LOCK", "false")
	t.Setenv("RELAY_INTERVAL", "250ms")
	t.Setenv("RELAY_BATCH_SIZE", "50")
	t.Setenv("RELAY_MAX_ATTEMPTS", "3")
	t.Setenv("RELAY_RETRY_BACKOFF", "1500ms")
	t.Setenv("RELAY_SEND_TIMEOUT", "2s")
	t.Setenv("RELAY_CONCURRENCY", "4")
	t.Setenv("RELAY_GROUP_OUTCOMES", "50")
	t.Setenv("RELAY_ASYNC_COMMIT", "false")
	cfg, err := relay.ConfigFromEnv()
	require.NoError(t, err)
	require.Equal(t, "billing", cfg.AppName)
	require.Equal(t, "outbox.msgs", cfg.Table)
	require.False(t, cfg.Enabled)
	require.False(t, cfg.ClusterLock)
	require.Equal(t, 250*time.Millisecond, cfg.Interval)
	require.Equal(t, 50, cfg.BatchSize)
	require.Equal(t, 3, cfg.MaxAttempts)
	require.Equal(t, 1500*time.Millisecond, cfg.RetryBackoff)
	require.Equal(t, 2*time.Second, cfg.SendTimeout)
	require.Equal(t, 4, cfg.Concurrency)
	require.Equal(t, 50, cfg.GroupOutcomes)
	require.False(t, cfg.AsyncCommit)

	pool := newPool(t, 2)
	_, err = relay.New(pool, cfg, relay.SenderFunc("t", func(context.Context, relay.Message) error { return nil }))
	require.NoError(t, err, "a Config from the environment is accepted by New")

	for name, value := range map[string]string{
		"RELAY_CLUSTER_LOCK": "maybe",
		"RELAY_INTERVAL":     "10",
		"RELAY_BATCH_SIZE":   "many",
		"RELAY_MAX_ATTEMPTS": "0",
		"RELAY_TABLE":        "a.b.c",
		"RELAY_PARTITIONS":   "0",
	} {
		t.Setenv(name, value)
		_, err := relay.ConfigFromEnv()
		require.ErrorContains(t, err, name)
		t.Setenv(name, "")
	}
	t.Setenv("RELAY_CLUSTER_LOCK", "true")
	t.Setenv("RELAY_PARTITIONS", "16")
	cfg, err = relay.ConfigFromEnv()
	require.NoError(t, err)
	require.Equal(t, 16, cfg.Partitions)
}

// TestPartitionsConfig: New checks Partitions and names the field in its error.
func TestPartitionsConfig(t *testing.T) {
	t.Parallel()
	pool := newPool(t, 4)
	s := relay.SenderFunc("t", func(context.Context, relay.Message) error { return nil })
	for _, tc := range []struct {
		change func(*relay.Config)
		want   string
	}{
		{func(c *relay.Config) { c.Partitions = 0 }, "relay: Config.Partitions must be between 1 and 4096, got 0"},
		{func(c *relay.Config) { c.Partitions = 4097 }, "relay: Config.Partitions must be between 1 and 4096, got 4097"},
		{func(c *relay.Config) { c.Partitions, c.ClusterLock = 4, false }, "relay: Config.Partitions is 4, but ClusterLock is false"},
		{func(c *relay.Config) { c.Partitions, c.Guard = 4, relay.NewPostgresGuard(pool) }, "leave Guard nil"},
	} {
		cfg := relay.DefaultConfig()
		tc.change(&cfg)
		_, err := relay.New(pool, cfg, s)
		require.ErrorContains(t, err, tc.want)
		var fe *relay.FieldError
		require.ErrorAs(t, err, &fe)
		require.Equal(t, "Partitions", fe.Field)
	}
	require.Equal(t, 1, relay.DefaultConfig().Partitions)
}

func TestCreateTable(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()

	t.Run("Idempotent", func(t *testing.T) {
		require.NoError(t, relay.CreateTable(ctx, b.pool, b.table))
		require.NoError(t, relay.CreateTable(ctx, b.pool, b.table))
	})
	t.Run("ConcurrentReplicas", func(t *testing.T) {
		table := b.table + "_c"
		t.Cleanup(func() { _, _ = b.pool.Exec(ctx, "DROP TABLE IF EXISTS "+table) })
		var wg sync.WaitGroup
		errs := make([]error, 4)
		for i := range errs {
			wg.Go(func() { errs[i] = relay.CreateTable(ctx, b.pool, table) })
		}
		wg.Wait()
		require.NoError(t, errors.Join(errs...))
	})
	t.Run("SchemaQualified", func(t *testing.T) {
		schema := b.table + "_s"
		_, err := b.pool.Exec(ctx, "CREATE SCHEMA "+schema)
		require.NoError(t, err)
		t.Cleanup(func() { _, _ = b.pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE") })
		require.NoError(t, relay.CreateTable(ctx, b.pool, schema+".outbox"))

		cfg := b.cfg
		cfg.Table = schema + ".outbox"
		rec := newRecorder("t", nil)
		r := b.newRelay(t, cfg, rec)
		_, err = b.pool.Exec(ctx, "INSERT INTO "+schema+".outbox (type, natural_key, payload) VALUES ('t', 'k', '{}')")
		require.NoError(t, err)
		n, err := r.Run(ctx)
		require.NoError(t, err)
		require.Equal(t, 1, n)
	})
	t.Run("NamesAreValidatedNotPasted", func(t *testing.T) {
		for _, bad := range []string{"", "a b", `x"; DROP TABLE y; --`, "a.b.c", "1abc", strings.Repeat("a", 64)} {
			require.Error(t, relay.CreateTable(ctx, b.pool, bad), bad)
		}
	})
}

func TestRun(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("DeliversOldestFirstAndMarksSent", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ids := b.insert(t, "order", "a", "b", "c")
		rec := newRecorder("order", nil)
		r := b.newRelay(t, b.cfg, rec)

		n, err := r.Run(ctx)
		require.NoError(t, err)
		require.Equal(t, 3, n)
		require.Equal(t, ids, rec.ids())
		for _, id := range ids {
			s := b.state(t, id)
			require.Equal(t, "SENT", s.Status)
			require.Zero(t, s.Attempts)
			require.NotNil(t, s.SentAt)
		}
		m := rec.Sent[0]
		require.Equal(t, "order", m.Type)
		require.Equal(t, "a", m.Key)
		require.JSONEq(t, `{"key": "a"}`, string(m.Payload))
		require.WithinDuration(t, time.Now(), m.CreatedAt, time.Minute)

		n, err = r.Run(ctx)
		require.NoError(t, err)
		require.Zero(t, n, "SENT rows are never selected again")
	})

	t.Run("OnlyOutboundLiveRowsOfRegisteredTypes", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		mine := b.insert(t, "mine", "k1")
		b.insert(t, "theirs", "k2")
		in := b.insert(t, "mine", "k3")
		b.exec(t, "UPDATE %s SET direction = 'IN' WHERE id = $1", in[0])
		sent := b.insert(t, "mine", "k4")
		b.exec(t, "UPDATE %s SET status = 'SENT' WHERE id = $1", sent[0])
		dead := b.insert(t, "mine", "k5")
		b.exec(t, "UPDATE %s SET status = 'ERROR', attempts = $2 WHERE id = $1", dead[0], b.cfg.MaxAttempts)
		retry := b.insert(t, "mine", "k6")
		b.exec(t, "UPDATE %s SET status = 'ERROR', attempts = 1 WHERE id = $1", retry[0])

		rec := newRecorder("mine", nil)
		n, err := b.newRelay(t, b.cfg, rec).Run(ctx)
		require.NoError(t, err)
		require.Equal(t, 2, n)
		require.Equal(t, []int64{mine[0], retry[0]}, rec.ids())
		require.Equal(t, "PENDING", b.state(t, b.insert(t, "theirs", "k7")[0]).Status)
	})

	t.Run("BatchBounded", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ids := b.insert(t, "t", "a", "b", "c", "d", "e")
		cfg := b.cfg
		cfg.BatchSize = 2
		rec := newRecorder("t", nil)
		r := b.newRelay(t, cfg, rec)
		for _, want := range []int{2, 2, 1, 0} {
			n, err := r.Run(ctx)
			require.NoError(t, err)
			require.Equal(t, want, n)
		}
		require.Equal(t, ids, rec.ids())
	})

	t.Run("FailurePanicAndTimeoutMarkOnlyTheirRow", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ids := b.insert(t, "t", "ok1", "fail", "panic", "hang", "ok2")
		cfg := b.cfg
		cfg.SendTimeout = 100 * time.Millisecond
		cfg.PauseAfter = 0 // with one worker, the abandoned hang would pause the type (TestIsolation)
		release := make(chan struct{})
		t.Cleanup(func() { close(release) })
		rec := newRecorder("t", func(ctx context.Context, m relay.Message) error {
			switch m.Key {
			case "fail":
				return errors.New("503 from the destination")
			case "panic":
				panic("boom")
			case "hang":
				<-release // ignores ctx on purpose: the relay must not wait for it
			}
			return nil
		})
		n, err := b.newRelay(t, cfg, rec).Run(ctx)
		require.NoError(t, err)
		require.Equal(t, 5, n)

		require.Equal(t, "SENT", b.state(t, ids[0]).Status)
		require.Equal(t, "SENT", b.state(t, ids[4]).Status)
		for i, want := range map[int]string{1: "503 from the destination", 2: "panicked: boom", 3: "timed out"} {
			s := b.state(t, ids[i])
			require.Equal(t, "ERROR", s.Status)
			require.Equal(t, 1, s.Attempts)
			require.NotNil(t, s.LastError)
			require.Contains(t, *s.LastError, want)
		}
	})

	t.Run("AbandonedSendReturningLateLeavesTheNextOneWatched", func(t *testing.T) {
		// a ignores its context and returns only once b, which took its
		// worker's place, is running; b ignores its context for good. a's
		// late return must not disarm the watch over b, or the pass never
		// ends and c is never sent.
		t.Parallel()
		b := setup(t)
		ids := b.insert(t, "t", "a", "b", "c")
		cfg := b.cfg
		cfg.SendTimeout = 500 * time.Millisecond
		cfg.PauseAfter = 0 // with one worker, a's abandoned Send would pause the type (TestIsolation)
		lateA, aReturned, release := make(chan struct{}), make(chan struct{}), make(chan struct{})
		t.Cleanup(func() { close(release) })
		rec := newRecorder("t", func(ctx context.Context, m relay.Message) error {
			switch m.Key {
			case "a":
				<-lateA
				defer close(aReturned)
			case "b":
				close(lateA)
				<-aReturned
				<-release
			}
			return nil
		})
		pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		n, err := b.newRelay(t, cfg, rec).Run(pctx)
		require.NoError(t, err, "the pass must end: b is given up like a")
		require.Equal(t, 3, n)
		for _, id := range ids[:2] {
			s := b.state(t, id)
			require.Equal(t, "ERROR", s.Status)
			require.NotNil(t, s.LastError)
			require.Contains(t, *s.LastError, "timed out")
		}
		require.Equal(t, "SENT", b.state(t, ids[2]).Status)
	})

	t.Run("SenderThatEndsItsGoroutineFailsOnlyItsRow", func(t *testing.T) {
		// t.FailNow in a Sender ends the goroutine that calls it: the relay
		// takes its worker over at once, the message fails, the rest go.
		t.Parallel()
		b := setup(t)
		ids := b.insert(t, "t", "ok1", "exit", "ok2")
		cfg := b.cfg
		cfg.SendTimeout = time.Hour // waiting it out would hang the test
		rec := newRecorder("t", func(ctx context.Context, m relay.Message) error {
			if m.Key == "exit" {
				runtime.Goexit()
			}
			return nil
		})
		n, err := b.newRelay(t, cfg, rec).Run(ctx)
		require.NoError(t, err)
		require.Equal(t, 3, n)
		require.Equal(t, "SENT", b.state(t, ids[0]).Status)
		require.Equal(t, "SENT", b.state(t, ids[2]).Status)
		s := b.state(t, ids[1])
		require.Equal(t, "ERROR", s.Status)
		require.Equal(t, 1, s.Attempts)
		require.NotNil(t, s.LastError)
		require.Contains(t, *s.LastError, "runtime.Goexit")
	})

	t.Run("RetriesUntilTheCeilingThenDead", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		id := b.insert(t, "t", "k")[0]
		cfg := b.cfg
		cfg.MaxAttempts = 3
		var calls atomic.Int32
		r := b.newRelay(t, cfg, relay.SenderFunc("t", func(context.Context, relay.Message) error {
			calls.Add(1)
			return errors.New("down")
		}))
		for range 5 {
			_, err := r.Run(ctx)
			require.NoError(t, err)
		}
		require.EqualValues(t, 3, calls.Load(), "a dead row is never selected again")
		s := b.state(t, id)
		require.Equal(t, "ERROR", s.Status)
		require.Equal(t, 3, s.Attempts)
		st := r.Stats()
		require.EqualValues(t, 2, st.Failed)
		require.EqualValues(t, 1, st.Dead)
	})

	t.Run("PermanentErrorIsDeadAtOnce", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		id := b.insert(t, "t", "k")[0]
		r := b.newRelay(t, b.cfg, relay.SenderFunc("t", func(context.Context, relay.Message) error {
			return relay.Permanent(errors.New("422 unprocessable"))
		}))
		n, err := r.Run(ctx)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		s := b.state(t, id)
		require.Equal(t, "ERROR", s.Status)
		require.Equal(t, b.cfg.MaxAttempts, s.Attempts)
		n, err = r.Run(ctx)
		require.NoError(t, err)
		require.Zero(t, n)
	})

	t.Run("RetryBackoffFromTheRowsOwnColumns", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		id := b.insert(t, "t", "k")[0]
		b.exec(t, "UPDATE %s SET status = 'ERROR', attempts = 3, updated_at = now() - interval '3 seconds' WHERE id = $1", id)
		cfg := b.cfg
		cfg.RetryBackoff = time.Second // attempts 3: waits 1s * 2^2 = 4s after updated_at
		rec := newRecorder("t", nil)
		r := b.newRelay(t, cfg, rec)
		n, err := r.Run(ctx)
		require.NoError(t, err)
		require.Zero(t, n, "4s have not passed since the last attempt")

		b.exec(t, "UPDATE %s SET updated_at = now() - interval '5 seconds' WHERE id = $1", id)
		n, err = r.Run(ctx)
		require.NoError(t, err)
		require.Equal(t, 1, n)

		// The cap: even at a huge attempt count the wait never exceeds retryBackoffMax.
		id2 := b.insert(t, "t", "k2")[0]
		b.exec(t, "UPDATE %s SET status = 'ERROR', attempts = 9, updated_at = now() - interval '61 minutes' WHERE id = $1", id2)
		cfg.RetryBackoff = time.Minute
		n, err = b.newRelay(t, cfg, rec).Run(ctx)
		require.NoError(t, err)
		require.Equal(t, 1, n)
	})

	t.Run("OutcomeFencedOnTheStateRead", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		id := b.insert(t, "t", "k")[0]
		r := b.newRelay(t, b.cfg, relay.SenderFunc("t", func(ctx context.Context, m relay.Message) error {
			// A newer writer (an operator, another relay) moves the row on while it is sent.
			b.exec(t, "UPDATE %s SET status = 'ERROR', attempts = 7, last_error = 'newer' WHERE id = $1", m.ID)
			return errors.New("late failure")
		}))
		_, err := r.Run(ctx)
		require.NoError(t, err)
		s := b.state(t, id)
		require.Equal(t, 7, s.Attempts, "the late outcome must not overwrite the newer one")
		require.Equal(t, "newer", *s.LastError)
	})

	t.Run("NoSessionIdleInTransactionWhileSending", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.insert(t, "t", "a", "b", "c")
		var seen []string
		r := b.newRelay(t, b.cfg, relay.SenderFunc("t", func(ctx context.Context, m relay.Message) error {
			conn, err := pgx.Connect(ctx, server().URL)
			if err != nil {
				return err
			}
			defer conn.Close(ctx)
			rows, err := conn.Query(ctx, `SELECT state FROM pg_stat_activity
				WHERE application_name = $1 AND state <> 'idle'`, b.pool.Config().ConnConfig.RuntimeParams["application_name"])
			if err != nil {
				return err
			}
			s, err := pgx.CollectRows(rows, pgx.RowTo[string])
			seen = append(seen, s...)
			return err
		}))
		ran, err := r.RunIfElected(ctx)
		require.NoError(t, err)
		require.True(t, ran)
		require.Equal(t, 3, b.countStatus(t, "SENT"))
		require.Empty(t, seen, "while a sender runs, the relay's sessions are idle: the select ran outside any "+
			"transaction, and no outcome transaction is open")
	})

	t.Run("PerKeyOrderAfterAFailure", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ids := b.insert(t, "t", "k", "other", "k", "k")
		failOnce := true
		rec := newRecorder("t", func(_ context.Context, m relay.Message) error {
			if m.ID == ids[0] && failOnce {
				failOnce = false
				return errors.New("first try fails")
			}
			return nil
		})
		r := b.newRelay(t, b.cfg, rec)
		n, err := r.Run(ctx)
		require.NoError(t, err)
		require.Equal(t, 2, n, "the failed message and the other key; the rest of key k waits")
		require.Equal(t, "PENDING", b.state(t, ids[2]).Status)
		_, err = r.Run(ctx)
		require.NoError(t, err)
		require.Equal(t, []int64{ids[0], ids[1], ids[0], ids[2], ids[3]}, rec.ids())
	})

	t.Run("PerKeyOrderUnderBackoff", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ids := b.insert(t, "t", "k", "k")
		b.exec(t, "UPDATE %s SET status = 'ERROR', attempts = 1 WHERE id = $1", ids[0])
		cfg := b.cfg
		cfg.RetryBackoff = time.Hour
		rec := newRecorder("t", nil)
		n, err := b.newRelay(t, cfg, rec).Run(ctx)
		require.NoError(t, err)
		require.Zero(t, n, "the later message of k waits while the earlier one waits out its backoff")
	})

	t.Run("ErrorTextIsSanitised", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		id := b.insert(t, "t", "k")[0]
		r := b.newRelay(t, b.cfg, relay.SenderFunc("t", func(context.Context, relay.Message) error {
			return errors.New("nul\x00byte \xff" + strings.Repeat("x", 5000))
		}))
		_, err := r.Run(ctx)
		require.NoError(t, err)
		s := b.state(t, id)
		require.Equal(t, "ERROR", s.Status)
		require.LessOrEqual(t, len(*s.LastError), 2000)
		require.True(t, strings.HasPrefix(*s.LastError, "nulbyte \uFFFD"))
	})
}
