package inbox_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/xadm/relay/inbox"
)

// TestPurge: Purge deletes, in chunks, the records older than its age and
// only those; the keys' last applied ids stay, so a purged message delivered
// again is still dropped, as stale.
func TestPurge(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ib := b.inbox(t)
	ctx := context.Background()
	table := pgx.Identifier{b.table}.Sanitize()

	// 2500 old records (two and a half chunks), and 3 recent ones.
	_, err := b.pool.Exec(ctx, "INSERT INTO "+table+" (idempotency_key, body_sha256, received_at) "+
		"SELECT 'old/' || i, '\\x00', now() - interval '8 days' FROM generate_series(1, 2500) i")
	require.NoError(t, err)
	for id := int64(1); id <= 3; id++ {
		_, err := ib.Receive(ctx, msg("order-1", id), b.apply)
		require.NoError(t, err)
	}

	n, err := ib.Purge(ctx, 7*24*time.Hour)
	require.NoError(t, err)
	require.Equal(t, int64(2500), n)
	require.Equal(t, 3, b.count(t, "inbox"))

	n, err = ib.Purge(ctx, 0)
	require.NoError(t, err)
	require.Equal(t, int64(3), n)
	require.Equal(t, 0, b.count(t, "inbox"))
	require.Equal(t, 1, b.count(t, "keys"), "the last applied id of order-1 stays")

	for id := int64(2); id <= 3; id++ {
		got, err := ib.Receive(ctx, msg("order-1", id), b.apply)
		require.NoError(t, err)
		require.Equal(t, inbox.Stale, got, "message %d, delivered again after its record was purged", id)
	}
	require.Equal(t, 3, b.count(t, "fx"))

	_, err = ib.Purge(ctx, -time.Second)
	require.ErrorContains(t, err, "inbox: Purge: age must not be negative, got -1s")
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	_, err = ib.Purge(cancelled, 0)
	require.ErrorIs(t, err, context.Canceled)
}

// TestRetentionJob: the job purges with its age and logs what it deleted.
func TestRetentionJob(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ib := b.inbox(t)
	ctx := context.Background()
	_, err := ib.Receive(ctx, msg("order-1", 1), b.apply)
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, "UPDATE "+pgx.Identifier{b.table}.Sanitize()+" SET received_at = now() - interval '2 hours'")
	require.NoError(t, err)
	_, err = ib.Receive(ctx, msg("order-1", 2), b.apply)
	require.NoError(t, err)

	require.NoError(t, ib.RetentionJob(time.Hour)(ctx))
	require.Equal(t, 1, b.count(t, "inbox"))
	require.Contains(t, b.logs.String(), "inbox: retention: purged message records")
	require.Contains(t, b.logs.String(), "rows=1")
}
