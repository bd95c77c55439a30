package relay_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/xadm/relay"
	"github.com/xadm/relay/inbox"
)

// whsec is a whsec_ secret of 32 bytes of b.
func whsec(b byte) string {
	return "whsec_" + base64.StdEncoding.EncodeToString([]byte(strings.Repeat(string([]byte{b}), 32)))
}

// signedReceiver is a receiver on the inbox with verification on, mounted
// as PUT /orders/{key}, that answers 503 to the first attempt of key
// "retry" and records each attempt's signature headers.
type signedReceiver struct {
	*httptest.Server
	ib *inbox.Inbox

	mu       sync.Mutex
	attempts map[string][]http.Header // by key
	applied  map[string]int           // by idempotency key
}

func newSignedReceiver(t *testing.T, b *bundle, secrets ...string) *signedReceiver {
	t.Helper()
	table := b.table + "_in"
	require.NoError(t, inbox.CreateTable(context.Background(), b.pool, table))
	t.Cleanup(func() {
		_, _ = b.pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+pgx.Identifier{table}.Sanitize()+", "+pgx.Identifier{table + "_keys"}.Sanitize())
	})
	ib, err := inbox.New(b.pool, inbox.Config{Table: table, SigningSecrets: secrets, Logger: testLogger(t)})
	require.NoError(t, err)
	s := &signedReceiver{ib: ib, attempts: map[string][]http.Header{}, applied: map[string]int{}}
	h := ib.Handler(func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		s.mu.Lock()
		s.applied[m.IdempotencyKey]++
		s.mu.Unlock()
		return nil
	})
	mux := http.NewServeMux()
	mux.HandleFunc("PUT /orders/{key}", func(w http.ResponseWriter, r *http.Request) {
		key := r.PathValue("key")
		s.mu.Lock()
		s.attempts[key] = append(s.attempts[key], r.Header.Clone())
		first := len(s.attempts[key]) == 1
		s.mu.Unlock()
		if key == "retry" && first {
			http.Error(w, "busy", http.StatusServiceUnavailable)
			return
		}
		h.ServeHTTP(w, r)
	})
	s.Server = httptest.NewServer(mux)
	t.Cleanup(s.Close)
	return s
}

func (s *signedReceiver) headers(key string) []http.Header {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.attempts[key]
}

// TestSignedDelivery: the relay's signed deliveries are applied once each by
// an inbox that verifies them, during a rotation in either order; each
// attempt is signed anew; a retired secret's deliveries are refused, 401,
// and the rows die saying why.
func TestSignedDelivery(t *testing.T) {
	t.Parallel()
	b := setup(t)
	oldSecret, newSecret := whsec('o'), whsec('n')
	rcv := newSignedReceiver(t, b, oldSecret, newSecret)

	// The sender, in the middle of a rotation in the other order.
	sender, err := relay.NewHTTPSender(relay.HTTPSenderConfig{Type: "order", URL: relay.URLWithKey(rcv.URL + "/orders"),
		SigningSecrets: []string{newSecret, oldSecret}})
	require.NoError(t, err)
	cfg := b.cfg
	cfg.RetryBackoff = time.Second // the retry is a second later at least: a later timestamp
	ids := b.insert(t, "order", "a", "b", "retry")
	r := b.newRelay(t, cfg, sender)
	require.NoError(t, r.Start(t.Context()))
	t.Cleanup(func() { require.NoError(t, r.Stop(context.Background())) })
	require.Eventually(t, func() bool { return b.countStatus(t, "SENT") == len(ids) }, time.Minute, 10*time.Millisecond)

	for _, id := range ids {
		rcv.mu.Lock()
		n := rcv.applied[fmt.Sprintf("public.%s/%d", b.table, id)]
		rcv.mu.Unlock()
		require.Equal(t, 1, n, "message %d applied once", id)
	}
	h := rcv.headers("a")[0]
	require.Equal(t, h.Get("Idempotency-Key"), h.Get("webhook-id"))
	require.Len(t, strings.Split(h.Get("webhook-signature"), " "), 2, "one signature per secret")

	tries := rcv.headers("retry")
	require.Len(t, tries, 2)
	first, err := strconv.ParseInt(tries[0].Get("webhook-timestamp"), 10, 64)
	require.NoError(t, err)
	second, err := strconv.ParseInt(tries[1].Get("webhook-timestamp"), 10, 64)
	require.NoError(t, err)
	require.Greater(t, second, first, "a retry is signed anew, at its own time")
	require.NotEqual(t, tries[0].Get("webhook-signature"), tries[1].Get("webhook-signature"))

	t.Run("RetiredSecret", func(t *testing.T) {
		retired, err := relay.NewHTTPSender(relay.HTTPSenderConfig{Type: "refund", URL: relay.URLWithKey(rcv.URL + "/orders"),
			SigningSecrets: []string{whsec('r')}})
		require.NoError(t, err)
		unsigned, err := relay.NewHTTPSender(relay.HTTPSenderConfig{Type: "invoice", URL: relay.URLWithKey(rcv.URL + "/orders")})
		require.NoError(t, err)
		dead := b.insert(t, "refund", "r1")[0]
		bare := b.insert(t, "invoice", "i1")[0]
		_, err = b.newRelay(t, b.cfg, retired, unsigned).Run(t.Context())
		require.NoError(t, err)
		for id, reason := range map[int64]string{
			dead: "401 Unauthorized: inbox: header Webhook-Signature: no signature matches",
			bare: "401 Unauthorized: inbox: header Webhook-Id is missing: the request is not signed",
		} {
			st := b.state(t, id)
			require.Equal(t, "ERROR", st.Status)
			require.NotNil(t, st.LastError)
			require.Contains(t, *st.LastError, reason)
			require.Contains(t, *st.LastError, "permanent")
		}
	})
}

