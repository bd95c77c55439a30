package relay_test

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
)

// adminCeiling is the MaxAttempts of the admin tests.
const adminCeiling = 3

// newAdmin returns b's Admin, with the relays' adminCeiling, acting on every
// type (these tests run no started relay to learn an app's types from).
func (b *bundle) newAdmin(t *testing.T) *relay.Admin {
	t.Helper()
	b.cfg.MaxAttempts = adminCeiling
	a, err := relay.NewAdmin(b.pool, b.cfg, relay.AdminAllTypes())
	require.NoError(t, err)
	return a
}

// rows of every kind the admin must tell apart, keyed by what they are.
type adminRows struct {
	pending, retrying, dead, deadNoError, sentOld, sentNew, inboundDead, otherDead int64
}

// seed writes one row of each kind: type "t" unless said otherwise.
func (b *bundle) seedAdmin(t *testing.T) adminRows {
	t.Helper()
	ids := b.insert(t, "t", "pending", "retrying", "dead", "dead-no-error", "sent-old", "sent-new", "inbound-dead")
	other := b.insert(t, "u", "other-dead")
	f := adminRows{ids[0], ids[1], ids[2], ids[3], ids[4], ids[5], ids[6], other[0]}
	b.exec(t, "UPDATE %s SET status = 'ERROR', attempts = $2, last_error = 'boom' WHERE id = $1", f.retrying, adminCeiling-1)
	b.exec(t, "UPDATE %s SET status = 'ERROR', attempts = $2, last_error = 'boom' WHERE id = ANY($1)",
		[]int64{f.dead, f.otherDead}, adminCeiling)
	b.exec(t, "UPDATE %s SET status = 'ERROR', attempts = $2 WHERE id = $1", f.deadNoError, adminCeiling+5) // written by hand, above the adminCeiling
	b.exec(t, "UPDATE %s SET status = 'SENT', sent_at = now() - interval '2 days' WHERE id = $1", f.sentOld)
	b.exec(t, "UPDATE %s SET status = 'SENT', sent_at = now() - interval '1 minute' WHERE id = $1", f.sentNew)
	b.exec(t, "UPDATE %s SET direction = 'IN', status = 'ERROR', attempts = $2 WHERE id = $1", f.inboundDead, adminCeiling)
	return f
}

func (b *bundle) rowExists(t *testing.T, id int64) bool {
	t.Helper()
	var ok bool
	require.NoError(t, b.pool.QueryRow(context.Background(),
		"SELECT EXISTS (SELECT 1 FROM "+pgx.Identifier{b.table}.Sanitize()+" WHERE id = $1)", id).Scan(&ok))
	return ok
}

func TestNewAdmin(t *testing.T) {
	t.Parallel()
	pool := newPool(t, 2)
	_, err := relay.NewAdmin(nil, relay.DefaultConfig())
	require.ErrorContains(t, err, "nil")
	_, err = relay.NewAdmin(pool, relay.Config{Table: "t", MaxAttempts: 3})
	require.ErrorContains(t, err, "relay.DefaultConfig()")
	cfg := relay.DefaultConfig()
	cfg.Table = "a.b.c"
	_, err = relay.NewAdmin(pool, cfg)
	var fe *relay.FieldError
	require.ErrorAs(t, err, &fe)
	require.Equal(t, "Table", fe.Field)
	cfg = relay.DefaultConfig()
	cfg.MaxAttempts = 0
	_, err = relay.NewAdmin(pool, cfg)
	require.ErrorContains(t, err, "Config.MaxAttempts")
}

func TestAdminCountByStatus(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.seedAdmin(t)
	b.insert(t, "t", "pending-2")
	counts, err := b.newAdmin(t).CountByStatus(context.Background())
	require.NoError(t, err)
	require.Equal(t, []relay.StatusCount{
		{Type: "t", Status: "ERROR", Dead: false, Count: 1},
		{Type: "t", Status: "ERROR", Dead: true, Count: 2},
		{Type: "t", Status: "PENDING", Dead: false, Count: 2},
		{Type: "t", Status: "SENT", Dead: false, Count: 2},
		{Type: "u", Status: "ERROR", Dead: true, Count: 1},
	}, counts, "outbound rows only, dead apart from the ERROR rows still retried")

	empty := setup(t)
	counts, err = empty.newAdmin(t).CountByStatus(context.Background())
	require.NoError(t, err)
	require.Empty(t, counts)
}

