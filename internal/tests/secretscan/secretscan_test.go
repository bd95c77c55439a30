package secretscan_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/xadm/relay"
	"github.com/xadm/relay/console"
	"github.com/xadm/relay/inbox"
	"github.com/xadm/relay/internal/testkit/pgserver"
	"github.com/xadm/relay/internal/testkit/testlog"
	otelrelay "github.com/xadm/relay/otel"
)

// TestMain gets a real PostgreSQL and fails, never skips, when none can be had.
func TestMain(m *testing.M) { os.Exit(pgserver.Run(m, "RELAY_TEST_DATABASE_URL")) }

// The planted secrets.
const (
	authToken  = "planted-auth-token-1f2e3d"
	apiKey     = "planted-api-key-4c5b6a"
	dbPassword = "planted-db-password-9a8b"
)

var signingSecret = "whsec_" + base64.StdEncoding.EncodeToString([]byte("planted-signing-secret-material!"))

// planted is every form a secret could leak in.
var planted = []string{authToken, apiKey, dbPassword, signingSecret, strings.TrimPrefix(signingSecret, "whsec_")}

// rowsOf is every row of table, as text.
func rowsOf(t *testing.T, pool interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, table string) string {
	t.Helper()
	var b strings.Builder
	rs, err := pool.Query(context.Background(), "SELECT t::text FROM "+pgx.Identifier{table}.Sanitize()+" t")
	require.NoError(t, err)
	for rs.Next() {
		var line string
		require.NoError(t, rs.Scan(&line))
		b.WriteString(line + "\n")
	}
	require.NoError(t, rs.Err())
	return b.String()
}

