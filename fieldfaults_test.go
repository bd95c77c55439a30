package relay_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/xadm/relay"
	"github.com/xadm/relay/internal/testkit/pgserver"
)

// The field faults of issue 9 that one test's own table, pool and sessions can
// reproduce on the shared server. Faults of the whole server (a read-only
// cutover) live in internal/tests/faultstest; the zombie leader in internal/election (zombie_test.go).

// jvmTable is the outbox as the JVM service's own migration creates it: the
// same columns, all nullable, varchar instead of text, a last_error of 255
// characters, timestamps without time zone, no defaults, no indexes.
const jvmTable = `CREATE TABLE %s (
    id          bigserial PRIMARY KEY,
    direction   varchar(3),
    type        varchar(100),
    natural_key varchar(255),
    payload     jsonb,
    status      varchar(20),
    attempts    integer,
    last_error  varchar(255),
    created_at  timestamp,
    updated_at  timestamp,
    sent_at     timestamp
)`

// jvmTableOf makes a table as the JVM's migration makes it (jvmTable), dropped
// after the test, and returns its name.
func jvmTableOf(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	table := pgserver.Name(t)
	_, err := pool.Exec(context.Background(), fmt.Sprintf(jvmTable, table))
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP TABLE "+table) })
	return table
}

// TestTableOfAnotherMigration delivers from a table the JVM's migration made,
// holding rows no Go producer would write: a row with a NULL in any column,
// or an impossible value, affects only itself.
func TestTableOfAnotherMigration(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPool(t, 6)
	table := jvmTableOf(t, pool)

	insert := func(key, cols, vals string) int64 {
		t.Helper()
		var id int64
		require.NoError(t, pool.QueryRow(ctx, "INSERT INTO "+table+" ("+cols+") VALUES ("+vals+") RETURNING id").Scan(&id),
			"row %s", key)
		return id
	}
	const full = "direction, type, natural_key, payload, status, attempts, created_at, updated_at"
	healthy := insert("healthy", full, "'OUT', 't', 'healthy', '{}', 'PENDING', 0, now(), now()")
	nullKey := insert("null key", full, "'OUT', 't', NULL, '{}', 'PENDING', 0, now(), now()")
	nullCreated := insert("null created_at", full, "'OUT', 't', 'null-created', '{}', 'PENDING', 0, NULL, now()")
	infinite := insert("infinite created_at", full, "'OUT', 't', 'infinite', '{}', 'PENDING', 0, 'infinity', now()")
	nullAttempts := insert("null attempts", full, "'OUT', 't', 'null-attempts', '{}', 'PENDING', NULL, now(), now()")
	nullStatus := insert("null status", full, "'OUT', 't', 'null-status', '{}', NULL, 0, now(), now()")
	nullPayload := insert("null payload", full, "'OUT', 't', 'null-payload', NULL, 'PENDING', 0, now(), now()")
	nullUpdated := insert("failed, null updated_at", full, "'OUT', 't', 'null-updated', '{}', 'ERROR', 1, now(), NULL")
	longError := insert("long error", full, "'OUT', 't', 'long-error', '{}', 'PENDING', 0, now(), now()")
	bare := insert("bare", "direction, type, natural_key, payload", "'OUT', 't', 'bare', '{}'")

	var logs logBuffer
	cfg := relay.DefaultConfig()
	cfg.AppName, cfg.Table, cfg.Logger = table, table, logs.Logger()
	var mu sync.Mutex
	sends := map[int64]int{}
	r, err := relay.New(pool, cfg, relay.SenderFunc("t", func(_ context.Context, m relay.Message) error {
		mu.Lock()
		sends[m.ID]++
		mu.Unlock()
		if m.Key == "long-error" {
			return errors.New("HTTP 500: " + strings.Repeat("é", 1000)) // far past varchar(255)
		}
		return nil
	}))
	require.NoError(t, err)
	n, err := r.Run(ctx)
	require.NoError(t, err, "no row's content makes the pass fail")
	require.Equal(t, 10, n)

	type rowState struct {
		status    *string
		attempts  *int
		lastError *string
	}
	state := func(id int64) rowState {
		var s rowState
		require.NoError(t, pool.QueryRow(ctx, "SELECT status, attempts, last_error FROM "+table+" WHERE id = $1", id).
			Scan(&s.status, &s.attempts, &s.lastError))
		return s
	}
	for _, id := range []int64{healthy, nullCreated, infinite, nullAttempts, nullStatus, nullUpdated, bare} {
		s := state(id)
		require.Equal(t, "SENT", *s.status, "row %d is delivered", id)
		require.Equal(t, 1, sends[id], "row %d", id)
	}
	for id, column := range map[int64]string{nullKey: "natural_key", nullPayload: "payload"} {
		s := state(id)
		require.Equal(t, "ERROR", *s.status, "row %d is dead", id)
		require.Equal(t, cfg.MaxAttempts, *s.attempts)
		require.Contains(t, *s.lastError, column, "last_error names the column")
		require.Zero(t, sends[id], "row %d is never sent", id)
	}
	s := state(longError)
	require.Equal(t, "ERROR", *s.status)
	require.Equal(t, 1, *s.attempts, "the failure is recorded, so the row can die")
	require.Equal(t, 255, len([]rune(*s.lastError)), "the failure's text fits varchar(255)")
	require.True(t, strings.HasPrefix(*s.lastError, "HTTP 500: éé"))
	require.Equal(t, 2, strings.Count(logs.String(), "row cannot be delivered; marked dead without sending"), "each bad row is logged once")

	// A second pass right away: the failed row waits out its backoff, nothing is sent again.
	_, err = r.Run(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, sends[longError], "sent once per backoff step, never in a storm")
}