func TestAdminListDead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	f := b.seedAdmin(t)
	a := b.newAdmin(t)

	dead, err := a.ListDead(ctx, 10)
	require.NoError(t, err)
	require.Len(t, dead, 3)
	require.Equal(t, []int64{f.dead, f.deadNoError, f.otherDead}, []int64{dead[0].ID, dead[1].ID, dead[2].ID}, "oldest first")
	d := dead[0]
	require.Equal(t, "t", d.Type)
	require.Equal(t, "dead", d.Key)
	require.Equal(t, adminCeiling, d.Attempts)
	require.Equal(t, "boom", d.LastError)
	require.WithinDuration(t, time.Now(), d.UpdatedAt, time.Minute)
	require.Equal(t, "", dead[1].LastError, "a NULL last_error is empty")
	require.Equal(t, adminCeiling+5, dead[1].Attempts)

	dead, err = a.ListDead(ctx, 2)
	require.NoError(t, err)
	require.Len(t, dead, 2, "bounded by the limit")
	require.Equal(t, f.dead, dead[0].ID)

	for _, limit := range []int{0, -1, relay.ListDeadMax + 1} {
		_, err = a.ListDead(ctx, limit)
		require.ErrorContains(t, err, "limit must be between 1 and")
	}
}

func TestAdminRequeue(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	// untouched checks that the rows that were not dead kept their state.
	untouched := func(t *testing.T, b *bundle, f adminRows) {
		t.Helper()
		require.Equal(t, "PENDING", b.state(t, f.pending).Status)
		s := b.state(t, f.retrying)
		require.Equal(t, "ERROR", s.Status)
		require.Equal(t, adminCeiling-1, s.Attempts, "an ERROR row below the adminCeiling is live: left to the relay")
		require.Equal(t, "SENT", b.state(t, f.sentOld).Status)
		s = b.state(t, f.inboundDead)
		require.Equal(t, "ERROR", s.Status, "inbound rows are not the relay's")
		require.Equal(t, adminCeiling, s.Attempts)
	}
	requeued := func(t *testing.T, b *bundle, id int64) {
		t.Helper()
		s := b.state(t, id)
		require.Equal(t, "ERROR", s.Status, "a re-queued row is a failed one with 0 attempts, due at once (decision 0041)")
		require.Zero(t, s.Attempts)
	}

	t.Run("All", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		f := b.seedAdmin(t)
		a := b.newAdmin(t)
		n, err := a.RequeueAll(ctx)
		require.NoError(t, err)
		require.EqualValues(t, 3, n)
		for _, id := range []int64{f.dead, f.deadNoError, f.otherDead} {
			requeued(t, b, id)
		}
		require.Equal(t, "boom", *b.state(t, f.dead).LastError, "last_error is kept for the record")
		untouched(t, b, f)

		n, err = a.RequeueAll(ctx)
		require.NoError(t, err)
		require.Zero(t, n, "nothing is dead any more")
	})

	t.Run("ByType", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		f := b.seedAdmin(t)
		a := b.newAdmin(t)
		n, err := a.RequeueType(ctx, "u")
		require.NoError(t, err)
		require.EqualValues(t, 1, n)
		requeued(t, b, f.otherDead)
		require.Equal(t, "ERROR", b.state(t, f.dead).Status, "other types stay dead")
		untouched(t, b, f)

		n, err = a.RequeueType(ctx, "nope")
		require.NoError(t, err)
		require.Zero(t, n)
		_, err = a.RequeueType(ctx, " ")
		require.ErrorContains(t, err, "type must not be empty")
	})

	t.Run("ByIDs", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		f := b.seedAdmin(t)
		a := b.newAdmin(t)
		n, err := a.RequeueIDs(ctx, f.dead, f.retrying, f.pending, f.sentOld, f.inboundDead, 1<<40)
		require.NoError(t, err)
		require.EqualValues(t, 1, n, "only the dead row among the ids")
		requeued(t, b, f.dead)
		require.Equal(t, "ERROR", b.state(t, f.otherDead).Status)
		untouched(t, b, f)

		n, err = a.RequeueIDs(ctx)
		require.NoError(t, err)
		require.Zero(t, n, "no ids re-queues nothing, not everything")
		require.Equal(t, "ERROR", b.state(t, f.otherDead).Status)
	})

	t.Run("ThenRunDelivers", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ids := b.insert(t, "t", "a", "b")
		var fail atomic.Bool
		fail.Store(true)
		rec := newRecorder("t", func(context.Context, relay.Message) error {
			if fail.Load() {
				return relay.Permanent(errors.New("422 unprocessable"))
			}
			return nil
		})
		a := b.newAdmin(t) // sets b.cfg.MaxAttempts to the adminCeiling
		r := b.newRelay(t, b.cfg, rec)
		n, err := r.Run(ctx)
		require.NoError(t, err)
		require.Equal(t, 2, n)
		dead, err := a.ListDead(ctx, 10)
		require.NoError(t, err)
		require.Len(t, dead, 2)
		require.Contains(t, dead[0].LastError, "422 unprocessable")

		n, err = r.Run(ctx)
		require.NoError(t, err)
		require.Zero(t, n, "dead rows are never selected")

		fail.Store(false) // the destination is fixed
		m, err := a.RequeueAll(ctx)
		require.NoError(t, err)
		require.EqualValues(t, 2, m)
		n, err = r.Run(ctx)
		require.NoError(t, err)
		require.Equal(t, 2, n)
		for _, id := range ids {
			require.Equal(t, "SENT", b.state(t, id).Status)
		}
		require.Len(t, rec.ids(), 4, "sent twice each: once dead, once after the re-queue")
	})
}

