package pgserver

import (
	"context"
	"net/url"
	"os"
	"path/filepath"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/xadm/relay/internal/testkit/testcerts"
)

// TestTLS: a cluster started with TLS serves verify-full connections only;
// a client that trusts another CA, or asks for no TLS, is refused, saying why;
// a rotated certificate is served to the connections made after it.
func TestTLS(t *testing.T) {
	t.Parallel()
	s, _ := StartTLS(t)
	ctx := t.Context()
	conn, err := pgx.Connect(ctx, s.URL)
	require.NoError(t, err)
	var ssl bool
	require.NoError(t, conn.QueryRow(ctx, "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").Scan(&ssl))
	require.True(t, ssl)
	require.NoError(t, conn.Close(ctx))

	u, err := url.Parse(s.URL)
	require.NoError(t, err)
	q := u.Query()
	q.Set("sslmode", "disable")
	u.RawQuery = q.Encode()
	_, err = pgx.Connect(ctx, u.String())
	require.ErrorContains(t, err, "no pg_hba.conf entry")

	other, err := testcerts.NewCA("another CA")
	require.NoError(t, err)
	otherFile := filepath.Join(t.TempDir(), "other.crt")
	require.NoError(t, os.WriteFile(otherFile, other.CertPEM, 0o644))
	q.Set("sslmode", "verify-full")
	q.Set("sslrootcert", otherFile)
	u.RawQuery = q.Encode()
	_, err = pgx.Connect(ctx, u.String())
	require.ErrorContains(t, err, "certificate signed by unknown authority")

	// Rotation: the new certificate, of another CA, is what a new connection
	// meets; verified against the old CA it is refused.
	pair, err := other.Server()
	require.NoError(t, err)
	require.NoError(t, s.RotateTLS(ctx, pair.CertPEM, pair.KeyPEM))
	_, err = pgx.Connect(ctx, s.URL)
	require.ErrorContains(t, err, "certificate signed by unknown authority")
	conn, err = pgx.Connect(ctx, u.String())
	require.NoError(t, err)
	require.NoError(t, conn.Close(context.Background()))
}
