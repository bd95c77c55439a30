package store

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/xadm/relay/internal/testkit/pgserver"
)

// TestPresenceSessionCutInATransactionEnds: a presence session whose client
// is cut off without a FIN (a proxy that stops forwarding and keeps the
// sockets open) right after it opened a transaction — the claim of the
// relay's types opens one — is ended by the server within its lease, locks
// and all, as it is when cut while idle: the presence statement bounds the
// session's idle time inside a transaction too.
func TestPresenceSessionCutInATransactionEnds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, name := table(t)
	proxy, viaProxy, err := pgserver.ProxyURL(pgserver.Shared().URL)
	require.NoError(t, err)
	t.Cleanup(func() { proxy.Close() })
	conn, err := pgx.Connect(ctx, viaProxy)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })

	const lease = time.Second
	args := []any{name, int32(1), int32(5), int32(1), []string{"t"}, name}
	pid, ok, err := PresenceTakeStatement(ctx, conn, "", args, lease)
	require.NoError(t, err)
	require.True(t, ok)
	_, err = conn.Exec(ctx, "BEGIN")
	require.NoError(t, err)
	proxy.Freeze()
	t.Cleanup(proxy.Thaw)
	require.Eventually(t, func() bool {
		var alive bool
		require.NoError(t, pool.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_stat_activity WHERE pid = $1)", int32(pid)).Scan(&alive))
		return !alive
	}, time.Minute, 10*time.Millisecond, "the server ends the session cut off in its transaction, and its presence locks with it")
}