// TestHTTPSenderSigningSecretsRefused: a malformed secret is refused at
// construction, naming the field and its index, never the secret.
func TestHTTPSenderSigningSecretsRefused(t *testing.T) {
	t.Parallel()
	short := "whsec_" + base64.StdEncoding.EncodeToString([]byte("a secret of 23 bytes!!!"))
	pub := "whpk_" + base64.StdEncoding.EncodeToString(make([]byte, 32))
	_, err := relay.NewHTTPSender(relay.HTTPSenderConfig{Type: "t", URL: relay.URLWithKey("http://x"),
		SigningSecrets: []string{whsec('a'), short, pub, "hunter2-plain-text"}})
	require.ErrorContains(t, err, "relay: HTTPSenderConfig.SigningSecrets[1] is a whsec_ secret of 23 bytes")
	require.ErrorContains(t, err, "relay: HTTPSenderConfig.SigningSecrets[2] is an Ed25519 public key (whpk_), which cannot sign")
	require.ErrorContains(t, err, "relay: HTTPSenderConfig.SigningSecrets[3] is not a Standard Webhooks key")
	for _, s := range []string{short[6:], pub[5:], "hunter2"} {
		require.NotContains(t, err.Error(), s)
	}
	_, err = relay.NewHTTPSender(relay.HTTPSenderConfig{Type: "t", URL: relay.URLWithKey("http://x"),
		Header: http.Header{"Webhook-Signature": {"v1,x"}}})
	require.ErrorContains(t, err, "relay: HTTPSenderConfig.Header must not set Webhook-Signature")
}

// TestHTTPSenderRedactsEcho: a receiver that echoes the request in its error
// body puts no credential in last_error: the Authorization header's, an API
// key's and the signing secret are replaced.
func TestHTTPSenderRedactsEcho(t *testing.T) {
	t.Parallel()
	secret := whsec('s')
	echo := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprintf(w, "bad request: %v token=%s", r.Header, strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer "))
		fmt.Fprintf(w, " and your secret is %s", secret) // a receiver that misconfigures its own logging
	}))
	defer echo.Close()
	s, err := relay.NewHTTPSender(relay.HTTPSenderConfig{Type: "t", URL: relay.URLWithKey(echo.URL),
		Header:         http.Header{"Authorization": {"Bearer planted-bearer-token"}, "X-Api-Key": {"planted-api-key"}},
		SigningSecrets: []string{secret}})
	require.NoError(t, err)
	err = s.Send(t.Context(), relay.Message{ID: 1, Type: "t", Key: "k", Payload: []byte(`{}`)})
	require.Error(t, err)
	require.Contains(t, err.Error(), "400 Bad Request: bad request:")
	require.Contains(t, err.Error(), "[redacted]")
	for _, planted := range []string{"planted-bearer-token", "planted-api-key", secret, secret[6:]} {
		require.NotContains(t, err.Error(), planted)
	}
}
