package relay_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/xadm/relay"
	"github.com/xadm/relay/internal/session"
	"github.com/xadm/relay/internal/testkit/pgserver"
)

func TestAdminOverview(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("CountsLagAndHeads", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		f := b.seedAdmin(t)
		// The waiting rows' ages: the pending row 90s old, the retrying one
		// failed 30s ago, and is due since (RetryBackoff 0: the next pass).
		b.exec(t, "UPDATE %s SET created_at = now() - interval '90 seconds' WHERE id = $1", f.pending)
		b.exec(t, "UPDATE %s SET created_at = now() - interval '30 seconds', updated_at = now() - interval '30 seconds' WHERE id = $1", f.retrying)
		// A foreign table may allow a NULL status: the pass reads it as PENDING.
		b.exec(t, "ALTER TABLE %s ALTER COLUMN status DROP NOT NULL")
		b.exec(t, "UPDATE %s SET status = NULL WHERE id = $1", b.insert(t, "v", "null-status")[0])
		a := b.newAdmin(t)

		o, err := a.Overview(ctx)
		require.NoError(t, err)
		require.Equal(t, b.cfg.AppName, o.AppName)
		require.Equal(t, b.table, o.Table)
		require.Equal(t, adminCeiling, o.MaxAttempts)
		require.WithinDuration(t, time.Now(), o.At, time.Minute)
		require.False(t, o.SentEstimated, "a small table's SENT rows are counted")
		require.False(t, o.InRecovery)
		require.False(t, o.DefaultReadOnly)
		require.EqualValues(t, 2, o.Pending)
		require.EqualValues(t, 1, o.Retrying)
		require.EqualValues(t, 3, o.Dead)
		require.EqualValues(t, 2, o.Sent)

		require.Len(t, o.Types, 3)
		tt, u, v := o.Types[0], o.Types[1], o.Types[2]
		require.Equal(t, "t", tt.Type)
		require.EqualValues(t, 1, tt.Pending)
		require.EqualValues(t, 1, tt.Retrying)
		require.EqualValues(t, 2, tt.Dead, "the inbound dead row is not the relay's")
		require.EqualValues(t, 2, tt.Sent)
		require.Equal(t, f.pending, tt.Next.ID, "the lowest waiting id is delivered first")
		require.Equal(t, "PENDING", tt.Next.Status)
		require.Equal(t, f.pending, tt.Oldest.ID, "the row kept waiting longest")
		require.InDelta(t, 90, tt.Lag.Seconds(), 5)
		require.Equal(t, f.dead, tt.FirstDead.ID)
		require.Equal(t, "boom", tt.FirstDead.LastError)
		require.InDelta(t, 90, o.Lag.Seconds(), 5, "the overview's lag is the largest")

		require.Equal(t, "u", u.Type)
		require.EqualValues(t, 1, u.Dead)
		require.Nil(t, u.Next, "nothing of u waits: its only row is dead")
		require.Zero(t, u.Lag)

		require.Equal(t, "v", v.Type)
		require.EqualValues(t, 1, v.Pending, "a NULL status is read as PENDING, as the pass reads it")
		require.Equal(t, "PENDING", v.Next.Status)

		// Once the pending row is sent, the retrying row is next, with its error.
		b.exec(t, "UPDATE %s SET status = 'SENT', sent_at = now() WHERE id = $1", f.pending)
		o, err = a.Overview(ctx)
		require.NoError(t, err)
		tt = o.Types[0]
		require.Equal(t, f.retrying, tt.Next.ID)
		require.Equal(t, "ERROR", tt.Next.Status)
		require.Equal(t, adminCeiling-1, tt.Next.Attempts)
		require.Equal(t, "boom", tt.Next.LastError)
		require.Equal(t, f.retrying, tt.Oldest.ID)
		require.WithinDuration(t, tt.Oldest.CreatedAt.Add(time.Second), tt.Oldest.NextAttempt, 2*time.Second, "due since its last attempt")
		require.InDelta(t, 30, tt.Lag.Seconds(), 5)
		require.EqualValues(t, 3, tt.Sent)
	})

	// A row that waits out its retry's backoff is not behind, nor is a row
	// its failure holds back; a row of another key that waits is.
	t.Run("RetryingIsNotBehind", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ids := b.insert(t, "orders", "k1", "k1", "k2")
		b.exec(t, "UPDATE %s SET status = 'ERROR', attempts = 1, last_error = '503 Service Unavailable', "+
			"created_at = now() - interval '10 minutes', updated_at = now() - interval '10 minutes' WHERE id = $1", ids[0])
		b.exec(t, "UPDATE %s SET created_at = now() - interval '9 minutes' WHERE id = $1", ids[1])
		b.exec(t, "UPDATE %s SET created_at = now() - interval '20 seconds' WHERE id = $1", ids[2])
		cfg := b.cfg
		cfg.MaxAttempts, cfg.RetryBackoff = adminCeiling, time.Hour
		a, err := relay.NewAdmin(b.pool, cfg, relay.AdminAllTypes())
		require.NoError(t, err)
		o, err := a.Overview(ctx)
		require.NoError(t, err)
		tt := o.Types[0]
		require.EqualValues(t, 1, tt.Retrying)
		require.EqualValues(t, 1, tt.Backoff)
		require.EqualValues(t, 1, o.Backoff)
		require.WithinDuration(t, o.At.Add(50*time.Minute), tt.NextRetry, 5*time.Second, "its next attempt, an hour after its last")
		require.Equal(t, ids[0], tt.Next.ID, "still the row delivered first")
		require.WithinDuration(t, tt.NextRetry, tt.Next.NextAttempt, time.Second)
		require.Equal(t, ids[2], tt.Oldest.ID, "the row behind the failed one of its key waits for the destination, not the relays")
		require.InDelta(t, 20, tt.Lag.Seconds(), 5)
		require.Equal(t, tt.Lag, o.Lag)

		// Once its backoff is over, the failed row is due: behind since then.
		b.exec(t, "UPDATE %s SET updated_at = now() - interval '61 minutes' WHERE id = $1", ids[0])
		o, err = a.Overview(ctx)
		require.NoError(t, err)
		tt = o.Types[0]
		require.Zero(t, tt.Backoff)
		require.Equal(t, ids[1], tt.Oldest.ID, "the row of k1 is no longer held back: 9 minutes")
		require.InDelta(t, (9 * time.Minute).Seconds(), tt.Lag.Seconds(), 5)
	})

	// A re-queued row waits since its re-queue, not since it was written;
	// rows written since and never re-queued wait since they were written.
	t.Run("RequeuedWaitsSinceItsRequeue", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		dead := b.insert(t, "orders", "a", "b")
		b.exec(t, "UPDATE %s SET status = 'ERROR', attempts = $2, created_at = now() - interval '3 hours' WHERE id = ANY($1)", dead, adminCeiling)
		a := b.newAdmin(t)
		n, err := a.RequeueIDs(ctx, dead...)
		require.NoError(t, err)
		require.EqualValues(t, 2, n)
		o, err := a.Overview(ctx)
		require.NoError(t, err)
		tt := o.Types[0]
		require.Equal(t, dead[0], tt.Next.ID)
		require.WithinDuration(t, o.At, tt.Next.WaitingSince, 5*time.Second, "waiting since the re-queue")
		require.WithinDuration(t, time.Now().Add(-3*time.Hour), tt.Next.CreatedAt, time.Minute)
		require.Less(t, tt.Lag, 5*time.Second, "not three hours")

		later := b.insert(t, "orders", "c")[0]
		b.exec(t, "UPDATE %s SET created_at = now() - interval '2 minutes' WHERE id = $1", later)
		o, err = a.Overview(ctx)
		require.NoError(t, err)
		require.Equal(t, later, o.Types[0].Oldest.ID, "a later row written before the re-queue waited longer")
		require.InDelta(t, 120, o.Lag.Seconds(), 5)
	})

	t.Run("Empty", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		o, err := b.newAdmin(t).Overview(ctx)
		require.NoError(t, err)
		require.Empty(t, o.Types)
		require.Zero(t, o.Lag)
		require.Zero(t, o.Sent)
	})

	t.Run("ReadOnlyDefault", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		pool := pgserver.Pool(t, server().URL, "", 2, func(c *pgxpool.Config) {
			c.ConnConfig.RuntimeParams["default_transaction_read_only"] = "on"
		})
		a, err := relay.NewAdmin(pool, b.cfg)
		require.NoError(t, err)
		o, err := a.Overview(ctx)
		require.NoError(t, err)
		require.True(t, o.DefaultReadOnly)
	})

	// Past a few tens of megabytes, the SENT history is the planner's estimate.
	t.Run("LargeTableEstimatesSent", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		const sent = 17_000 // ~1.9 kB a row: past 4096 pages
		b.exec(t, `INSERT INTO %s (type, natural_key, payload, status, sent_at)
			SELECT 't', repeat(md5(g::text), 60), '{}', 'SENT', now() FROM generate_series(1, $1) g`, sent)
		b.insert(t, "t", "waiting")
		a := b.newAdmin(t)
		o, err := a.Overview(ctx)
		require.NoError(t, err)
		require.True(t, o.SentEstimated)
		require.InDelta(t, sent, o.Sent, sent/2, "never analyzed: a sample of its pages")
		require.Zero(t, o.Types[0].Sent, "no per-type count of an estimate")
		require.EqualValues(t, 1, o.Pending, "live rows are still counted")

		b.exec(t, "ANALYZE %s")
		o, err = a.Overview(ctx)
		require.NoError(t, err)
		require.True(t, o.SentEstimated)
		require.InDelta(t, sent, o.Sent, sent/10, "from the statistics")
	})
}