// TestTableChecked names a missing table or missing columns before any pass.
func TestTableChecked(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPool(t, 4)
	cfg := relay.DefaultConfig()
	cfg.AppName = pgserver.Name(t)
	cfg.Table = pgserver.Name(t)
	r, err := relay.New(pool, cfg, relay.SenderFunc("t", func(context.Context, relay.Message) error { return nil }))
	require.NoError(t, err)
	_, err = r.Run(ctx)
	require.ErrorContains(t, err, "does not exist")
	require.ErrorContains(t, err, "relay.CreateTable")

	_, err = pool.Exec(ctx, "CREATE TABLE "+cfg.Table+" (id bigserial PRIMARY KEY, type text, natural_key text, payload jsonb, status text)")
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP TABLE "+cfg.Table) })
	_, err = r.Run(ctx)
	require.ErrorContains(t, err, "lacks the column(s) direction, attempts, last_error, created_at, updated_at, sent_at")
}

// TestUserCodeCannotKillTheRelay panics in every callback the adopter writes,
// and returns a typed nil from a Sender: the relay goes on, and each message
// gets the outcome its sender gave.
func TestUserCodeCannotKillTheRelay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("PanickingObserverAndLogger", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.insert(t, "t", "a", "b", "c")
		cfg := b.cfg
		cfg.Observer = panickingObserver{}
		cfg.Logger = slog.New(panickingHandler{})
		rec := newRecorder("t", nil)
		r := b.newRelay(t, cfg, rec)
		require.NoError(t, r.Start(ctx))
		require.Eventually(t, func() bool { return b.countStatus(t, "SENT") == 3 }, 10*time.Second, 10*time.Millisecond)
		b.insert(t, "t", "d")
		require.Eventually(t, func() bool { return b.countStatus(t, "SENT") == 4 }, 10*time.Second, 10*time.Millisecond,
			"the loop goes on after the panics")
		require.NoError(t, r.Stop(ctx))
		require.EqualValues(t, 4, r.Stats().Sent)
	})

	t.Run("TypedNilErrorIsAFailure", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		id := b.insert(t, "t", "a")[0]
		r := b.newRelay(t, b.cfg, relay.SenderFunc("t", func(context.Context, relay.Message) error {
			var e *brokenError // a nil pointer in a non-nil interface
			return e
		}))
		_, err := r.Run(ctx)
		require.NoError(t, err)
		s := b.state(t, id)
		require.Equal(t, "ERROR", s.Status, "a typed nil is not a success")
		require.Contains(t, *s.LastError, "typed nil")
	})

	t.Run("ErrorWhoseMethodsPanic", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		id := b.insert(t, "t", "a")[0]
		r := b.newRelay(t, b.cfg, relay.SenderFunc("t", func(context.Context, relay.Message) error {
			return &brokenError{}
		}))
		_, err := r.Run(ctx)
		require.NoError(t, err)
		require.Equal(t, "ERROR", b.state(t, id).Status)
	})

	t.Run("PanickingType", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		_, err := relay.New(b.pool, b.cfg, panickingType{})
		require.ErrorContains(t, err, "its Type method panicked")
	})

	t.Run("PanickingGuard", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		cfg := b.cfg
		cfg.Guard = panickingGuard{}
		r := b.newRelay(t, cfg, newRecorder("t", nil))
		ran, err := r.RunIfElected(ctx)
		require.False(t, ran)
		require.ErrorContains(t, err, "the election panicked")
	})
}

