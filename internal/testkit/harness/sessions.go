package harness

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/xadm/relay/internal/testkit/pgserver"
)

// ListenOn opens a session of the test's own, closed at its end, that
// LISTENs on channel.
func ListenOn(t *testing.T, channel string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), Server().URL)
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(context.Background()) })
	_, err = conn.Exec(context.Background(), "LISTEN "+pgx.Identifier{channel}.Sanitize())
	require.NoError(t, err)
	return conn
}

// AppNameOf is the application_name the pool's sessions carry (NewPool sets
// one per pool).
func AppNameOf(pool *pgxpool.Pool) string {
	return pool.Config().ConnConfig.RuntimeParams["application_name"]
}

// BouncerPool opens a pool of maxConns through a PgBouncer at url, closed at
// the test's end; mode is pgx's query exec mode (pgx's default statement
// cache does not survive transaction pooling before PgBouncer 1.21).
func BouncerPool(t *testing.T, url string, maxConns int32, mode pgx.QueryExecMode) *pgxpool.Pool {
	t.Helper()
	return pgserver.Pool(t, url, "", maxConns, func(pc *pgxpool.Config) { pc.ConnConfig.DefaultQueryExecMode = mode })
}

// StartBouncer starts a PgBouncer in pool mode mode in front of Server,
// stopped at the test's end; without pgbouncer installed it skips the test
// (pgserver.RequirePgBouncer).
func StartBouncer(t *testing.T, mode string) *pgserver.PgBouncer {
	t.Helper()
	pgserver.RequirePgBouncer(t)
	pb, err := pgserver.StartPgBouncer(context.Background(), Server(), mode)
	require.NoError(t, err)
	t.Cleanup(func() { _ = pb.Stop() })
	return pb
}