func TestAdminPurgeSent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("OnlyOldSentRows", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		f := b.seedAdmin(t)
		b.exec(t, "UPDATE %s SET direction = 'IN', status = 'SENT', sent_at = now() - interval '3 days' WHERE id = $1", f.pending)
		a := b.newAdmin(t)
		n, err := a.PurgeSent(ctx, 24*time.Hour)
		require.NoError(t, err)
		require.EqualValues(t, 1, n)
		require.False(t, b.rowExists(t, f.sentOld))
		for _, id := range []int64{f.pending, f.retrying, f.dead, f.deadNoError, f.sentNew, f.inboundDead, f.otherDead} {
			require.True(t, b.rowExists(t, id), "row %d: recent SENT, live, dead and inbound rows stay", id)
		}

		n, err = a.PurgeSent(ctx, 0)
		require.NoError(t, err)
		require.EqualValues(t, 1, n, "retention 0 purges every outbound SENT row")
		require.False(t, b.rowExists(t, f.sentNew))
		require.True(t, b.rowExists(t, f.pending), "an inbound SENT row is not the relay's")

		_, err = a.PurgeSent(ctx, -time.Second)
		require.ErrorContains(t, err, "retention must not be negative")
	})

	t.Run("InChunks", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		const old = 2*relay.PurgeChunk + 17
		b.exec(t, `INSERT INTO %s (type, natural_key, payload, status, sent_at)
			SELECT 't', 'k' || g, '{}', 'SENT', now() - interval '2 days' FROM generate_series(1, $1) g`, old)
		live := b.insert(t, "t", "live")
		a := b.newAdmin(t)
		n, err := a.PurgeSent(ctx, time.Hour)
		require.NoError(t, err)
		require.EqualValues(t, old, n)
		require.Zero(t, b.countStatus(t, "SENT"))
		require.True(t, b.rowExists(t, live[0]))
	})

	t.Run("StopsWhenCancelled", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		_, err := b.newAdmin(t).PurgeSent(cctx, time.Hour)
		require.ErrorIs(t, err, context.Canceled)
	})
}