type panickingObserver struct{}

func (panickingObserver) PassDone(relay.PassReport)       { panic("observer bug in PassDone") }
func (panickingObserver) MessageDone(relay.MessageReport) { panic("observer bug in MessageDone") }

type panickingHandler struct{}

func (panickingHandler) Enabled(context.Context, slog.Level) bool  { return true }
func (panickingHandler) Handle(context.Context, slog.Record) error { panic("handler bug") }
func (h panickingHandler) WithAttrs([]slog.Attr) slog.Handler      { return h }
func (h panickingHandler) WithGroup(string) slog.Handler           { return h }

// brokenError's methods dereference its fields: on a nil pointer they panic.
type brokenError struct{ msg *string }

func (e *brokenError) Error() string { return *e.msg }

type panickingType struct{}

func (panickingType) Type() string                              { panic("sender bug") }
func (panickingType) Send(context.Context, relay.Message) error { return nil }

type panickingGuard struct{}

func (panickingGuard) TryRun(context.Context, string, func(context.Context) error) (bool, error) {
	panic("guard bug")
}

// TestRetryForEver runs a row far past 1024 attempts under a backoff, with the
// widest ceiling the column allows: no overflow, the row is retried.
func TestRetryForEver(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	id := b.insert(t, "t", "a")[0]
	b.exec(t, "UPDATE %s SET status = 'ERROR', attempts = 5000, updated_at = now() - interval '2 hours'")
	cfg := b.cfg
	cfg.MaxAttempts = math.MaxInt32
	cfg.RetryBackoff = time.Millisecond // capped at retryBackoffMax (1h): 2 hours ago is past it
	rec := newRecorder("t", func(context.Context, relay.Message) error { return errors.New("still down") })
	n, err := b.newRelay(t, cfg, rec).Run(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, 5001, b.state(t, id).Attempts)

	cfg.MaxAttempts = math.MaxInt32 + 1
	_, err = relay.New(b.pool, cfg, rec)
	var fe *relay.FieldError
	require.ErrorAs(t, err, &fe)
	require.Equal(t, "MaxAttempts", fe.Field)
}

// TestAppNameRefusedWhenItWouldSplitTheElection: names that differ from
// what every other replica (and the JVM) types are refused, not trimmed.
func TestAppNameRefusedWhenItWouldSplitTheElection(t *testing.T) {
	t.Parallel()
	pool := newPool(t, 2)
	for _, name := range []string{"billing ", " billing", "bill\x00ing", "billing\n", "bill\xffing", ""} {
		cfg := relay.DefaultConfig()
		cfg.AppName = name
		_, err := relay.New(pool, cfg, newRecorder("t", nil))
		var fe *relay.FieldError
		require.ErrorAs(t, err, &fe, "%q", name)
		require.Equal(t, "AppName", fe.Field)
	}
	var logs logBuffer
	cfg := relay.DefaultConfig()
	cfg.Logger = logs.Logger()
	_, err := relay.New(pool, cfg, newRecorder("t", nil))
	require.NoError(t, err)
	require.Contains(t, logs.String(), `AppName is the default \"app\"`)
}

