package store

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/xadm/relay/internal/testkit/pgserver"
)

// TestEnqueueWakeTokenOneNotifierAtATime: of concurrent transactions whose
// Enqueue tries to wake the relays (EnqueueSQL with the wake-up, not forced),
// only the one holding the wake-up token notifies (wakeToken, sql/producer.sql).
func TestEnqueueWakeTokenOneNotifierAtATime(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, name := table(t)
	id := pgx.Identifier{name}
	channel := WakeChannel(id)
	listener, err := pgx.Connect(ctx, pgserver.Shared().URL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = listener.Close(context.Background()) })
	_, err = listener.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize())
	require.NoError(t, err)

	// enqueueIn is relay.Enqueue's statement, as it runs when the producer's
	// window lets the Enqueue try the token, and it has notified lately.
	enqueueIn := func(tx pgx.Tx, key string) {
		t.Helper()
		sql := EnqueueSQL[1][0]
		var rowID int64
		var notified bool
		require.NoError(t, tx.QueryRow(ctx, sql[0]+id.Sanitize()+sql[1], "t", key, `{}`, name, channel, false).Scan(&rowID, &notified)) // a key each: no order lock between them
	}
	holder, err := pool.Begin(ctx)
	require.NoError(t, err)
	enqueueIn(holder, "holder")
	second, err := pool.Begin(ctx)
	require.NoError(t, err)
	enqueueIn(second, "silenced")
	require.NoError(t, second.Commit(ctx))
	require.NoError(t, holder.Commit(ctx))
	_, err = pool.Exec(ctx, "SELECT pg_notify($1, 'sentinel')", channel)
	require.NoError(t, err)
	got := 0
	for {
		n, err := listener.WaitForNotification(ctx)
		require.NoError(t, err)
		if n.Payload == "sentinel" {
			break
		}
		t.Logf("notification %q from backend %d", n.Payload, n.PID)
		got++
	}
	require.Equal(t, 1, got, "the token holder's; the other sent none")
}