// TestNoSecretAnywhere plants the secrets, delivers, fails and panics, then
// greps the logs (the relay's, the inbox's, the console's), every row (the
// outbox's, the inbox's), every page of the console, relayctl's output and
// every span's name, attributes, events and status.
func TestNoSecretAnywhere(t *testing.T) {
	ctx := t.Context()
	logs := &testlog.Buffer{}
	name := pgserver.Name(t)
	u, err := url.Parse(pgserver.Shared().URL)
	require.NoError(t, err)
	u.User = url.UserPassword(u.User.Username(), dbPassword) // carried, never checked: the test server trusts
	dbURL := u.String()
	pool := pgserver.Pool(t, dbURL, name, 8)
	inboxTable := name + "_in"
	require.NoError(t, relay.CreateTable(ctx, pool, name))
	require.NoError(t, inbox.CreateTable(ctx, pool, inboxTable))

	// The receiver: an inbox that verifies, and two that echo the request
	// (its Authorization, its signature) in their error bodies.
	ib, err := inbox.New(pool, inbox.Config{Table: inboxTable, SigningSecrets: []string{signingSecret}, Logger: logs.Logger()})
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle("PUT /ok/{key}", ib.Handler(func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		if m.Key == "apply-panics" {
			panic("apply panicked")
		}
		return nil
	}))
	echo := func(status int) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			dump, _ := httputil.DumpRequest(r, true)
			w.Header().Set("Location", "https://x.example/?token="+r.Header.Get("Authorization"))
			w.WriteHeader(status)
			_, _ = w.Write(dump)
			fmt.Fprintf(w, "\nsigned with %s", signingSecret)
		}
	}
	mux.Handle("PUT /echo/{key}", echo(http.StatusBadRequest))
	mux.Handle("PUT /busy/{key}", echo(http.StatusServiceUnavailable))
	dest := httptest.NewServer(mux)
	defer dest.Close()

	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	header := http.Header{"Authorization": {"Bearer " + authToken}, "X-Api-Key": {apiKey}}
	var senders []relay.Sender
	for _, typ := range []string{"ok", "echo", "busy", "urlpanics"} {
		urlOf := relay.URLWithKey(dest.URL + "/" + typ)
		if typ == "urlpanics" {
			urlOf = func(relay.Message) (string, error) { panic("the URL function panicked") }
		}
		s, err := relay.NewHTTPSender(relay.HTTPSenderConfig{Type: typ, URL: urlOf, Header: header, SigningSecrets: []string{signingSecret}})
		require.NoError(t, err)
		senders = append(senders, otelrelay.WrapSender(s, otelrelay.WithTracerProvider(tp)))
	}
	cfg := relay.DefaultConfig()
	cfg.AppName, cfg.Table, cfg.Interval, cfg.RetryBackoff, cfg.MaxAttempts = name, name, 20*time.Millisecond, 0, 3
	cfg.Logger = logs.Logger()
	r, err := relay.New(pool, cfg, senders...)
	require.NoError(t, err)
	for _, m := range []struct{ typ, key string }{{"ok", "a"}, {"ok", "apply-panics"}, {"echo", "b"}, {"busy", "c"}, {"urlpanics", "d"}} {
		_, err := pool.Exec(ctx, "INSERT INTO "+pgx.Identifier{name}.Sanitize()+" (type, natural_key, payload) VALUES ($1, $2, '{}')", m.typ, m.key)
		require.NoError(t, err)
	}
	require.NoError(t, r.Start(ctx))
	count := func(where string) int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{name}.Sanitize()+" WHERE "+where).Scan(&n))
		return n
	}
	// Delivered, dead at once (the echo's 400), dead after retries (the
	// echo's 503, the panics).
	require.Eventually(t, func() bool {
		return count("status = 'SENT'") == 1 && count("status = 'ERROR' AND attempts >= 3") == 4
	}, 2*time.Minute, 20*time.Millisecond, "%s", rowsOf(t, pool, name))
	require.NoError(t, r.Stop(ctx))

	haystacks := map[string]string{"logs": logs.String()}
	rows := func(table string) string { return rowsOf(t, pool, table) }
	haystacks["outbox rows"] = rows(name)
	haystacks["inbox rows"] = rows(inboxTable) + rows(inboxTable+"_keys")

	// The console, every page.
	admin, err := relay.NewAdmin(pool, cfg, relay.AdminAllTypes())
	require.NoError(t, err)
	c, err := console.New(console.Options{Sources: []console.Source{{Admin: admin, Relay: r}}, Actions: true, Logger: logs.Logger(),
		Authorize: func(*http.Request) (string, bool, bool) { return "operator", true, true }})
	require.NoError(t, err)
	for _, page := range []string{"/", "/app?s=0", "/dead?s=0", "/dead?s=0&type=echo", "/charts?s=0"} {
		w := httptest.NewRecorder()
		c.ServeHTTP(w, httptest.NewRequest(http.MethodGet, page, nil))
		require.Equal(t, http.StatusOK, w.Code, page)
		haystacks["console "+page] = w.Body.String()
	}

	// relayctl, built from this tree, on the URL with the password, and on
	// one where nothing answers.
	bin := filepath.Join(t.TempDir(), "relayctl")
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/xadm/relay/cmd/relayctl")
	out, err := build.CombinedOutput()
	require.NoError(t, err, "%s", out)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	closed := l.Addr().String()
	require.NoError(t, l.Close())
	for _, args := range [][]string{
		{"status", "--database-url", dbURL}, {"dead", "--database-url", dbURL}, {"who", "--database-url", dbURL},
		{"status", "--database-url", "postgres://relay:" + dbPassword + "@" + closed + "/db?connect_timeout=5"},
	} {
		cmd := exec.CommandContext(ctx, bin, append(args, "--app", name, "--table", name, "--max-attempts", "3")...)
		var b bytes.Buffer
		cmd.Stdout, cmd.Stderr = &b, &b
		_ = cmd.Run() // exit codes are a verdict here, not a failure
		haystacks["relayctl "+args[0]] += b.String()
	}

	// The spans.
	var sb strings.Builder
	for _, s := range spans.Ended() {
		sb.WriteString(s.Name() + " " + s.Status().Description + "\n")
		for _, a := range s.Attributes() {
			sb.WriteString(string(a.Key) + "=" + a.Value.String() + "\n")
		}
		for _, e := range s.Events() {
			sb.WriteString(e.Name + "\n")
			for _, a := range e.Attributes {
				sb.WriteString(string(a.Key) + "=" + a.Value.String() + "\n")
			}
		}
	}
	haystacks["spans"] = sb.String()

	// What was grepped holds what it should: the failures, the panics, the
	// redaction at work.
	require.Contains(t, haystacks["outbox rows"], "[redacted]")
	require.Contains(t, haystacks["outbox rows"], "the URL function panicked")
	require.Contains(t, haystacks["logs"], "apply panicked")
	require.Contains(t, haystacks["console /dead?s=0"], "400 Bad Request")
	require.Contains(t, haystacks["relayctl dead"], "echo")
	require.Contains(t, haystacks["relayctl status"], "connect")
	require.Contains(t, haystacks["spans"], "503 Service Unavailable")

	for where, text := range haystacks {
		for _, p := range planted {
			require.NotContains(t, text, p, "a planted secret in %s", where)
		}
	}
}