// TestStarvedPool: the service's own code holds the pool's connections. A
// send starts only once the connection its outcome will be written on is
// held, so a starved pool costs no duplicate: a pass, or a worker, that cannot
// get its connection sends nothing, and the pass says the pool is what
// stopped it.
func TestStarvedPool(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	ids := b.insert(t, "t", distinctKeys("k", 16)...)
	pool := pgserver.Pool(t, server().URL, pgserver.Name(t), 4)
	var release sync.Once
	released := make(chan struct{})
	t.Cleanup(func() { release.Do(func() { close(released) }) }) // before the pool closes
	var serviceDone sync.WaitGroup
	// The service's own code takes connections as they come free and keeps them.
	starve := func(n int) {
		for range n {
			serviceDone.Add(1)
			go func() {
				defer serviceDone.Done()
				c, err := pool.Acquire(context.Background())
				if err != nil {
					return
				}
				<-released
				c.Release()
			}()
		}
	}
	l := newLedger()
	cfg := b.cfg
	cfg.Concurrency = 8
	cfg.Observer = l
	var first sync.Once
	r, err := relay.New(pool, cfg, relay.SenderFunc("t", func(ctx context.Context, m relay.Message) error {
		return l.send(ctx, m, func(context.Context, relay.Message) error {
			first.Do(func() { starve(4) }) // mid-pass: the pass keeps the connections it holds
			return nil
		})
	}))
	require.NoError(t, err)
	_, err = r.RunIfElected(ctx)
	if err != nil { // a worker started after the starvation got no connection for its outcomes, and sent nothing
		require.ErrorIs(t, err, relay.ErrPoolExhausted)
	}
	for _, c := range l.calls() {
		require.Equal(t, "SENT", b.state(t, c.id).Status, "row %d: every message sent had its outcome recorded", c.id)
	}
	require.Eventually(t, func() bool { return poolFullyTaken(pool) }, 10*time.Second, 5*time.Millisecond)

	// The next pass finds every connection taken: it sends nothing, and says why.
	more := b.insert(t, "t", distinctKeys("more", 4)...)
	ids = append(ids, more...)
	before := len(l.calls())
	_, err = r.RunIfElected(ctx)
	require.ErrorIs(t, err, relay.ErrPoolExhausted, "the pass says the pool starved it")
	require.ErrorContains(t, err, "all 4 connections of the pool are in use")
	require.Len(t, l.calls(), before, "nothing is sent without a connection for its outcome")

	release.Do(func() { close(released) })
	serviceDone.Wait()
	drainElected(t, b, r)
	for _, id := range ids {
		require.Equal(t, 1, l.accepted()[id], "row %d is delivered exactly once", id)
	}
}

// poolFullyTaken reports whether every connection the pool may open is acquired.
func poolFullyTaken(p *pgxpool.Pool) bool {
	st := p.Stat()
	return st.AcquiredConns() == st.MaxConns()
}

// TestErrorsKeepTheirChain: a pass's error wraps the server's *pgconn.PgError,
// whose SQLSTATE a caller can read.
func TestErrorsKeepTheirChain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	// The relay's role may read and update the table when it starts, and is
	// refused UPDATE once its first pass checked its grants (grants.go): the
	// outcome's own refusal.
	role := pgserver.Name(t)
	b.exec(t, "SELECT 1 FROM %s LIMIT 0")
	_, err := b.pool.Exec(ctx, "CREATE ROLE "+role+" LOGIN")
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = b.pool.Exec(context.Background(), "DROP OWNED BY "+role)
		_, _ = b.pool.Exec(context.Background(), "DROP ROLE "+role)
	})
	b.exec(t, "GRANT SELECT, UPDATE ON %s TO "+role)
	pool := pgserver.Pool(t, server().URL, pgserver.Name(t), 4, func(pc *pgxpool.Config) { pc.ConnConfig.User = role })
	sends := 0
	r, err := relay.New(pool, b.cfg, relay.SenderFunc("t", func(context.Context, relay.Message) error { sends++; return nil }))
	require.NoError(t, err)
	_, err = r.RunIfElected(ctx)
	require.NoError(t, err)
	b.exec(t, "REVOKE UPDATE ON %s FROM "+role)
	b.insert(t, "t", "a")
	_, err = r.RunIfElected(ctx)
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "42501", pgErr.Code)
	require.ErrorContains(t, err, "permission denied: the relay's role needs SELECT and UPDATE")
	require.Equal(t, 1, sends)
	_, err = r.RunIfElected(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, sends, "the message whose outcome was refused is not sent again before its backoff step")
}

