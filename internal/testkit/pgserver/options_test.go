package pgserver

import (
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

func TestStartWithDurable(t *testing.T) {
	t.Parallel()
	// Not from the environment: a durable server of its own.
	s, err := StartWith(t.Context(), "", Options{Durable: true})
	require.NoError(t, err)
	t.Cleanup(func() { s.Stop() })
	conn := connect(t, s.URL, pgx.QueryExecModeCacheStatement)
	if s.Local() || s.Kind == "container" {
		require.Equal(t, "on", query[string](t, conn, "SHOW fsync"))
		require.Equal(t, "on", query[string](t, conn, "SHOW full_page_writes"))
	}
	require.Equal(t, "on", query[string](t, conn, "SHOW synchronous_commit"))

	// The shared server, from Start, keeps durability off for speed.
	if Shared().Kind != "env" {
		shared := connect(t, Shared().URL, pgx.QueryExecModeCacheStatement)
		require.Equal(t, "off", query[string](t, shared, "SHOW fsync"))
	}
}
