package relay

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/xadm/relay/internal/testkit/pgserver"
	"github.com/xadm/relay/internal/wake"
)

// TestEnqueueOneWakeUpPerWindow: one process's dense Enqueues within its
// window (internal/wake; here an hour long, on windows of the test's own):
// the first carries the wake-up, the others neither try the token nor notify.
func TestEnqueueOneWakeUpPerWindow(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, table := internalTable(t)
	channel := "relay:" + table
	listener, err := pgx.Connect(ctx, pgserver.Shared().URL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = listener.Close(context.Background()) })
	_, err = listener.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize())
	require.NoError(t, err)

	window := withWakeWindows(wake.NewWindows(time.Hour, time.Hour, time.Hour))
	for i := range 20 {
		_, err := Enqueue(ctx, pool, table, Outgoing{Type: "burst", Key: fmt.Sprint("k", i), Payload: []byte(`{}`)}, window)
		require.NoError(t, err)
	}
	_, err = pool.Exec(ctx, "SELECT pg_notify($1, 'sentinel')", channel)
	require.NoError(t, err)
	var burst []string
	for {
		n, err := listener.WaitForNotification(ctx)
		require.NoError(t, err)
		if n.Payload == "sentinel" {
			break
		}
		burst = append(burst, n.Payload)
	}
	require.Equal(t, []string{"burst"}, burst, "one wake-up per window")
}
