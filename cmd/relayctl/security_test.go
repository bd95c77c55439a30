package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xadm/relay"
	"github.com/xadm/relay/internal/testkit/grants"
	"github.com/xadm/relay/internal/testkit/pgserver"
	"github.com/xadm/relay/internal/testkit/testcerts"
)

// plantedPassword is a database password that relayctl must never print.
const plantedPassword = "planted-db-password-7f3a"

// withPassword is u with user's password set to plantedPassword (the test
// servers trust their clients: the password is carried, never checked).
func withPassword(t *testing.T, u string) string {
	t.Helper()
	p, err := url.Parse(u)
	require.NoError(t, err)
	p.User = url.UserPassword(p.User.Username(), plantedPassword)
	return p.String()
}

// ctlRun runs relayctl with args and returns its exit code and its output.
func ctlRun(ctx context.Context, args ...string) (int, string) {
	var out bytes.Buffer
	code := runWith(ctx, args, input{r: strings.NewReader("")}, &out, &out)
	return code, out.String()
}

// TestStatusRole: relayctl status and dead run under a role with exactly
// the status grants of docs/security.md, and its requeue is refused there,
// loudly; the password of the URL is in none of their output.
func TestStatusRole(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	w := setup(t)
	w.rows(t, "order", 2, "PENDING", 0, 0)
	w.rows(t, "order", 1, "ERROR", ceiling, 0)
	w.holdLikeGoRelay(t, "relay-"+w.app)
	role := w.table + "_status"
	u := grants.Role(t, w.pool, pgserver.Shared().URL, grants.Status, grants.Names{Role: role, Schema: "public", Table: w.table})
	u = withPassword(t, u)
	common := []string{"--database-url", u, "--app", w.app, "--table", w.table, "--max-attempts", fmt.Sprint(ceiling)}

	code, out := ctlRun(ctx, append([]string{"status"}, common...)...)
	require.Equal(t, 1, code, "WARNING: a dead row waits\n%s", out) // WARNING
	require.Contains(t, out, "dead")
	require.NotContains(t, out, plantedPassword)

	code, out = ctlRun(ctx, append([]string{"dead"}, common...)...)
	require.Equal(t, exitOK, code, out)
	require.NotContains(t, out, plantedPassword)

	code, out = ctlRun(ctx, append([]string{"requeue", "--all", "--all-types", "--yes"}, common...)...)
	require.Equal(t, exitError, code, out)
	require.Contains(t, out, "permission denied for table "+w.table)
	require.NotContains(t, out, plantedPassword)
}

// TestVerifyFull: relayctl works against a PostgreSQL that accepts
// verify-full TLS only; trusting another CA it fails, saying why.
func TestVerifyFull(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	srv, _ := pgserver.StartTLS(t)
	name := pgserver.Name(t)
	pool := pgserver.Pool(t, srv.URL, name, 2)
	require.NoError(t, relay.CreateTable(ctx, pool, name))
	common := []string{"--app", name, "--table", name}
	code, out := ctlRun(ctx, append([]string{"status", "--database-url", srv.URL}, common...)...)
	require.Equal(t, exitOK, code, out)

	other, err := testcerts.NewCA("another CA")
	require.NoError(t, err)
	file := filepath.Join(t.TempDir(), "other.crt")
	require.NoError(t, os.WriteFile(file, other.CertPEM, 0o644))
	u, err := url.Parse(srv.URL)
	require.NoError(t, err)
	q := u.Query()
	q.Set("sslrootcert", file)
	u.RawQuery = q.Encode()
	code, out = ctlRun(ctx, append([]string{"status", "--database-url", withPassword(t, u.String())}, common...)...)
	require.Equal(t, 3, code, out) // UNKNOWN: the database could not be asked
	require.Contains(t, out, "certificate signed by unknown authority")
	require.NotContains(t, out, plantedPassword)
}

// TestNoPasswordInOutput: whatever fails, relayctl's output never shows the
// URL's password: an unreachable server, a URL that does not parse, one
// that PostgreSQL's text cannot hold.
func TestNoPasswordInOutput(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closed := l.Addr().String()
	require.NoError(t, l.Close())
	for _, u := range []string{
		"postgres://relay:" + plantedPassword + "@" + closed + "/db?connect_timeout=5",
		"postgres://relay:" + plantedPassword + "@" + closed + "/db?sslmode=bogus",
		"postgres://relay:" + plantedPassword + "@" + closed + "/db\x00",
		"host=127.0.0.1 port=1 user=relay password=" + plantedPassword + " sslmode=verify-full sslrootcert=/nonexistent",
	} {
		for _, cmd := range []string{"status", "dead", "who"} {
			code, out := ctlRun(ctx, cmd, "--database-url", u, "--app", "a", "--table", "t")
			require.NotEqual(t, exitOK, code, out)
			require.NotContains(t, out, plantedPassword, "%s %q", cmd, u)
		}
	}
}
