package console_test

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/xadm/relay"
	"github.com/xadm/relay/console"
	"github.com/xadm/relay/internal/testkit/grants"
	"github.com/xadm/relay/internal/testkit/pgserver"
	"github.com/xadm/relay/internal/testkit/testcerts"
)

// plantedPassword is a database password no page or log may show.
const plantedPassword = "planted-db-password-c0n5"

func withPassword(t *testing.T, u string) string {
	t.Helper()
	p, err := url.Parse(u)
	require.NoError(t, err)
	p.User = url.UserPassword(p.User.Username(), plantedPassword)
	return p.String()
}

// consoleOf serves a console whose one source is an Admin on a pool of url.
func (w *world) consoleOf(t *testing.T, url string, actions bool) *httptest.Server {
	t.Helper()
	pool := pgserver.Pool(t, url, pgserver.Name(t), 4)
	admin, err := relay.NewAdmin(pool, w.cfg, relay.AdminAllTypes())
	require.NoError(t, err)
	return w.serve(t, console.Options{Sources: []console.Source{{Admin: admin}}, Actions: actions, Authorize: users})
}

// TestRoles: the console without Actions runs under the status role, with
// Actions under the admin role, each with exactly docs/security.md's grants;
// an action under the status role is refused, naming the table; the URL's
// password is on no page and in no log.
func TestRoles(t *testing.T) {
	t.Parallel()
	w := setup(t)
	dead := w.rows(t, "invoices", 2, "ERROR", ceiling, time.Hour)
	names := func(role string) grants.Names { return grants.Names{Role: role, Schema: "public", Table: w.table} }
	statusURL := withPassword(t, grants.Role(t, w.pool, pgserver.Shared().URL, grants.Status, names(w.table+"_status")))
	adminURL := withPassword(t, grants.Role(t, w.pool, pgserver.Shared().URL, grants.Admin, names(w.table+"_admin")))

	viewer := newClient(t, w.consoleOf(t, statusURL, false), "admin")
	for _, page := range []string{"/", "/dead?s=0", "/app?s=0"} {
		code, body := viewer.get(page)
		require.Equal(t, http.StatusOK, code, "%s: %s", page, body)
		require.NotContains(t, body, plantedPassword)
	}
	_, body := viewer.get("/dead?s=0")
	require.Contains(t, body, "invoices")

	// The status role with Actions on: the action is refused by PostgreSQL,
	// and the page says so.
	wrongRole := newClient(t, w.consoleOf(t, statusURL, true), "admin")
	token := wrongRole.token("/")
	_, body = wrongRole.post("/requeue", url.Values{"s": {"0"}, "id": {itoa(dead)}, "token": {token}, "confirm": {"1"}}, "same-origin")
	require.Contains(t, body, "permission denied for table "+w.table)
	require.NotContains(t, body, plantedPassword)
	st, _ := w.status(t, dead)
	require.Equal(t, "ERROR", st)

	acting := newClient(t, w.consoleOf(t, adminURL, true), "admin")
	token = acting.token("/")
	resp, body := acting.post("/requeue", url.Values{"s": {"0"}, "id": {itoa(dead)}, "token": {token}, "confirm": {"1"}}, "same-origin")
	require.Equal(t, http.StatusSeeOther, resp.StatusCode, body)
	st, attempts := w.status(t, dead)
	require.Equal(t, "ERROR", st)
	require.Zero(t, attempts, "re-queued")
	require.Empty(t, w.logs.Lines(plantedPassword))
}

// TestVerifyFull: the console reads a PostgreSQL that accepts verify-full
// TLS only; trusting another CA, its page says why, without the password.
func TestVerifyFull(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	srv, _ := pgserver.StartTLS(t)
	w := &world{app: pgserver.Name(t), table: pgserver.Name(t), logs: &logBuffer{}}
	w.pool = pgserver.Pool(t, srv.URL, w.app, 4)
	require.NoError(t, relay.CreateTable(ctx, w.pool, w.table))
	w.cfg = relay.DefaultConfig()
	w.cfg.AppName, w.cfg.Table, w.cfg.MaxAttempts = w.app, w.table, ceiling
	w.rows(t, "invoices", 1, "ERROR", ceiling, time.Hour)
	code, body := newClient(t, w.consoleOf(t, srv.URL, false), "admin").get("/dead?s=0")
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, "invoices")

	other, err := testcerts.NewCA("another CA")
	require.NoError(t, err)
	file := filepath.Join(t.TempDir(), "other.crt")
	require.NoError(t, os.WriteFile(file, other.CertPEM, 0o644))
	u, err := url.Parse(withPassword(t, srv.URL))
	require.NoError(t, err)
	q := u.Query()
	q.Set("sslrootcert", file)
	u.RawQuery = q.Encode()
	_, body = newClient(t, w.consoleOf(t, u.String(), false), "admin").get("/")
	require.Contains(t, body, "certificate signed by unknown authority")
	require.NotContains(t, body, plantedPassword)
	require.Empty(t, w.logs.Lines(plantedPassword))
}
