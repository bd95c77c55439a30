package relay

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/xadm/relay/internal/session"
)

// TestStopCuttingTheOwnSessionShortLeavesNoPresence: Stop cancels what runs
// on the relay's own session (a keepalive, a statement handed to it), which
// closes the session before presence's release is sent; its backend, busy in
// the statement, would hold the replica's presence until the statement ends
// (relayctl who listed a stopped replica, once, under load). Stop returns
// with the replica gone all the same.
func TestStopCuttingTheOwnSessionShortLeavesNoPresence(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, cfg := internalConfig(t)
	r, err := New(pool, cfg, SenderFunc("t", func(context.Context, Message) error { return nil }))
	require.NoError(t, err)
	require.NoError(t, r.Start(ctx))
	t.Cleanup(func() { _ = r.Stop(context.Background()) })

	presence := func() uint32 { return presencePID(t, pool, r) }
	var pid uint32
	require.Eventually(t, func() bool { pid = presence(); return pid != 0 }, time.Minute, 10*time.Millisecond)

	// A statement on the own session that outlasts Stop.
	ran := make(chan error, 1)
	go func() {
		for {
			err := r.loop.Own().Do(ctx, func(ctx context.Context, conn *pgx.Conn, _ uint32) error {
				_, err := conn.Exec(ctx, "SELECT pg_sleep(600)")
				return err
			})
			if !errors.Is(err, session.ErrNoSession) {
				ran <- err
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	require.Eventually(t, func() bool {
		var sleeping bool
		require.NoError(t, pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1 AND query LIKE '%pg_sleep(600)%' AND state = 'active')`,
			pid).Scan(&sleeping))
		return sleeping
	}, time.Minute, 10*time.Millisecond, "the statement runs on the presence's backend")

	require.NoError(t, r.Stop(ctx))
	require.Zero(t, presence(), "the stopped replica's presence is gone when Stop returns")
	require.Error(t, <-ran, "the statement was cut short")
}

// presencePID is the backend that holds r's presence (its replica's lock), 0
// when none does.
func presencePID(t *testing.T, pool *pgxpool.Pool, r *Relay) (pid uint32) {
	t.Helper()
	err := pool.QueryRow(context.Background(), `SELECT coalesce(min(pid), 0) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2
		AND classid = (hashtext('relay_presence_replica:' || $1)::bigint & 4294967295)::oid
		AND objid = ($2::int::bigint & 4294967295)::oid AND granted`, r.cfg.AppName, r.presence.Args()[1]).Scan(&pid)
	require.NoError(t, err)
	return pid
}