// TestAdminWhileRelaysDeliver runs re-queue, purge, count and list in a loop
// while two replicas drain: no row is lost, nothing fails, and no outcome
// finds its row changed under it.
func TestAdminWhileRelaysDeliver(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	const rows = 300
	keys := make([]string, rows)
	for i := range keys {
		keys[i] = fmt.Sprintf("k%03d", i)
	}
	b.insert(t, "t", keys...)

	// Every fifth key fails permanently on its first send: it dies, and only
	// a re-queue brings it back.
	var mu sync.Mutex
	seen := map[string]int{}
	delivered := map[string]bool{}
	send := func(_ context.Context, m relay.Message) error {
		mu.Lock()
		defer mu.Unlock()
		seen[m.Key]++
		var i int
		_, _ = fmt.Sscanf(m.Key, "k%d", &i)
		if i%5 == 0 && seen[m.Key] == 1 {
			return relay.Permanent(errors.New("rejected once"))
		}
		delivered[m.Key] = true
		return nil
	}
	deliveredAll := func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(delivered) == rows
	}

	var logs logBuffer
	a := b.newAdmin(t)
	cfg := b.cfg
	cfg.BatchSize = 10
	cfg.Logger = logs.Logger()
	var replicas []*relay.Relay
	for range 2 {
		r, err := relay.New(newPool(t, 4), cfg, relay.SenderFunc("t", send))
		require.NoError(t, err)
		replicas = append(replicas, r)
	}

	done := make(chan struct{})
	var wg sync.WaitGroup
	var requeued, purged atomic.Int64
	// Failures in these goroutines are reported with t.Error, which, unlike
	// require, is safe off the test's goroutine.
	for _, r := range replicas {
		wg.Go(func() {
			for !deliveredAll() {
				if _, err := r.RunIfElected(ctx); err != nil {
					t.Errorf("pass: %v", err)
					return
				}
				time.Sleep(time.Millisecond)
			}
		})
	}
	admin := func(name string, op func() error) {
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				case <-time.After(time.Millisecond):
				}
				if err := op(); err != nil {
					t.Errorf("%s: %v", name, err)
					return
				}
			}
		})
	}
	admin("RequeueAll", func() error { n, err := a.RequeueAll(ctx); requeued.Add(n); return err })
	admin("PurgeSent", func() error { n, err := a.PurgeSent(ctx, 0); purged.Add(n); return err })
	admin("CountByStatus", func() error { _, err := a.CountByStatus(ctx); return err })
	admin("ListDead", func() error { _, err := a.ListDead(ctx, 100); return err })

	require.Eventually(t, deliveredAll, 30*time.Second, 10*time.Millisecond, "every message is delivered")
	close(done)
	wg.Wait()

	n, err := a.PurgeSent(ctx, 0)
	require.NoError(t, err)
	purged.Add(n)
	require.EqualValues(t, rows/5, requeued.Load(), "each poisoned row re-queued exactly once")
	require.EqualValues(t, rows, purged.Load(), "every row ended SENT, and was purged exactly once")
	counts, err := a.CountByStatus(ctx)
	require.NoError(t, err)
	require.Empty(t, counts)
	require.NotContains(t, logs.String(), "outcome not recorded", "no re-queue touched a row in flight")
	require.NotContains(t, logs.String(), "pass failed")
}

// TestAdminRequeuedAtColumn: on a table without the optional requeued_at
// column (the JVM's migration), the Admin counts, re-queues and draws as
// before, a re-queued row waiting since its re-queue (its last update); CreateTable adds the column to
// the table as it is, and from then on a re-queue says when, and the row
// waits since. A second CreateTable finds the column and changes nothing.
func TestAdminRequeuedAtColumn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	table := jvmTableOf(t, b.pool)
	cfg := b.cfg
	cfg.Table, cfg.MaxAttempts = table, adminCeiling
	a, err := relay.NewAdmin(b.pool, cfg, relay.AdminAllTypes())
	require.NoError(t, err)
	dead := func() {
		_, err := b.pool.Exec(ctx, `INSERT INTO `+table+` (direction, type, natural_key, payload, status, attempts, created_at, updated_at)
			VALUES ('OUT', 'orders', 'k', '{}', 'ERROR', $1, now() - interval '1 hour', now() - interval '1 hour')`, adminCeiling)
		require.NoError(t, err)
	}
	dead()
	n, err := a.RequeueAll(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	o, err := a.Overview(ctx)
	require.NoError(t, err)
	require.InDelta(t, 0, o.Lag.Seconds(), 60, "without the column, a re-queued row (failed, 0 attempts) waits since its re-queue, its last update")
	_, err = a.History(ctx, time.Hour, time.Minute)
	require.NoError(t, err)

	require.NoError(t, relay.CreateTable(ctx, b.pool, table))
	require.NoError(t, relay.CreateTable(ctx, b.pool, table), "idempotent")
	_, err = b.pool.Exec(ctx, "DELETE FROM "+table)
	require.NoError(t, err)
	dead()
	n, err = a.RequeueAll(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	var requeuedAt *time.Time
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT requeued_at FROM "+table).Scan(&requeuedAt))
	require.NotNil(t, requeuedAt, "the re-queue says when")
	o, err = a.Overview(ctx)
	require.NoError(t, err)
	require.Less(t, o.Lag, time.Minute, "waiting since the re-queue")
	h, err := a.History(ctx, time.Hour, time.Minute)
	require.NoError(t, err)
	require.Len(t, h.Types, 1)
	require.Less(t, h.Types[0].Lag[59], time.Minute, "drawn since the re-queue")
}