// TestBatchBytes bounds a batch by its payloads' bytes: large rows go a few at
// a time, in several selects of one pass, and a row larger than the bound
// alone is marked dead unsent. A batch cut by the bound does not end Run: it
// takes its BatchSize rows in as many selects as it needs.
func TestBatchBytes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const mib = 1 << 20
	setupBig := func(t *testing.T) (*bundle, relay.Config, string) {
		b := setup(t)
		for i := range 5 { // five rows of ~3 MiB, stored compressed
			b.exec(t, fmt.Sprintf(`INSERT INTO %%s (type, natural_key, payload) VALUES ('t', 'big%d', jsonb_build_object('data', repeat('x', %d)))`, i, 3*mib))
		}
		huge := pgserver.Name(t)
		b.exec(t, fmt.Sprintf(`INSERT INTO %%s (type, natural_key, payload) VALUES ('t', '%s', jsonb_build_object('data', repeat('y', %d)))`, huge, 9*mib))
		b.insert(t, "t", "small1", "small2") // behind the large ones
		cfg := b.cfg
		cfg.BatchBytes = 8 * mib
		return b, cfg, huge
	}
	sender := func(t *testing.T, sent *[]string) relay.Sender {
		var mu sync.Mutex
		return relay.SenderFunc("t", func(_ context.Context, m relay.Message) error {
			mu.Lock()
			defer mu.Unlock()
			*sent = append(*sent, m.Key)
			require.Less(t, len(m.Payload), 8*mib)
			return nil
		})
	}

	t.Run("OneRunTakesItsBatchInSeveralSelects", func(t *testing.T) {
		t.Parallel()
		b, cfg, huge := setupBig(t)
		var sent []string
		r := b.newRelay(t, cfg, sender(t, &sent))
		n, err := r.Run(ctx)
		require.NoError(t, err)
		require.Equal(t, 8, n, "five large rows, the one too large (dead) and the small rows behind them, in one Run")
		require.Equal(t, []string{"big0", "big1", "big2", "big3", "big4", "small1", "small2"}, sent)
		require.Equal(t, 7, b.countStatus(t, "SENT"))
		var lastError string
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT last_error FROM "+pgx.Identifier{b.table}.Sanitize()+" WHERE natural_key = $1", huge).Scan(&lastError))
		require.Contains(t, lastError, "payload is")
		require.Contains(t, lastError, "above Config.BatchBytes")
	})

	t.Run("RunStopsAtBatchSize", func(t *testing.T) {
		t.Parallel()
		b, cfg, _ := setupBig(t)
		cfg.BatchSize = 3
		var sent []string
		r := b.newRelay(t, cfg, sender(t, &sent))
		n, err := r.Run(ctx)
		require.NoError(t, err)
		require.Equal(t, 3, n, "BatchSize rows, in two selects (8 MiB holds two rows of 3 MiB)")
		require.Equal(t, []string{"big0", "big1", "big2"}, sent)
		require.Equal(t, 5, b.countStatus(t, "PENDING"))
	})
}

