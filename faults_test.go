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
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/xadm/relay"
	"github.com/xadm/relay/internal/testkit/pgserver"
)

// The fault tests of this file kill only the test's own sessions (found by the
// application_name of its pool), so they share the package's server with the
// other tests. Faults that touch the whole server (an outage) live in
// internal/tests/faultstest, which has a server of its own.

// sendRecord is one call of a sender: when it ran and whether the destination
// accepted the message (Send returned nil).
type sendRecord struct {
	id         int64
	start, end time.Time
	accepted   bool
}

// ledger is what a fault test's destination saw, and what the relay recorded
// (through an Observer).
type ledger struct {
	mu       sync.Mutex
	sends    []sendRecord
	recorded map[int64]int // SENT outcomes the relay recorded, per row
}

func newLedger() *ledger { return &ledger{recorded: map[int64]int{}} }

// send runs fn as the destination and keeps a record of the call.
func (l *ledger) send(ctx context.Context, m relay.Message, fn func(ctx context.Context, m relay.Message) error) error {
	start := time.Now()
	err := fn(ctx, m)
	l.mu.Lock()
	l.sends = append(l.sends, sendRecord{id: m.ID, start: start, end: time.Now(), accepted: err == nil})
	l.mu.Unlock()
	return err
}

// accepted counts the accepted deliveries of each row.
func (l *ledger) accepted() map[int64]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := map[int64]int{}
	for _, s := range l.sends {
		if s.accepted {
			n[s.id]++
		}
	}
	return n
}

func (l *ledger) calls() []sendRecord {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]sendRecord(nil), l.sends...)
}

func (l *ledger) PassDone(relay.PassReport) {}

func (l *ledger) MessageDone(m relay.MessageReport) {
	if m.Outcome == relay.OutcomeSent {
		l.mu.Lock()
		l.recorded[m.ID]++
		l.mu.Unlock()
	}
}

func (l *ledger) recordedSent() map[int64]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := make(map[int64]int, len(l.recorded))
	for id, c := range l.recorded {
		n[id] = c
	}
	return n
}

