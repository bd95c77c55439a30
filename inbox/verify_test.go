package inbox_test

import (
	"bufio"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/xadm/relay/inbox"
	"github.com/xadm/relay/internal/signing"
)

// testSecret is a whsec_ secret of 32 bytes of b.
func testSecret(b byte) string {
	return "whsec_" + base64.StdEncoding.EncodeToString([]byte(strings.Repeat(string([]byte{b}), 32)))
}

// signed is request(key, id, body) signed at time at with secrets.
func signed(t *testing.T, key string, id int64, body string, at time.Time, secrets ...string) *http.Request {
	t.Helper()
	r := request(key, id, body)
	s, err := signing.NewSigner("test", secrets)
	require.NoError(t, err)
	wid := r.Header.Get("Idempotency-Key")
	r.Header.Set("webhook-id", wid)
	r.Header.Set("webhook-timestamp", strconv.FormatInt(at.Unix(), 10))
	r.Header.Set("webhook-signature", s.Sign(wid, at.Unix(), []byte(body)))
	return r
}

// TestHandlerVerifies: with SigningSecrets, a request is applied only when
// signed by a configured secret within the tolerance; every other is a 401
// that says why, and nothing is applied or recorded.
func TestHandlerVerifies(t *testing.T) {
	t.Parallel()
	b := setup(t)
	oldSecret, newSecret, retired := testSecret('o'), testSecret('n'), testSecret('r')
	ib := b.inbox(t, func(c *inbox.Config) { c.SigningSecrets = []string{newSecret, oldSecret} })
	h := ib.Handler(b.apply)
	now := time.Now()

	refused := func(r *http.Request, reason string) {
		t.Helper()
		w := serve(h, r)
		require.Equal(t, http.StatusUnauthorized, w.Code, w.Body.String())
		require.Contains(t, w.Body.String(), reason)
		require.Zero(t, b.count(t, "inbox"), "a refused request records nothing")
		require.Zero(t, b.count(t, "fx"), "a refused request applies nothing")
	}
	unsigned := request("k", 1, `{"id": 1}`)
	refused(unsigned, "header Webhook-Id is missing: the request is not signed")

	forged := signed(t, "k", 1, `{"id": 1}`, now, oldSecret)
	forged.Header.Set("webhook-signature", "v1,"+base64.StdEncoding.EncodeToString(make([]byte, 32)))
	refused(forged, "no signature matches")

	tampered := signed(t, "k", 1, `{"id": 1}`, now, oldSecret)
	tampered.Body = io.NopCloser(strings.NewReader(`{"id": 666}`))
	tampered.ContentLength = int64(len(`{"id": 666}`))
	refused(tampered, "no signature matches")

	refused(signed(t, "k", 1, `{"id": 1}`, now, retired), "a key retired or not yet configured")
	refused(signed(t, "k", 1, `{"id": 1}`, now.Add(-6*time.Minute), oldSecret), "old, beyond the tolerance of 5m0s: a replay")
	refused(signed(t, "k", 1, `{"id": 1}`, now.Add(6*time.Minute), oldSecret), "in the future, beyond the tolerance of 5m0s")

	malformed := signed(t, "k", 1, `{"id": 1}`, now, oldSecret)
	malformed.Header.Set("webhook-timestamp", "yesterday")
	refused(malformed, `header Webhook-Timestamp "yesterday" is not a Unix time`)
	malformed = signed(t, "k", 1, `{"id": 1}`, now, oldSecret)
	malformed.Header.Set("webhook-signature", "K5oZfzN95Z9UVu1EsfQmfVNQhnkZ2pj9o9NDN/H/pI4=")
	refused(malformed, "header Webhook-Signature is malformed")

	// The signed id must be the key the inbox deduplicates by: a captured
	// request under a new Idempotency-Key would otherwise apply again.
	moved := signed(t, "k", 1, `{"id": 1}`, now, oldSecret)
	moved.Header.Set("Idempotency-Key", "public.outbox/99")
	refused(moved, `header Idempotency-Key "public.outbox/99" is not the signed Webhook-Id "public.outbox/1"`)

	// A rotation: whichever of the configured secrets signs, alone or with
	// others, in either order, the message is applied, once.
	for i, secrets := range [][]string{{oldSecret}, {newSecret}, {oldSecret, newSecret}, {newSecret, oldSecret}, {retired, newSecret}} {
		id := int64(i + 1)
		w := serve(h, signed(t, "k", id, fmt.Sprintf(`{"id": %d}`, id), now, secrets...))
		require.Equal(t, http.StatusNoContent, w.Code, w.Body.String())
		require.Equal(t, "applied", w.Header().Get(inbox.HeaderOutcome))
		w = serve(h, signed(t, "k", id, fmt.Sprintf(`{"id": %d}`, id), now, secrets...))
		require.Equal(t, "duplicate", w.Header().Get(inbox.HeaderOutcome), "a replay within the tolerance is the duplicate it is")
		require.Equal(t, 1, b.effectCount(t, fmt.Sprintf("public.outbox/%d", id)))
	}
}

