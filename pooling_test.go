package relay_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xadm/relay"
)

// Issue 22, item 1: replicas behind PgBouncer in transaction mode (their
// pools in QueryExecModeExec, as the docs advise behind such a pooler), in
// front of the real server. A session advisory lock stays with whichever
// server connection ran the statement, so no election can hold: the relay
// refuses to elect, loudly, and leaves no lock behind. With the refusal's
// check forced to miss, every statement of the lock's session acts only on
// its backend, so that still no key is delivered by two replicas at once and
// no lock is left on PgBouncer's server connections.

// keyWatch is a destination shared by every replica of a test: it counts the
// sends of a key that started while another replica was sending that key.
type keyWatch struct {
	mu       sync.Mutex
	inFlight map[string]string // key → the replica sending it
	overlaps int
	sent     int
}

func newKeyWatch() *keyWatch { return &keyWatch{inFlight: map[string]string{}} }

func (w *keyWatch) sender(replica string) relay.Sender {
	return relay.SenderFunc("t", func(ctx context.Context, m relay.Message) error {
		w.mu.Lock()
		if other, ok := w.inFlight[m.Key]; ok && other != replica {
			w.overlaps++
		}
		w.inFlight[m.Key] = replica
		w.mu.Unlock()
		select { // a destination that takes a moment: room for an overlap
		case <-ctx.Done():
		case <-time.After(time.Millisecond):
		}
		w.mu.Lock()
		if w.inFlight[m.Key] == replica {
			delete(w.inFlight, m.Key)
		}
		w.sent++
		w.mu.Unlock()
		return nil
	})
}

func (w *keyWatch) counts() (sent, overlaps int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.sent, w.overlaps
}

// appLocks counts the advisory locks of app's election anywhere on the server:
// its key (objsubid 1) and its partitions, member marks and configuration
// lock (objsubid 2, the key's hash first).
func appLocks(t testing.TB, app string) int {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), server().URL)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	var n int
	require.NoError(t, conn.QueryRow(context.Background(), `SELECT count(*) FROM pg_locks
		WHERE locktype = 'advisory' AND (
		  (objsubid = 1 AND classid = ((hashtext($1)::bigint >> 32) & 4294967295)::oid
		    AND objid = (hashtext($1)::bigint & 4294967295)::oid)
		  OR (objsubid = 2 AND classid = (hashtext($1)::bigint & 4294967295)::oid))`, app+relay.LockKeySuffix).Scan(&n))
	return n
}