func TestAdminDeadPage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	a := b.newAdmin(t)
	long := `{"text": "` + strings.Repeat("é", 300) + `"}`
	b.exec(t, `INSERT INTO %s (type, natural_key, payload, status, attempts, last_error)
		SELECT CASE WHEN g %% 2 = 0 THEN 'even' ELSE 'odd' END, 'k' || g, jsonb_build_object('n', g), 'ERROR', $1, 'fail ' || g
		FROM generate_series(1, 25) g`, adminCeiling)
	b.exec(t, `INSERT INTO %s (type, natural_key, payload, status, attempts) VALUES ('odd', 'long', $1, 'ERROR', $2)`, long, adminCeiling)
	b.insert(t, "odd", "live")

	var all []relay.DeadMessage
	after := int64(0)
	for pages := 0; ; pages++ {
		require.Less(t, pages, 10, "the pages end")
		page, err := a.DeadPage(ctx, relay.DeadQuery{AfterID: after, Limit: 10})
		require.NoError(t, err)
		all = append(all, page...)
		if len(page) < 10 {
			break
		}
		after = page[len(page)-1].ID
	}
	require.Len(t, all, 26, "every dead row once, across the pages")
	for i := 1; i < len(all); i++ {
		require.Less(t, all[i-1].ID, all[i].ID, "oldest first, no repeats")
	}
	first := all[0]
	require.Equal(t, "odd", first.Type)
	require.Equal(t, "k1", first.Key)
	require.Equal(t, "fail 1", first.LastError)
	require.Equal(t, `{"n": 1}`, first.Payload)
	require.False(t, first.PayloadCut)
	require.WithinDuration(t, time.Now(), first.CreatedAt, time.Minute)

	last := all[25]
	require.True(t, last.PayloadCut, "a long payload is cut")
	require.Equal(t, relay.PayloadPreviewMax, len([]rune(last.Payload)), "cut by characters, not bytes")
	require.True(t, strings.HasPrefix(long, last.Payload))

	even, err := a.DeadPage(ctx, relay.DeadQuery{Type: "even"})
	require.NoError(t, err)
	require.Len(t, even, 12)
	for _, d := range even {
		require.Equal(t, "even", d.Type)
	}
	even, err = a.DeadPage(ctx, relay.DeadQuery{Type: "even", AfterID: even[5].ID, Limit: 100})
	require.NoError(t, err)
	require.Len(t, even, 6)

	// By id, as a re-queue by id finds them: the live row given is not dead.
	live, err := a.DeadRows(ctx, all[3].ID, all[1].ID, all[25].ID+1)
	require.NoError(t, err)
	require.Len(t, live, 2)
	require.Equal(t, []int64{all[1].ID, all[3].ID}, []int64{live[0].ID, live[1].ID})
	require.Equal(t, all[1], live[0])

	_, err = a.DeadPage(ctx, relay.DeadQuery{Limit: relay.ListDeadMax + 1})
	require.ErrorContains(t, err, "Limit must be between 1 and")
	_, err = a.DeadPage(ctx, relay.DeadQuery{AfterID: -1})
	require.ErrorContains(t, err, "AfterID must not be negative")
}