// TestSignatureTolerance: the tolerance is configurable, and New refuses
// what it cannot use, naming the field and never the secret.
func TestSignatureTolerance(t *testing.T) {
	t.Parallel()
	b := setup(t)
	secret := testSecret('t')
	ib := b.inbox(t, func(c *inbox.Config) { c.SigningSecrets, c.SignatureTolerance = []string{secret}, time.Minute })
	h := ib.Handler(b.apply)
	w := serve(h, signed(t, "k", 1, `{}`, time.Now().Add(-2*time.Minute), secret))
	require.Equal(t, http.StatusUnauthorized, w.Code)
	require.Contains(t, w.Body.String(), "beyond the tolerance of 1m0s")
	w = serve(h, signed(t, "k", 1, `{}`, time.Now().Add(-30*time.Second), secret))
	require.Equal(t, http.StatusNoContent, w.Code, w.Body.String())

	short := "whsec_" + base64.StdEncoding.EncodeToString([]byte("sixteen byte key"))
	for _, c := range []struct {
		cfg  inbox.Config
		want string
	}{
		{inbox.Config{SigningSecrets: []string{secret, short}}, "inbox: Config.SigningSecrets[1] is a whsec_ secret of 16 bytes"},
		{inbox.Config{SigningSecrets: []string{"whsec_%%%"}}, "inbox: Config.SigningSecrets[0] is not whsec_ followed by standard base64"},
		{inbox.Config{SigningSecrets: []string{secret}, SignatureTolerance: -time.Second}, "inbox: Config.SignatureTolerance must not be negative"},
		{inbox.Config{SignatureTolerance: time.Minute}, "SignatureTolerance is set without SigningSecrets"},
	} {
		_, err := inbox.New(b.pool, c.cfg)
		require.ErrorContains(t, err, c.want)
		require.NotContains(t, err.Error(), strings.TrimPrefix(short, "whsec_"))
	}
}

// TestHandlerPathKey: mounted with {key} in its pattern, the Handler refuses
// a request whose Relay-Message-Key is not the path's, naming both.
func TestHandlerPathKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	mux := http.NewServeMux()
	mux.Handle("PUT /orders/{key}", b.inbox(t).Handler(b.apply))
	mux.Handle("PUT /all/", b.inbox(t).Handler(b.apply))

	r := request("order-1", 1, `{}`)
	r.URL.Path = "/orders/order-2"
	w := serve(mux, r)
	require.Equal(t, http.StatusBadRequest, w.Code)
	require.Contains(t, w.Body.String(), `the path's key "order-2" is not the header Relay-Message-Key "order-1"`)
	require.Zero(t, b.count(t, "inbox"))

	r = request("A/1", 2, `{}`) // escaped as one segment, as URLWithKey does
	r.URL.Path, r.URL.RawPath = "/orders/A/1", "/orders/A%2F1"
	w = serve(mux, r)
	require.Equal(t, http.StatusNoContent, w.Code, w.Body.String())

	r = request("order-1", 3, `{}`) // a pattern without {key}: the path is the mux's business
	r.URL.Path = "/all/anything"
	w = serve(mux, r)
	require.Equal(t, http.StatusNoContent, w.Code, w.Body.String())
}

// TestHandlerRawBody: the body's hash is over its raw bytes: the same JSON
// value re-serialised by another sender is another body, a 422.
func TestHandlerRawBody(t *testing.T) {
	t.Parallel()
	b := setup(t)
	h := b.inbox(t).Handler(b.apply)
	require.Equal(t, http.StatusNoContent, serve(h, request("k", 1, `{"id": 1, "total": 5}`)).Code)
	w := serve(h, request("k", 1, `{"id":1,"total":5}`))
	require.Equal(t, http.StatusUnprocessableEntity, w.Code)
	require.Contains(t, w.Body.String(), "received before with another body")
	require.Equal(t, 1, b.effectCount(t, "public.outbox/1"))
}

// TestHandlerControlByte: a control byte in a header value never reaches the
// Handler: Go's server answers a bare 400 itself, as docs/receivers.md says.
func TestHandlerControlByte(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var reached atomic.Bool
	srv := httptest.NewServer(b.inbox(t).Handler(func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		reached.Store(true)
		return nil
	}))
	defer srv.Close()
	conn, err := net.Dial("tcp", srv.Listener.Addr().String())
	require.NoError(t, err)
	defer conn.Close()
	// Go's client refuses to send such a header: written by hand.
	_, err = io.WriteString(conn, "PUT /orders/k HTTP/1.1\r\nHost: x\r\nIdempotency-Key: public.outbox/1\r\n"+
		"Relay-Message-Id: 1\r\nRelay-Message-Key: k\x01\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}")
	require.NoError(t, err)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	require.Equal(t, http.StatusBadRequest, resp.StatusCode)
	require.Contains(t, string(body), "400 Bad Request")
	t.Logf("Go's answer: %q", body)
	require.NotContains(t, string(body), "Relay-Message-Key", "Go's answer names no header")
	require.False(t, reached.Load())
	require.Zero(t, b.count(t, "inbox"))
}
