package election

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/xadm/relay/internal/session"
	"github.com/xadm/relay/internal/store"
	"github.com/xadm/relay/internal/testkit/pgserver"
)

// This file is the world of the elections' own tests: elections built by
// this package, as relay.New builds them (election.go in the root), against
// the test binary's PostgreSQL, without a Relay around them. A test drives
// the passes itself, as the loop (internal/loop) would.

// testApp is one test's app: its outbox table and the election's key.
type testApp struct {
	name  string // the app name, and the table's
	key   string // the election's key: name + "_relay_m2m"
	table *store.Table
}

// newTestApp creates the test's outbox table (dropped at its end).
func newTestApp(t *testing.T) *testApp {
	t.Helper()
	name := pgserver.Name(t)
	pool := pgserver.Pool(t, pgserver.Shared().URL, name, 2)
	ctx := context.Background()
	require.NoError(t, store.CreateTable(ctx, pool, name))
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+pgx.Identifier{name}.Sanitize()+", "+
			pgx.Identifier{name + "_types"}.Sanitize())
	})
	table, err := store.NewTable(name, 0, time.Minute, false)
	require.NoError(t, err)
	return &testApp{name: name, key: name + "_relay_m2m", table: table}
}

// replica is what relay.New gives one replica's election, on a pool of its
// own (named after the replica, as the root's tests name theirs).
func (a *testApp) replica(t *testing.T, name string, partitions int, interval time.Duration) *Deps {
	t.Helper()
	pool := pgserver.Pool(t, pgserver.Shared().URL, a.name+"_"+name, 4)
	types := []string{"t"}
	return &Deps{Pool: pool, Logger: slog.New(slog.NewTextHandler(t.Output(), nil)).With("replica", name),
		Key: a.key, Table: a.name, Types: types, MaxAttempts: 5, Partitions: partitions, Interval: interval,
		Sessions: &session.SessionCheck{}, Presence: session.NewPresence(a.name, a.name, 5, partitions, types), Statements: a.table}
}

// polled is the replica's Polled election, on a guard of its own on its pool.
func polled(r *Deps) *polledElection {
	return NewPolled(r, NewGuard(r.Pool, r.Logger, r.Sessions)).(*polledElection)
}

// holders returns the backends that hold key's election (exclusive or
// shared), as seen from a direct session.
func holders(t *testing.T, key string) []int32 {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, pgserver.Shared().URL)
	require.NoError(t, err)
	defer conn.Close(ctx)
	var pids []int32
	require.NoError(t, conn.QueryRow(ctx, `SELECT coalesce(array_agg(pid ORDER BY pid), '{}') FROM pg_locks
		WHERE locktype = 'advisory' AND objsubid = 1 AND granted
		  AND classid = ((hashtext($1)::bigint >> 32) & 4294967295)::oid
		  AND objid = (hashtext($1)::bigint & 4294967295)::oid`, key).Scan(&pids))
	return pids
}

// serveOwn holds a session of r's own, out of its pool, and runs on it the
// statements handed to the OwnSession it returns, as the relay's wake-up
// listener does between its waits (internal/wake), until the test ends.
func serveOwn(t *testing.T, r *Deps) *session.OwnSession {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	c, err := r.Pool.Acquire(ctx)
	require.NoError(t, err)
	conn := c.Hijack()
	own := session.NewOwnSession()
	own.Hold(conn)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		pid := conn.PgConn().PID()
		for ctx.Err() == nil {
			if own.Serve(ctx, conn, pid) || !own.StartWait() {
				continue
			}
			_, _ = conn.WaitForNotification(ctx) // a job handed over cuts it short
			own.EndWait(conn)
		}
	}()
	t.Cleanup(func() {
		cancel()
		wg.Wait()
		own.Release()
		_ = conn.Close(context.Background())
	})
	return own
}