// TestPassIgnoresDeadAndForeignRows: a pass beside dead rows and another
// app's backlog sends the live rows of its own types only. (That its select
// never reads the others, by the buffers its plan touches, is internal/store's
// TestFetchCostIgnoresDeadAndForeignRows.)
func TestPassIgnoresDeadAndForeignRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	b.exec(t, `INSERT INTO %s (type, natural_key, payload, status, attempts)
		SELECT 't', 'dead' || g, '{}', 'ERROR', 10 FROM generate_series(1, 20000) g`)
	b.exec(t, `INSERT INTO %s (type, natural_key, payload)
		SELECT 'other', 'other' || g, '{}' FROM generate_series(1, 20000) g`)
	b.insert(t, "t", distinctKeys("live", 10)...)
	b.exec(t, "ANALYZE %s")
	var observed atomic.Int64
	r := b.newRelay(t, b.cfg, relay.SenderFunc("t", func(context.Context, relay.Message) error { observed.Add(1); return nil }))
	n, err := r.Run(ctx)
	require.NoError(t, err)
	require.Equal(t, 10, n)
	require.EqualValues(t, 10, observed.Load())
}

// TestDefaultsSurviveAnOutage: with the default MaxAttempts and RetryBackoff,
// a message dies only after 1022s of failures (2 + 4 + ... + 512), so a
// destination down for 15 minutes loses nothing. The schedule is checked at
// the defaults (TestDefaultRetriesOutlastAnOutage, beside retryBackoffMax),
// and lived here at a hundredth of the scale (RetryBackoff 20ms: a message
// dies after 10.2s) through a destination down for 9s: nothing dies, and
// every key arrives in id order.
func TestDefaultsSurviveAnOutage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	var keys []string
	for i := range 50 {
		keys = append(keys, fmt.Sprintf("k%d", i%10)) // five messages per key
	}
	b.insert(t, "t", keys...)
	var down atomic.Bool
	down.Store(true)
	var mu sync.Mutex
	lastByKey := map[string]int64{}
	var outOfOrder []string
	cfg := b.cfg
	cfg.RetryBackoff = 20 * time.Millisecond // a hundredth of the default
	cfg.Interval = 20 * time.Millisecond
	r := b.newRelay(t, cfg, relay.SenderFunc("t", func(_ context.Context, m relay.Message) error {
		if down.Load() {
			return errors.New("503 Service Unavailable")
		}
		mu.Lock()
		defer mu.Unlock()
		if m.ID < lastByKey[m.Key] {
			outOfOrder = append(outOfOrder, fmt.Sprintf("%s: %d after %d", m.Key, m.ID, lastByKey[m.Key]))
		}
		lastByKey[m.Key] = m.ID
		return nil
	}))
	require.NoError(t, r.Start(ctx))
	deadline := time.Now().Add(9 * time.Second) // the outage, at a hundredth of 15 minutes
	for time.Now().Before(deadline) {
		require.Zero(t, b.deadCount(t, cfg.MaxAttempts), "no message dies during the outage")
		time.Sleep(100 * time.Millisecond)
	}
	down.Store(false)
	require.Eventually(t, func() bool { return b.countStatus(t, "SENT") == 50 }, 20*time.Second, 10*time.Millisecond)
	require.NoError(t, r.Stop(ctx))
	require.Empty(t, outOfOrder, "a retry never lets a later message of its key overtake it")
}

// TestStopAfterFailuresLogsNoRecovery: a Stop that ends a failing streak does
// not claim that passes succeed again.
func TestStopAfterFailuresLogsNoRecovery(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var logs logBuffer
	cfg := relay.DefaultConfig()
	cfg.AppName, cfg.Table = pgserver.Name(t), pgserver.Name(t) // no such table: every pass fails
	cfg.Interval = 10 * time.Millisecond
	cfg.Logger = logs.Logger()
	r, err := relay.New(newPool(t, 4), cfg, newRecorder("t", nil))
	require.NoError(t, err)
	require.NoError(t, r.Start(ctx))
	require.Eventually(t, func() bool { return r.Stats().PassesFailed >= 2 }, 10*time.Second, 5*time.Millisecond)
	require.NoError(t, r.Stop(ctx))
	require.NotContains(t, logs.String(), "passes succeed again")
}