func TestTransactionPooling(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	fleets := []struct {
		name                 string
		partitions, replicas int
	}{
		{"Partitioned", 8, 3},
		{"SingleKey", 1, 2},
	}
	keys := make([]string, 0, 300)
	for i := range 300 {
		keys = append(keys, fmt.Sprintf("k%02d", i%60)) // 60 keys, 5 rows each
	}

	t.Run("Refused", func(t *testing.T) {
		t.Parallel()
		for _, f := range fleets {
			t.Run(f.name, func(t *testing.T) {
				t.Parallel()
				b := setup(t)
				pb := startBouncer(t, "transaction")
				b.insert(t, "t", keys...)
				watch := newKeyWatch()
				var logs logBuffer
				for i := range f.replicas {
					cfg := b.cfg
					cfg.Partitions = f.partitions
					cfg.Logger = logs.Logger()
					r, err := relay.New(bouncerPool(t, pb.URL, 6, pgx.QueryExecModeExec), cfg, watch.sender(fmt.Sprint(i)))
					require.NoError(t, err)
					err = r.Start(ctx)
					require.ErrorIs(t, err, relay.ErrTransactionPooling, "Start refuses")
					require.ErrorContains(t, err, "pool_mode=session")
					for range 3 {
						ran, err := r.RunIfElected(ctx)
						require.False(t, ran)
						require.ErrorIs(t, err, relay.ErrTransactionPooling)
					}
					require.NoError(t, r.Stop(ctx), "a relay that never started stops")
				}
				sent, _ := watch.counts()
				require.Zero(t, sent, "nothing delivered")
				require.Equal(t, len(keys), b.countStatus(t, "PENDING"))
				require.Zero(t, appLocks(t, b.cfg.AppName), "no lock left, on PgBouncer's server connections or anywhere")
				require.Len(t, logs.Lines("level=ERROR"), f.replicas, "one ERROR per relay, at its check: %s", logs.String())
				require.Len(t, logs.Lines("level=ERROR", "transaction pooling detected"), f.replicas)
			})
		}
	})

	// A Scheduler's guard checks its own pool, even one of a single connection.
	t.Run("Guard", func(t *testing.T) {
		t.Parallel()
		for _, c := range []struct {
			mode     string
			maxConns int32
		}{{"transaction", 4}, {"transaction", 1}, {"session", 1}} {
			t.Run(fmt.Sprintf("%s%d", c.mode, c.maxConns), func(t *testing.T) {
				t.Parallel()
				b := setup(t)
				pb := startBouncer(t, c.mode)
				g := relay.NewPostgresGuard(bouncerPool(t, pb.URL, c.maxConns, pgx.QueryExecModeExec))
				var jobRan bool
				ran, err := g.TryRun(ctx, b.cfg.AppName+relay.LockKeySuffix, func(context.Context) error {
					jobRan = true
					return nil
				})
				if c.mode == "session" {
					require.NoError(t, err)
					require.True(t, ran)
					require.True(t, jobRan)
				} else {
					require.ErrorIs(t, err, relay.ErrTransactionPooling)
					require.False(t, ran)
					require.False(t, jobRan, "the job did not run behind transaction pooling")
				}
				require.Zero(t, appLocks(t, b.cfg.AppName))
			})
		}
	})

	// With the check forced to miss, the replicas run, and each statement of a
	// lock's session that PgBouncer runs on another server connection changes
	// nothing there, fails the election and lets go of the locks left behind.
	t.Run("CheckMissed", func(t *testing.T) {
		t.Parallel()
		for _, f := range fleets {
			t.Run(f.name, func(t *testing.T) {
				t.Parallel()
				b := setup(t)
				pb := startBouncer(t, "transaction")
				b.insert(t, "t", keys...)
				watch := newKeyWatch()
				var logs logBuffer
				var relays []*relay.Relay
				for i := range f.replicas {
					cfg := b.cfg
					cfg.Partitions = f.partitions
					cfg.Logger = logs.Logger()
					r, err := relay.New(bouncerPool(t, pb.URL, 6, pgx.QueryExecModeExec), cfg, watch.sender(fmt.Sprint(i)))
					require.NoError(t, err)
					relay.MissTransactionPoolingForTest(r)
					require.NoError(t, r.Start(ctx))
					t.Cleanup(func() { _ = r.Stop(context.Background()) })
					relays = append(relays, r)
				}
				passes := func() int64 {
					var n int64
					for _, r := range relays {
						st := r.Stats()
						n += st.PassesElected + st.PassesCoalesced + st.PassesFailed
					}
					return n
				}
				require.Eventually(t, func() bool {
					return b.countStatus(t, "SENT") == len(keys) || passes() >= 200
				}, 2*time.Minute, 10*time.Millisecond)
				for _, r := range relays {
					require.NoError(t, r.Stop(ctx))
				}
				sent, overlaps := watch.counts()
				t.Logf("%d sends, %d rows SENT of %d, %d passes, %d overlaps, %d lines naming transaction pooling",
					sent, b.countStatus(t, "SENT"), len(keys), passes(), overlaps,
					strings.Count(logs.String(), "transaction pooling"))
				require.Zero(t, overlaps, "no key delivered by two replicas at once")
				// Within less than the lease (10 s), after which the server's
				// idle_session_timeout would end an idle server connection
				// that holds one: the replicas let go of them themselves, and
				// a busy pooler's server connections are never idle that long.
				if !assert.Eventually(t, func() bool { return appLocks(t, b.cfg.AppName) == 0 }, 5*time.Second, 10*time.Millisecond,
					"no lock stranded on PgBouncer's server connections (PgBouncer still runs)") {
					var locks string
					require.NoError(t, b.pool.QueryRow(ctx, `SELECT string_agg(l.pid || ' ' || l.mode || ' ' || l.objsubid || ' ' || l.objid || ' ' || coalesce(a.state, '?') || ' ' || left(coalesce(a.query, '?'), 60), E'\n')
						FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid WHERE l.locktype = 'advisory'`).Scan(&locks))
					t.Log(locks)
					t.Log(logs.String())
				}
			})
		}
	})

	// Session mode keeps each client's server connection: the same fleets
	// deliver everything, each key on one replica at a time.
	t.Run("SessionModeDelivers", func(t *testing.T) {
		t.Parallel()
		for _, f := range fleets {
			t.Run(f.name, func(t *testing.T) {
				t.Parallel()
				b := setup(t)
				pb := startBouncer(t, "session")
				b.insert(t, "t", keys...)
				watch := newKeyWatch()
				var relays []*relay.Relay
				for i := range f.replicas {
					cfg := b.cfg
					cfg.Partitions = f.partitions
					r, err := relay.New(bouncerPool(t, pb.URL, 6, pgx.QueryExecModeCacheStatement), cfg, watch.sender(fmt.Sprint(i)))
					require.NoError(t, err)
					require.NoError(t, r.Start(ctx))
					t.Cleanup(func() { _ = r.Stop(context.Background()) })
					relays = append(relays, r)
				}
				require.Eventually(t, func() bool { return b.countStatus(t, "SENT") == len(keys) }, time.Minute, 10*time.Millisecond)
				for _, r := range relays {
					require.NoError(t, r.Stop(ctx))
				}
				_, overlaps := watch.counts()
				require.Zero(t, overlaps)
				require.Eventually(t, func() bool { return appLocks(t, b.cfg.AppName) == 0 }, 15*time.Second, 10*time.Millisecond)
			})
		}
	})
}