// terminateApp kills every backend whose application_name is app, as a
// failover or an operator would, and waits until those backends are gone. It
// returns how many it killed. It works on a connection of its own, under a
// context that the relay's cancellation cannot cut short. It waits for the
// backends it killed only: the relay may open new sessions meanwhile (a later
// pass), and waiting for the app to have none could then last forever.
func terminateApp(ctx context.Context, app string) (int, error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, server().URL)
	if err != nil {
		return 0, err
	}
	defer conn.Close(ctx)
	var killed []int32
	if err := conn.QueryRow(ctx, `SELECT coalesce(array_agg(pid) FILTER (WHERE pg_terminate_backend(pid)), '{}')
		FROM pg_stat_activity WHERE application_name = $1 AND pid <> pg_backend_pid()`, app).Scan(&killed); err != nil {
		return 0, err
	}
	for {
		var left int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1)`, killed).Scan(&left); err != nil {
			return len(killed), err
		}
		if left == 0 {
			return len(killed), nil
		}
		select {
		case <-ctx.Done():
			return len(killed), fmt.Errorf("%d killed backends of %q still there: %w", left, app, ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// advisoryLocksOfApp counts the advisory locks held by the backends whose
// application_name is app: a pool's sessions, wherever they are (in use or idle).
func advisoryLocksOfApp(t testing.TB, app string) int {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), server().URL)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	var n int
	require.NoError(t, conn.QueryRow(context.Background(), `SELECT count(*) FROM pg_locks l
		JOIN pg_stat_activity a ON a.pid = l.pid
		WHERE l.locktype = 'advisory' AND a.application_name = $1`, app).Scan(&n))
	return n
}

// relayPool opens a pool for a relay whose sessions a test kills. It never
// pings a connection before handing it out (the default pings those idle over
// 1s), so that a session killed while idle is found dead on its next use
// however slow the machine: the fault lands where the test aims it.
func relayPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	return pgserver.Pool(t, server().URL, pgserver.Name(t), 8, func(pc *pgxpool.Config) {
		pc.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
	})
}

// drainElected runs elected passes until no row is PENDING or ERROR, for at
// most a few seconds. Passes right after a fault may fail (a pooled connection that died with the
// fault is found dead on its first use): they are retried.
func drainElected(t *testing.T, b *bundle, r *relay.Relay) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for b.countStatus(t, "PENDING")+b.countStatus(t, "ERROR") > 0 {
		require.True(t, time.Now().Before(deadline), "rows still undelivered after 10s")
		if _, err := r.RunIfElected(context.Background()); err != nil {
			t.Logf("a pass after the fault failed (retried): %v", err)
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// TestAtLeastOnceWhenTheOutcomeIsLost kills every session of the relay's pool
// after the destination accepted a message and before its outcome could be
// recorded. One at a time, the relay records that outcome on a fresh
// connection (the write is fenced, so a second try is harmless) and the
// message is not delivered again; with sends in flight, a message whose outcome
// is lost is delivered again by a later pass. Either way every row ends SENT,
// the fault is not counted as an attempt, and a message whose outcome was
// recorded is never delivered again. (internal/tests/faultstest halts the whole
// server, where no retry can record the outcome.)
func TestAtLeastOnceWhenTheOutcomeIsLost(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("OneAtATime", func(t *testing.T) {
		t.Parallel()
		b := setup(t) // b.pool writes and looks; the relay has a pool of its own, whose sessions die
		ids := b.insert(t, "t", "a", "b", "c")
		pool := relayPool(t)
		l := newLedger()
		var killed atomic.Bool
		var logs logBuffer
		cfg := b.cfg
		cfg.Observer = l
		cfg.Logger = logs.Logger()
		r, err := relay.New(pool, cfg, relay.SenderFunc("t", func(ctx context.Context, m relay.Message) error {
			return l.send(ctx, m, func(ctx context.Context, m relay.Message) error {
				if m.Key == "b" && killed.CompareAndSwap(false, true) {
					// The destination accepted b; now every session of the relay dies,
					// the election's and the one the outcome would be recorded on.
					n, err := terminateApp(context.WithoutCancel(ctx), appNameOf(pool))
					if err != nil {
						return err
					}
					if n < 2 {
						t.Errorf("killed %d sessions, want the lock's and a pooled one at least", n)
					}
					// b was accepted: say so once the relay has seen its
					// election lost, so that it starts nothing after b.
					<-ctx.Done()
				}
				return nil
			})
		}))
		require.NoError(t, err)

		ran, err := r.RunIfElected(ctx)
		require.True(t, ran)
		require.ErrorIs(t, err, relay.ErrElectionLost, "the election's session died with the others")
		require.Equal(t, "SENT", b.state(t, ids[0]).Status, "a's outcome was recorded before the fault")
		// The relay sees its election lost as soon as the kill lands, and waits
		// 100ms for the send to return. A loaded machine can keep this
		// sender's goroutine (its kill statement's answer) from running for
		// longer: then b's send was cut short, its outcome unknown, and it is
		// delivered again, as at-least-once says. Otherwise b's outcome is
		// recorded on a fresh connection and b is never delivered again.
		cutShort := len(logs.Lines("relay: send interrupted", fmt.Sprintf(" id=%d ", ids[1]))) > 0
		s := b.state(t, ids[1])
		if cutShort {
			t.Log("b's send was cut short by the lost election: it is delivered again")
			require.Equal(t, "PENDING", s.Status)
		} else {
			require.Equal(t, "SENT", s.Status, "b's outcome was recorded on a fresh connection, after the fault")
		}
		require.Zero(t, s.Attempts)
		require.Equal(t, "PENDING", b.state(t, ids[2]).Status, "the pass stopped before c: its election was lost")
		require.Eventually(t, func() bool { return lockFree(t, b.cfg.AppName) }, 5*time.Second, 5*time.Millisecond)

		drainElected(t, b, r)
		deliveriesOfB := 1
		if cutShort {
			deliveriesOfB = 2
		}
		// b's first send, abandoned when cut short, counts its acceptance
		// only when its goroutine gets to run, which a loaded machine delays.
		require.Eventually(t, func() bool { return l.accepted()[ids[1]] >= deliveriesOfB }, 10*time.Second, 5*time.Millisecond)
		require.Equal(t, map[int64]int{ids[0]: 1, ids[1]: deliveriesOfB, ids[2]: 1}, l.accepted(),
			"no message whose outcome was recorded is delivered twice")
		require.Equal(t, map[int64]int{ids[0]: 1, ids[1]: 1, ids[2]: 1}, l.recordedSent())
		for _, id := range ids {
			s := b.state(t, id)
			require.Equal(t, "SENT", s.Status)
			require.Zero(t, s.Attempts)
		}
		require.Zero(t, advisoryLocksOfApp(t, appNameOf(pool)))
	})

	t.Run("ConcurrentSendsInFlight", func(t *testing.T) {
		t.Parallel()
		const rows, concurrency, killAt = 24, 4, 6
		b := setup(t)
		ids := b.insert(t, "t", distinctKeys("k", rows)...)
		pool := relayPool(t)
		l := newLedger()
		var calls atomic.Int32
		var phase atomic.Int32    // 0 before the fault, 1 after it (first pass), 2 later passes
		var inFlight atomic.Int32 // sends not yet returned, an abandoned one included
		cfg := b.cfg
		cfg.Observer = l
		cfg.Concurrency = concurrency
		r, err := relay.New(pool, cfg, relay.SenderFunc("t", func(ctx context.Context, m relay.Message) error {
			inFlight.Add(1)
			defer inFlight.Add(-1)
			return l.send(ctx, m, func(ctx context.Context, m relay.Message) error {
				if phase.Load() == 1 {
					// A destination that stalls after the fault: nothing started
					// now is accepted before the relay notices and gives up.
					<-ctx.Done()
					return context.Cause(ctx)
				}
				if phase.Load() == 0 && calls.Add(1) == killAt {
					phase.Store(1)
					if _, err := terminateApp(ctx, appNameOf(pool)); err != nil {
						return err
					}
					select { // the relay notices and cancels the pass
					case <-ctx.Done():
					case <-time.After(5 * time.Second):
						return errors.New("the relay did not notice the lost election within 5s")
					}
					return nil // accepted before the fault was noticed
				}
				select { // a destination that takes a moment
				case <-time.After(10 * time.Millisecond):
					return nil
				case <-ctx.Done():
					return context.Cause(ctx)
				}
			})
		}))
		require.NoError(t, err)

		ran, err := r.RunIfElected(ctx)
		require.True(t, ran)
		require.ErrorIs(t, err, relay.ErrElectionLost)
		phase.Store(2)
		// What the first pass did: the messages the destination accepted, and
		// the outcomes the relay recorded (some on sessions opened after the fault).
		// A send the relay abandoned (the one that ended the election, slow to
		// see its context end on a loaded machine) counts once it returns.
		require.Eventually(t, func() bool { return inFlight.Load() == 0 }, 10*time.Second, 5*time.Millisecond)
		acceptedFirst, recordedFirst := l.accepted(), l.recordedSent()
		for _, id := range ids {
			if s := b.state(t, id); s.Status != "SENT" {
				require.Equal(t, "PENDING", s.Status, "row %d", id)
				require.Zero(t, s.Attempts, "row %d: an interrupted send or a lost outcome is not an attempt", id)
			}
		}

		drainElected(t, b, r)
		accepted, recorded := l.accepted(), l.recordedSent()
		lost := 0
		for _, id := range ids {
			s := b.state(t, id)
			require.Equal(t, "SENT", s.Status, "row %d", id)
			require.Zero(t, s.Attempts, "row %d", id)
			require.Equal(t, 1, recorded[id], "row %d: recorded SENT exactly once", id)
			want := 1
			if acceptedFirst[id] == 1 && recordedFirst[id] == 0 {
				want = 2 // accepted, outcome lost: delivered again
				lost++
			}
			require.Equal(t, want, accepted[id],
				"row %d: delivered again exactly when its outcome was lost (first pass: accepted %d, recorded %d)",
				id, acceptedFirst[id], recordedFirst[id])
		}
		t.Logf("%d of %d rows had their outcome lost at the fault and were delivered twice", lost, rows)
	})
}

// TestElectionLostWithConcurrency kills only the election's session while four
// messages are in flight: the pass stops (no message starts once the loss is
// noticed, each worker at most one more before), the sends in flight are
// cancelled with ErrElectionLost and stay PENDING without an attempt, and the
// next passes deliver every row exactly once.
func TestElectionLostWithConcurrency(t *testing.T) {
	t.Parallel()
	const rows, concurrency, killAt = 40, 4, 5
	ctx := context.Background()
	b := setup(t)
	ids := b.insert(t, "t", distinctKeys("k", rows)...)
	l := newLedger()
	var calls atomic.Int32
	var phase atomic.Int32 // 0 before the fault, 1 after it, 2 later passes
	var killTime atomic.Int64
	var noticed atomic.Bool
	cfg := b.cfg
	cfg.Concurrency = concurrency
	cfg.Observer = l
	r := b.newRelay(t, cfg, relay.SenderFunc("t", func(ctx context.Context, m relay.Message) error {
		return l.send(ctx, m, func(ctx context.Context, m relay.Message) error {
			if phase.Load() == 1 {
				<-ctx.Done() // a stalled destination: only the relay's cancellation ends it
				return context.Cause(ctx)
			}
			if phase.Load() == 0 && calls.Add(1) == killAt {
				killTime.Store(time.Now().UnixNano())
				phase.Store(1)
				bg := context.WithoutCancel(ctx)
				conn, err := pgx.Connect(bg, server().URL)
				if err != nil {
					return err
				}
				defer conn.Close(bg)
				if _, err := conn.Exec(bg, `SELECT pg_terminate_backend(pid) FROM pg_locks
					WHERE locktype = 'advisory' AND objid = (hashtext($1)::bigint & 4294967295)::oid`,
					b.cfg.AppName+relay.LockKeySuffix); err != nil {
					return err
				}
				select {
				case <-ctx.Done():
					noticed.Store(errors.Is(context.Cause(ctx), relay.ErrElectionLost))
				case <-time.After(5 * time.Second):
				}
				return nil // the destination had accepted it
			}
			select {
			case <-time.After(5 * time.Millisecond):
				return nil
			case <-ctx.Done():
				return context.Cause(ctx)
			}
		})
	}))

	ran, err := r.RunIfElected(ctx)
	require.True(t, ran)
	require.ErrorIs(t, err, relay.ErrElectionLost)
	require.True(t, noticed.Load(), "the sends in flight are cancelled with ErrElectionLost as the cause")
	phase.Store(2)

	kill := time.Unix(0, killTime.Load())
	var after, interrupted int
	for _, s := range l.calls() {
		if s.start.After(kill) {
			after++
			require.False(t, s.accepted, "row %d: a send started after the fault stalls until the relay cancels it", s.id)
		}
		if !s.accepted {
			interrupted++
			st := b.state(t, s.id)
			require.Equal(t, "PENDING", st.Status, "row %d: an interrupted send leaves its row as read", s.id)
			require.Zero(t, st.Attempts, "row %d", s.id)
		}
	}
	lostPass := len(l.calls())
	require.LessOrEqual(t, after, concurrency-1, "once the election is lost, each other worker starts at most one more message")
	require.Less(t, lostPass, rows/2, "the pass stopped instead of going through the batch")
	require.Eventually(t, func() bool { return lockFree(t, b.cfg.AppName) }, 5*time.Second, 5*time.Millisecond)

	drainElected(t, b, r)
	accepted := l.accepted()
	for _, id := range ids {
		require.Equal(t, 1, accepted[id], "row %d: the pool's sessions survived, so every outcome was recorded: exactly once", id)
		s := b.state(t, id)
		require.Equal(t, "SENT", s.Status)
		require.Zero(t, s.Attempts)
	}
	t.Logf("the lost pass: %d sends, %d interrupted, %d started after the fault", lostPass, interrupted, after)
}

// TestRollingDeploy rolls four replicas of one app, each with its own pool,
// one at a time (Stop with a bounded context, then a fresh replica in its
// place) while rows are being written and delivered: every row is delivered
// exactly once, and no Stop leaves an advisory lock on the stopped replica's
// sessions.
func TestRollingDeploy(t *testing.T) {
	t.Parallel()
	const (
		replicas  = 4
		rows      = 400
		writeGap  = 4 * time.Millisecond // rows written over ~1.6s
		rollEvery = 150 * time.Millisecond
	)
	ctx := context.Background()
	b := setup(t)

	var mu sync.Mutex
	delivered := map[int64]int{}
	send := relay.SenderFunc("t", func(ctx context.Context, m relay.Message) error {
		select {
		case <-time.After(time.Millisecond): // a destination that takes a moment
		case <-ctx.Done():
			return context.Cause(ctx)
		}
		mu.Lock()
		delivered[m.ID]++
		mu.Unlock()
		return nil
	})

	type replica struct {
		r    *relay.Relay
		pool *pgxpool.Pool
	}
	start := func(i int) replica {
		pool := newPool(t, 4)
		cfg := b.cfg
		cfg.Concurrency = 1 + i%2
		cfg.BatchSize = 25
		r, err := relay.New(pool, cfg, send)
		require.NoError(t, err)
		require.NoError(t, r.Start(ctx))
		return replica{r: r, pool: pool}
	}
	stop := func(rep replica) {
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		require.NoError(t, rep.r.Stop(sctx), "a graceful stop within its bound")
		require.Zero(t, advisoryLocksOfApp(t, appNameOf(rep.pool)), "a stopped replica holds no advisory lock")
		require.Zero(t, advisoryLocksHeldBy(t, rep.pool))
		rep.pool.Close()
	}

	pods := make([]replica, replicas)
	for i := range pods {
		pods[i] = start(i)
	}

	written := make(chan []int64, 1)
	go func() {
		var ids []int64
		defer func() { written <- ids }()
		for i := range rows {
			var id int64
			if err := b.pool.QueryRow(ctx, "INSERT INTO "+pgx.Identifier{b.table}.Sanitize()+
				" (type, natural_key, payload) VALUES ('t', $1, '{}') RETURNING id", fmt.Sprintf("k%d", i%37)).Scan(&id); err != nil {
				t.Errorf("write row %d: %v", i, err)
				return
			}
			ids = append(ids, id)
			time.Sleep(writeGap)
		}
	}()

	rolls := 0
	var ids []int64
	roll := time.NewTicker(rollEvery)
	defer roll.Stop()
	for ids == nil {
		select {
		case ids = <-written:
		case <-roll.C:
			i := rolls % replicas
			stop(pods[i])
			pods[i] = start(i)
			rolls++
		}
	}
	require.Len(t, ids, rows)
	require.GreaterOrEqual(t, rolls, replicas, "every replica was replaced at least once while writing")
	require.Eventually(t, func() bool { return b.countStatus(t, "SENT") == rows }, 15*time.Second, 10*time.Millisecond)
	for _, p := range pods {
		stop(p)
	}
	require.True(t, lockFree(t, b.cfg.AppName))

	mu.Lock()
	defer mu.Unlock()
	require.Len(t, delivered, rows)
	for _, id := range ids {
		require.Equal(t, 1, delivered[id], "row %d", id)
	}
	t.Logf("%d rows, %d rolls: every row delivered exactly once", rows, rolls)
}

// TestPgBouncer runs the relay through a real PgBouncer. In session mode it
// works as on a direct connection. In transaction mode a session advisory lock
// belongs to whichever server connection ran the statement, so the election
// protects nothing: the relay refuses to elect there (TestTransactionPooling).
// The transaction-mode subtests force that check to miss, and the cases the
// guard's statements can still tell, and show it fails loudly with an error
// instead of pretending, and lets go of the lock left on the server connection.
func TestPgBouncer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("SessionMode", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		pb := startBouncer(t, "session")
		pool := bouncerPool(t, pb.URL, 4, pgx.QueryExecModeCacheStatement)
		ids := b.insert(t, "t", "a", "b")
		rec := newRecorder("t", nil)
		r, err := relay.New(pool, b.cfg, rec)
		require.NoError(t, err)

		release := holdLikeJVM(t, b.cfg.AppName) // a JVM replica, connected directly
		ran, err := r.RunIfElected(ctx)
		require.NoError(t, err)
		require.False(t, ran, "the relay behind PgBouncer coalesces while a direct session holds the election")
		require.Zero(t, rec.count())
		release()

		ran, err = r.RunIfElected(ctx)
		require.NoError(t, err)
		require.True(t, ran)
		require.Equal(t, ids, rec.ids())
		require.True(t, lockFree(t, b.cfg.AppName), "the unlock reached the session that held the lock")

		require.NoError(t, r.Start(ctx))
		more := b.insert(t, "t", "c", "d", "e")
		require.Eventually(t, func() bool { return b.countStatus(t, "SENT") == 5 }, 5*time.Second, 10*time.Millisecond)
		require.NoError(t, r.Stop(ctx))
		require.Equal(t, append(ids, more...), rec.ids(), "each row once, in order")
		require.True(t, lockFree(t, b.cfg.AppName))
		require.Empty(t, electionHolders(t, b.cfg.AppName))
	})

	t.Run("SessionModeLockSessionKilled", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		pb := startBouncer(t, "session")
		pool := bouncerPool(t, pb.URL, 4, pgx.QueryExecModeCacheStatement)
		ids := b.insert(t, "t", "a", "b")
		var cause atomic.Value
		r, err := relay.New(pool, b.cfg, relay.SenderFunc("t", func(ctx context.Context, m relay.Message) error {
			if m.Key != "a" {
				return nil
			}
			// Kill the server session behind the election: PgBouncer drops the
			// client connection that owned it, and the guard notices.
			holders, err := holdersOf(ctx, b.cfg.AppName)
			if err != nil || len(holders) != 1 {
				return fmt.Errorf("election holders %v: %v", holders, err)
			}
			bg := context.WithoutCancel(ctx)
			conn, err := pgx.Connect(bg, server().URL)
			if err != nil {
				return err
			}
			defer conn.Close(bg)
			if _, err := conn.Exec(bg, "SELECT pg_terminate_backend($1)", holders[0]); err != nil {
				return err
			}
			select {
			case <-ctx.Done():
				cause.Store(context.Cause(ctx))
			case <-time.After(5 * time.Second):
			}
			return nil
		}))
		require.NoError(t, err)
		ran, err := r.RunIfElected(ctx)
		require.True(t, ran)
		require.ErrorIs(t, err, relay.ErrElectionLost)
		require.ErrorIs(t, cause.Load().(error), relay.ErrElectionLost, "the send in flight is cancelled")
		require.Equal(t, "SENT", b.state(t, ids[0]).Status)
		require.Equal(t, "PENDING", b.state(t, ids[1]).Status, "the pass stopped")
		require.Eventually(t, func() bool { return lockFree(t, b.cfg.AppName) }, 5*time.Second, 5*time.Millisecond)
	})

	t.Run("SessionModeClientGoneFreesTheLock", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		pb := startBouncer(t, "session")
		// A relay that dies holding the election: its client connection to
		// PgBouncer closes, but PgBouncer keeps the server connection. Its
		// server_reset_query (DISCARD ALL, the default) frees the lock.
		conn, err := pgx.Connect(ctx, pb.URL)
		require.NoError(t, err)
		var locked bool
		require.NoError(t, conn.QueryRow(ctx, "SELECT pg_try_advisory_lock(hashtext($1))",
			b.cfg.AppName+relay.LockKeySuffix).Scan(&locked))
		require.True(t, locked)
		require.False(t, lockFree(t, b.cfg.AppName))
		require.NoError(t, conn.Close(ctx))
		require.Eventually(t, func() bool { return lockFree(t, b.cfg.AppName) }, 5*time.Second, 10*time.Millisecond)
	})

	// In transaction mode PgBouncer hands out the most recently used idle
	// server connection first, which makes the steps below exact: the guard's
	// lock statement and the pass's select run on one server connection S, and
	// another client that begins a transaction next gets S too.
	transaction := func(t *testing.T) (*bundle, *pgserver.PgBouncer, *pgxpool.Pool) {
		b := setup(t)
		pb := startBouncer(t, "transaction")
		return b, pb, bouncerPool(t, pb.URL, 4, pgx.QueryExecModeExec)
	}
	// otherClient connects to PgBouncer as another service would.
	otherClient := func(t *testing.T, pb *pgserver.PgBouncer) *pgx.Conn {
		cfg, err := pgx.ParseConfig(pb.URL)
		require.NoError(t, err)
		cfg.DefaultQueryExecMode = pgx.QueryExecModeExec
		conn, err := pgx.ConnectConfig(ctx, cfg)
		require.NoError(t, err)
		t.Cleanup(func() { conn.Close(context.Background()) })
		return conn
	}
	// beginOnLockHolder begins a transaction on other and checks it landed on
	// the server connection that holds app's election.
	beginOnLockHolder := func(other *pgx.Conn, app string) (pgx.Tx, int32, error) {
		tx, err := other.Begin(ctx)
		if err != nil {
			return nil, 0, err
		}
		var pid int32
		if err := tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
			return nil, 0, err
		}
		holders, err := holdersOf(ctx, app)
		if err != nil {
			return nil, 0, err
		}
		if len(holders) != 1 || holders[0] != pid {
			return nil, 0, fmt.Errorf("the other client's transaction runs on backend %d, the election is held by %v", pid, holders)
		}
		return tx, pid, nil
	}

	t.Run("TransactionModeUnlockLandsOnAnotherBackend", func(t *testing.T) {
		t.Parallel()
		b, pb, pool := transaction(t)
		id := b.insert(t, "t", "a")[0]
		other := otherClient(t, pb)
		var tx pgx.Tx
		var holder int32
		r, err := relay.New(pool, b.cfg, relay.SenderFunc("t", func(context.Context, relay.Message) error {
			// While the destination answers, another client's transaction takes
			// the server connection that holds the election; the relay's unlock
			// will run on a different one.
			var err error
			tx, holder, err = beginOnLockHolder(other, b.cfg.AppName)
			return err
		}))
		require.NoError(t, err)
		relay.MissTransactionPoolingForTest(r)

		ran, err := r.RunIfElected(ctx)
		require.True(t, ran)
		require.ErrorIs(t, err, relay.ErrElectionLost, "the relay fails loudly")
		require.ErrorIs(t, err, relay.ErrTransactionPooling)
		require.ErrorContains(t, err, "the unlock ran on backend")
		require.ErrorContains(t, err, fmt.Sprintf("not on the lock's session (backend %d)", holder))
		require.Equal(t, "SENT", b.state(t, id).Status, "the message itself was delivered and recorded")

		// The unlock released nothing on the backend it ran on, and ended the
		// one that holds the lock (the other client's transaction with it).
		require.Eventually(t, func() bool { return lockFree(t, b.cfg.AppName) }, 5*time.Second, 5*time.Millisecond,
			"the lock is not left on the server connection PgBouncer keeps")
		_ = tx.Rollback(ctx)
	})

	t.Run("TransactionModeHeartbeatSeesAnotherBackend", func(t *testing.T) {
		t.Parallel()
		b, pb, pool := transaction(t)
		ids := b.insert(t, "t", "a", "b")
		other := otherClient(t, pb)
		var tx pgx.Tx
		var cause atomic.Value
		r, err := relay.New(pool, b.cfg, relay.SenderFunc("t", func(ctx context.Context, m relay.Message) error {
			if m.Key != "a" {
				return nil
			}
			var err error
			if tx, _, err = beginOnLockHolder(other, b.cfg.AppName); err != nil {
				return err
			}
			// A slow destination: the guard's heartbeat runs meanwhile, on
			// whatever server connection PgBouncer picks, and sees another backend.
			select {
			case <-ctx.Done():
				cause.Store(context.Cause(ctx))
			case <-time.After(10 * time.Second):
			}
			return nil
		}))
		require.NoError(t, err)
		relay.MissTransactionPoolingForTest(r)

		ran, err := r.RunIfElected(ctx)
		require.True(t, ran)
		require.ErrorIs(t, err, relay.ErrElectionLost)
		require.ErrorIs(t, err, relay.ErrTransactionPooling)
		require.ErrorContains(t, err, "the heartbeat ran on backend")
		c, _ := cause.Load().(error)
		require.ErrorIs(t, c, relay.ErrElectionLost, "the heartbeat cancelled the send in flight")
		require.Equal(t, "SENT", b.state(t, ids[0]).Status)
		require.Equal(t, "PENDING", b.state(t, ids[1]).Status, "the pass stopped before b")
		// Once the pass stopped, the relay let go of the lock where PgBouncer
		// kept it: it ended that server connection (and the other client's
		// transaction on it), with PgBouncer still running.
		require.Eventually(t, func() bool { return lockFree(t, b.cfg.AppName) }, 5*time.Second, 5*time.Millisecond)
		_ = tx.Rollback(ctx)
	})

	t.Run("TransactionModeSecondReplicaCoalescesAndSaysSo", func(t *testing.T) {
		t.Parallel()
		b, pb, pool := transaction(t)
		b.insert(t, "t", "a")
		var secondSent atomic.Int32
		var logs logBuffer
		secondCfg := b.cfg
		secondCfg.Logger = logs.Logger()
		second, err := relay.New(bouncerPool(t, pb.URL, 4, pgx.QueryExecModeExec), secondCfg,
			relay.SenderFunc("t", func(context.Context, relay.Message) error {
				secondSent.Add(1)
				return nil
			}))
		require.NoError(t, err)
		relay.MissTransactionPoolingForTest(second)
		var secondRan atomic.Bool
		var secondErr atomic.Value
		first, err := relay.New(pool, b.cfg, relay.SenderFunc("t", func(ctx context.Context, m relay.Message) error {
			// While the first replica holds the election, the second one tries.
			// Its lock statement lands on the server connection that holds the
			// lock, where pg_try_advisory_lock would stack and answer true.
			ran, err := second.RunIfElected(ctx)
			secondRan.Store(ran)
			if err != nil {
				secondErr.Store(err)
			}
			return nil
		}))
		require.NoError(t, err)
		relay.MissTransactionPoolingForTest(first)

		ran, err := first.RunIfElected(ctx)
		require.NoError(t, err)
		require.True(t, ran)
		require.False(t, secondRan.Load(), "the second replica did not run")
		require.Zero(t, secondSent.Load())
		serr, _ := secondErr.Load().(error)
		require.NoError(t, serr)
		require.Contains(t, logs.String(), "already held by the pooled session",
			"the guard says it was lent a session that already holds the lock, and coalesces instead of stacking")
		require.Equal(t, 1, b.countStatus(t, "SENT"))
		require.True(t, lockFree(t, b.cfg.AppName))
	})
}

// TestIdleSessionTimeout runs a slow send on a pool whose sessions carry
// idle_session_timeout. The election's session runs no statement while the
// pass works on others, except the guard's heartbeat (every 2s): a timeout
// shorter than that would end the session mid-pass, so the guard runs the
// lock's session under its own lease (idle_session_timeout 10s) instead; the
// pooled connections that time out meanwhile are replaced.
func TestIdleSessionTimeout(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	poolWithTimeout := func(t *testing.T, timeout string) *pgxpool.Pool {
		return pgserver.Pool(t, server().URL, pgserver.Name(t), 4, func(pc *pgxpool.Config) {
			pc.ConnConfig.RuntimeParams["idle_session_timeout"] = timeout
			// The server ends the pool's idle sessions after the role's
			// timeout: ping each before it is handed out, so that a loaded
			// machine's slow pass never meets two dead ones in a row (the
			// relay retries a failed connection once).
			pc.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return true }
		})
	}

	t.Run("ARoleTimeoutShorterThanTheHeartbeatIsOverriddenByTheLease", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		id := b.insert(t, "t", "a")[0]
		pool := poolWithTimeout(t, "300ms")
		r, err := relay.New(pool, b.cfg, relay.SenderFunc("t", func(ctx context.Context, m relay.Message) error {
			select { // a destination slower than the role's timeout and than the heartbeat
			case <-ctx.Done():
				return context.Cause(ctx)
			case <-time.After(2500 * time.Millisecond):
				return nil
			}
		}))
		require.NoError(t, err)
		ran, err := r.RunIfElected(ctx)
		require.True(t, ran)
		require.NoError(t, err, "the lock's session runs under the guard's lease, not the role's 300ms")
		require.Equal(t, "SENT", b.state(t, id).Status, "the outcome's connection, timed out by the server during the send, was replaced")
		require.True(t, lockFree(t, b.cfg.AppName))
		// The session went back to the pool with the role's timeout, as it came.
		var timeout string
		require.NoError(t, pool.QueryRow(ctx, "SHOW idle_session_timeout").Scan(&timeout))
		require.Equal(t, "300ms", timeout)
	})

	t.Run("LongerThanTheHeartbeatIsKeptAlive", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		id := b.insert(t, "t", "a")[0]
		cfg := b.cfg
		cfg.SendTimeout = 15 * time.Second // the send outlasts the idle timeout, not its own deadline
		r, err := relay.New(poolWithTimeout(t, "4s"), cfg, relay.SenderFunc("t", func(ctx context.Context, m relay.Message) error {
			select { // longer than the timeout: only the heartbeat keeps the lock's session alive
			case <-ctx.Done():
				return context.Cause(ctx)
			case <-time.After(5 * time.Second):
				return nil
			}
		}))
		require.NoError(t, err)
		ran, err := r.RunIfElected(ctx)
		require.True(t, ran)
		require.NoError(t, err, "the heartbeat kept the election's session from timing out")
		require.Equal(t, "SENT", b.state(t, id).Status, "the pooled session the server timed out meanwhile was replaced")
		require.True(t, lockFree(t, b.cfg.AppName))
	})
}
