package relay_test

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/xadm/relay"
	"github.com/xadm/relay/internal/testkit/pgserver"
	"github.com/xadm/relay/internal/testkit/testcerts"
)

// mtlsDestination is an HTTPS destination that requires a client certificate
// of clientCA, serving one of its own CA; it records the client certificates'
// names.
type mtlsDestination struct {
	*httptest.Server
	ca *testcerts.CA // the destination's own

	mu      sync.Mutex
	clients []string
}

func newMTLSDestination(t *testing.T, clientCA *testcerts.CA) *mtlsDestination {
	t.Helper()
	ca, err := testcerts.NewCA("destination CA")
	require.NoError(t, err)
	pair, err := ca.Server()
	require.NoError(t, err)
	cert, err := pair.TLS()
	require.NoError(t, err)
	d := &mtlsDestination{ca: ca}
	d.Server = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d.mu.Lock()
		d.clients = append(d.clients, r.TLS.PeerCertificates[0].Subject.CommonName)
		d.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	d.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshakes below are the point
	d.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: clientCA.Pool()}
	d.StartTLS()
	t.Cleanup(d.Close)
	return d
}

func (d *mtlsDestination) seen() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.clients...)
}

// TestTLSEndToEnd: the relay runs, its election, wake-ups and presence
// included, against a PostgreSQL that accepts verify-full TLS only, and
// delivers by mutual TLS to a destination that requires its client
// certificate. A wrong CA on either side is refused, saying so.
func TestTLSEndToEnd(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	srv, _ := pgserver.StartTLS(t)
	name := pgserver.Name(t)
	pool := pgserver.Pool(t, srv.URL, name, 8)
	require.NoError(t, relay.CreateTable(ctx, pool, name))

	clientCA, err := testcerts.NewCA("relay client CA")
	require.NoError(t, err)
	clientPair, err := clientCA.Client("orders-relay")
	require.NoError(t, err)
	clientCert, err := clientPair.TLS()
	require.NoError(t, err)
	dest := newMTLSDestination(t, clientCA)

	sender, err := relay.NewHTTPSender(relay.HTTPSenderConfig{
		Type: "order", URL: relay.URLWithKey(dest.URL + "/orders"),
		TLS: &tls.Config{RootCAs: dest.ca.Pool(), Certificates: []tls.Certificate{clientCert}},
	})
	require.NoError(t, err)
	cfg := relay.DefaultConfig()
	cfg.AppName, cfg.Table, cfg.Interval, cfg.WakeOnCommit = name, name, time.Hour, true // only the wake-ups deliver
	cfg.Logger = testLogger(t)
	r, err := relay.New(pool, cfg, sender)
	require.NoError(t, err)
	require.NoError(t, r.Start(ctx))
	t.Cleanup(func() { require.NoError(t, r.Stop(context.Background())) })

	// Each message after the first pass: only a NOTIFY through the TLS
	// listener's session can start its pass.
	require.Eventually(t, func() bool { return r.Stats().PassesElected >= 1 }, time.Minute, 10*time.Millisecond)
	for _, key := range []string{"a", "b", "c"} {
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		_, err = relay.Enqueue(ctx, tx, name, relay.Outgoing{Type: "order", Key: key, Payload: []byte(`{}`)})
		require.NoError(t, err)
		require.NoError(t, tx.Commit(ctx))
		require.Eventually(t, func() bool {
			var status string
			require.NoError(t, pool.QueryRow(ctx, "SELECT status FROM "+pgx.Identifier{name}.Sanitize()+" WHERE natural_key = $1", key).Scan(&status))
			return status == "SENT"
		}, time.Minute, 10*time.Millisecond, "message %s delivered", key)
	}
	require.Equal(t, []string{"orders-relay", "orders-relay", "orders-relay"}, dest.seen())

	// Every session of the relay's pool (the listener's, which carries the
	// presence, the election's, the passes') is over TLS; the server refuses
	// any other anyway (pg_hba: hostssl only).
	var sessions, encrypted int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*), count(*) FILTER (WHERE s.ssl) FROM pg_stat_activity a
		JOIN pg_stat_ssl s USING (pid) WHERE a.application_name = $1`, name).Scan(&sessions, &encrypted))
	require.GreaterOrEqual(t, sessions, 2, "the listener's session and at least one other")
	require.Equal(t, sessions, encrypted)

	t.Run("WrongDatabaseCA", func(t *testing.T) {
		other, err := testcerts.NewCA("another CA")
		require.NoError(t, err)
		file := filepath.Join(t.TempDir(), "other.crt")
		require.NoError(t, os.WriteFile(file, other.CertPEM, 0o644))
		u, err := url.Parse(srv.URL)
		require.NoError(t, err)
		q := u.Query()
		q.Set("sslrootcert", file)
		u.RawQuery = q.Encode()
		wrong, err := relay.New(pgserver.Pool(t, u.String(), name+"_wrong", 2), cfg, sender)
		require.NoError(t, err)
		_, err = wrong.Run(ctx)
		require.ErrorContains(t, err, "certificate signed by unknown authority")
	})

	t.Run("WrongDestinationCA", func(t *testing.T) {
		other, err := testcerts.NewCA("another CA")
		require.NoError(t, err)
		s, err := relay.NewHTTPSender(relay.HTTPSenderConfig{Type: "order", URL: relay.URLWithKey(dest.URL),
			TLS: &tls.Config{RootCAs: other.Pool(), Certificates: []tls.Certificate{clientCert}}})
		require.NoError(t, err)
		err = s.Send(ctx, relay.Message{ID: 1, Type: "order", Key: "k", Payload: []byte(`{}`)})
		require.ErrorContains(t, err, "certificate signed by unknown authority")
		var unknown x509.UnknownAuthorityError
		require.ErrorAs(t, err, &unknown)
	})

	t.Run("NoClientCertificate", func(t *testing.T) {
		s, err := relay.NewHTTPSender(relay.HTTPSenderConfig{Type: "order", URL: relay.URLWithKey(dest.URL),
			TLS: &tls.Config{RootCAs: dest.ca.Pool()}})
		require.NoError(t, err)
		err = s.Send(ctx, relay.Message{ID: 1, Type: "order", Key: "k", Payload: []byte(`{}`)})
		require.ErrorContains(t, err, "certificate required")
	})

	t.Run("ClientAndTLS", func(t *testing.T) {
		_, err := relay.NewHTTPSender(relay.HTTPSenderConfig{Type: "order", URL: relay.URLWithKey(dest.URL),
			Client: &http.Client{}, TLS: &tls.Config{}})
		require.ErrorContains(t, err, "relay: HTTPSenderConfig.TLS must be nil when Client is set")
	})
}