func TestAdminPurgeSentProgress(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	const old = 2*relay.PurgeChunk + 17
	b.exec(t, `INSERT INTO %s (type, natural_key, payload, status, sent_at)
		SELECT 't', 'k' || g, '{}', 'SENT', now() - interval '2 days' FROM generate_series(1, $1) g`, old)
	b.exec(t, `INSERT INTO %s (type, natural_key, payload, status, sent_at) VALUES ('t', 'recent', '{}', 'SENT', now())`)
	a := b.newAdmin(t)
	type step struct{ deleted, expected int64 }
	var steps []step
	n, err := a.PurgeSentProgress(ctx, time.Hour, func(deleted, expected int64) {
		steps = append(steps, step{deleted, expected})
	})
	require.NoError(t, err)
	require.EqualValues(t, old, n)
	require.Equal(t, []step{{0, old}, {relay.PurgeChunk, old}, {2 * relay.PurgeChunk, old}, {old, old}}, steps,
		"one call before the first chunk and one a chunk, with the exact count of a small table")
}

func TestAdminElection(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("Nobody", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		holders, err := b.newAdmin(t).Election(ctx)
		require.NoError(t, err)
		require.Empty(t, holders)
	})

	// hold takes b's election from a session of its own named name, as a
	// relay, a JVM or relayctl would, and returns that session's pid.
	hold := func(t *testing.T, b *bundle, name, lockFn string) uint32 {
		t.Helper()
		cfg, err := pgx.ParseConfig(server().URL)
		require.NoError(t, err)
		if name != "" {
			cfg.RuntimeParams["application_name"] = name
		}
		conn, err := pgx.ConnectConfig(ctx, cfg)
		require.NoError(t, err)
		t.Cleanup(func() { _ = conn.Close(context.Background()) })
		var pid uint32
		require.NoError(t, conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid))
		_, err = conn.Exec(ctx, "SELECT "+lockFn+"(hashtext($1))", b.cfg.AppName+relay.LockKeySuffix)
		require.NoError(t, err)
		return pid
	}

	t.Run("JVM", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		pid := hold(t, b, "PostgreSQL JDBC Driver", "pg_try_advisory_lock")
		holders, err := b.newAdmin(t).Election(ctx)
		require.NoError(t, err)
		require.Len(t, holders, 1)
		h := holders[0]
		require.Equal(t, b.cfg.AppName+"_relay_m2m", h.Key)
		require.Equal(t, relay.LockExclusive, h.Mode)
		require.True(t, h.Granted)
		require.Equal(t, relay.HolderOther, h.Kind)
		require.EqualValues(t, pid, h.PID)
		require.Equal(t, "PostgreSQL JDBC Driver", h.ApplicationName)
		require.Equal(t, "127.0.0.1", h.ClientAddr)
		require.Equal(t, "idle", h.State)
		require.False(t, h.Hidden)
		require.True(t, h.Since.IsZero(), "a foreign session does not say when it won")
		require.Zero(t, h.HeldFor())
		require.WithinDuration(t, time.Now(), h.BackendStart, time.Minute)
		require.False(t, h.StateChange.Before(h.BackendStart))
	})

	t.Run("GoRelay", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.insert(t, "t", "a")
		entered, leave := make(chan struct{}), make(chan struct{})
		replica := pgserver.Name(t)
		pool := pgserver.Pool(t, server().URL, replica, 4)
		r, err := relay.New(pool, b.cfg, relay.SenderFunc("t", func(context.Context, relay.Message) error {
			close(entered)
			<-leave
			return nil
		}))
		require.NoError(t, err)
		before := time.Now()
		done := make(chan error, 1)
		go func() { _, err := r.RunIfElected(ctx); done <- err }()
		<-entered
		holders, err := b.newAdmin(t).Election(ctx)
		close(leave)
		require.NoError(t, <-done)
		require.NoError(t, err)
		require.Len(t, holders, 1)
		h := holders[0]
		require.Equal(t, relay.HolderRelay, h.Kind, "the guard marks its statements on the lock's session")
		require.WithinDuration(t, before, h.Since, 5*time.Second)
		require.Equal(t, replica, h.Replica, "the replica's own application_name, untouched")
	})

	t.Run("GoRelaysIdlePoll", func(t *testing.T) {
		// A started relay's idle poll wins the election for its statement's
		// length on the relay's own session, a statement that carries the
		// relay's presence mark, not the election's: it is a Go relay's too.
		t.Parallel()
		b := setup(t)
		p := session.NewPresence(b.cfg.AppName, b.cfg.Table, b.cfg.MaxAttempts, 1, []string{"t"})
		replica := pgserver.Name(t)
		cfg, err := pgx.ParseConfig(server().URL)
		require.NoError(t, err)
		cfg.RuntimeParams["application_name"] = replica
		conn, err := pgx.ConnectConfig(ctx, cfg)
		require.NoError(t, err)
		t.Cleanup(func() { _ = conn.Close(context.Background()) })
		before := time.Now()
		_, err = conn.Exec(ctx, p.Mark()+"SELECT pg_advisory_lock(hashtext($1))", b.cfg.AppName+relay.LockKeySuffix)
		require.NoError(t, err)
		holders, err := b.newAdmin(t).Election(ctx)
		require.NoError(t, err)
		require.Len(t, holders, 1)
		h := holders[0]
		require.Equal(t, relay.HolderRelay, h.Kind, "the presence mark is a Go relay's")
		require.Equal(t, p.ID(), h.ReplicaID, "the presence mark names its replica")
		require.Equal(t, replica, h.Replica)
		require.WithinDuration(t, before, h.Since, 5*time.Second, "it holds since its statement started")
	})

	t.Run("Pause", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		hold(t, b, "relayctl pause "+b.cfg.AppName, "pg_try_advisory_lock")
		holders, err := b.newAdmin(t).Election(ctx)
		require.NoError(t, err)
		require.Len(t, holders, 1)
		require.Equal(t, relay.HolderPause, holders[0].Kind)
		require.Equal(t, holders[0].BackendStart, holders[0].Since, "a pause holds from its session's start")
		require.Positive(t, holders[0].HeldFor())
	})

	t.Run("SharedAndWaiting", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		hold(t, b, "shared-a", "pg_advisory_lock_shared")
		hold(t, b, "shared-b", "pg_advisory_lock_shared")
		// A session waiting for the exclusive lock, as SQL may (relays never wait).
		waiter, err := pgx.Connect(ctx, server().URL)
		require.NoError(t, err)
		t.Cleanup(func() { _ = waiter.Close(context.Background()) })
		waitCtx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() {
			_, err := waiter.Exec(waitCtx, "SELECT pg_advisory_lock(hashtext($1))", b.cfg.AppName+relay.LockKeySuffix)
			done <- err
		}()
		t.Cleanup(func() { cancel(); <-done })

		a := b.newAdmin(t)
		require.Eventually(t, func() bool {
			holders, err := a.Election(ctx)
			return err == nil && len(holders) == 3
		}, 30*time.Second, 20*time.Millisecond)
		holders, err := a.Election(ctx)
		require.NoError(t, err)
		require.True(t, holders[0].Granted)
		require.Equal(t, relay.LockShared, holders[0].Mode)
		require.True(t, holders[1].Granted)
		require.Equal(t, relay.LockShared, holders[1].Mode)
		require.False(t, holders[2].Granted, "the waiter comes last")
		require.Equal(t, relay.LockExclusive, holders[2].Mode)
	})

	t.Run("OtherAppsAndKeysAreNotOurs", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		other := setup(t)
		hold(t, other, "other app", "pg_try_advisory_lock")
		holders, err := b.newAdmin(t).Election(ctx)
		require.NoError(t, err)
		require.Empty(t, holders)
	})
}
