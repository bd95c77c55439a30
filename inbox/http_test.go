package inbox_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/xadm/relay"
	"github.com/xadm/relay/inbox"
	"github.com/xadm/relay/internal/testkit/pgserver"
)

// request is a relay request for message id of key, as HTTPSender makes it.
func request(key string, id int64, body string) *http.Request {
	r := httptest.NewRequest(http.MethodPut, "/orders/"+key, strings.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("Idempotency-Key", fmt.Sprintf("public.outbox/%d", id))
	r.Header.Set("Relay-Message-Key", key)
	r.Header.Set("Relay-Message-Id", fmt.Sprint(id))
	r.Header.Set("Relay-Message-Type", "order")
	r.Header.Set("Relay-Attempt", "1")
	return r
}

func serve(h http.Handler, r *http.Request) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// TestHandlerAnswers: each outcome and each failure of a well-formed request
// gets the status the relay's HTTPSender reads as meant.
func TestHandlerAnswers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ib := b.inbox(t)
	var got inbox.Message
	h := ib.Handler(func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		got = m
		switch string(m.Body) {
		case `"busy"`:
			return errors.New("the warehouse is busy")
		case `"negative"`:
			return relay.Permanent(errors.New("total is negative"))
		}
		return b.apply(ctx, tx, m)
	})

	w := serve(h, request("order-1", 2, `{"total": 5}`))
	require.Equal(t, http.StatusNoContent, w.Code)
	require.Equal(t, "applied", w.Header().Get(inbox.HeaderOutcome))
	require.Equal(t, inbox.Message{IdempotencyKey: "public.outbox/2", ID: 2, Key: "order-1", Type: "order", Attempt: 1, Body: []byte(`{"total": 5}`)}, got)

	w = serve(h, request("order-1", 2, `{"total": 5}`))
	require.Equal(t, http.StatusNoContent, w.Code)
	require.Equal(t, "duplicate", w.Header().Get(inbox.HeaderOutcome))

	w = serve(h, request("order-1", 1, `{"total": 4}`))
	require.Equal(t, http.StatusNoContent, w.Code)
	require.Equal(t, "stale", w.Header().Get(inbox.HeaderOutcome))

	w = serve(h, request("order-1", 2, `{"total": 6}`))
	require.Equal(t, http.StatusUnprocessableEntity, w.Code)
	require.Contains(t, w.Body.String(), "inbox: message public.outbox/2: the idempotency key was received before with another body")

	w = serve(h, request("order-1", 3, `"negative"`))
	require.Equal(t, http.StatusUnprocessableEntity, w.Code)
	require.Contains(t, w.Body.String(), "total is negative")

	w = serve(h, request("order-1", 4, `"busy"`))
	require.Equal(t, http.StatusServiceUnavailable, w.Code)
	require.Contains(t, w.Body.String(), "the warehouse is busy")
	require.Contains(t, b.logs.String(), "inbox: message not received, answered 503")

	require.Equal(t, 1, b.count(t, "fx"), "only message 2 has an effect")
	for status, want := range map[int]relay.HTTPOutcome{
		http.StatusNoContent:             relay.HTTPSuccess,
		http.StatusUnprocessableEntity:   relay.HTTPPermanent,
		http.StatusServiceUnavailable:    relay.HTTPRetry,
		http.StatusBadRequest:            relay.HTTPPermanent,
		http.StatusRequestEntityTooLarge: relay.HTTPPermanent,
	} {
		require.Equal(t, want, relay.HTTPStatusOutcome(status), "the relay's reading of %d", status)
	}
}

// TestHandlerRefuses: a request missing a header, or with one malformed or
// oversized, or a body over the limit, is answered 400 or 413 with a message
// naming the header or the limit, and nothing is applied or recorded.
func TestHandlerRefuses(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ib := b.inbox(t, func(c *inbox.Config) { c.MaxBody = 64 })
	h := ib.Handler(func(context.Context, pgx.Tx, inbox.Message) error {
		t.Error("apply ran for a refused request")
		return nil
	})
	with := func(change func(r *http.Request)) *http.Request {
		r := request("order-1", 1, `{}`)
		change(r)
		return r
	}
	for _, tc := range []struct {
		name   string
		r      *http.Request
		status int
		want   string
	}{
		{"NoIdempotencyKey", with(func(r *http.Request) { r.Header.Del("Idempotency-Key") }), 400, "inbox: header Idempotency-Key is missing"},
		{"EmptyIdempotencyKey", with(func(r *http.Request) { r.Header.Set("Idempotency-Key", "") }), 400, "inbox: header Idempotency-Key is empty"},
		{"TwoIdempotencyKeys", with(func(r *http.Request) { r.Header.Add("Idempotency-Key", "public.outbox/2") }), 400, "inbox: header Idempotency-Key appears 2 times, want it once"},
		{"LongIdempotencyKey", with(func(r *http.Request) { r.Header.Set("Idempotency-Key", strings.Repeat("x", 300)) }), 400, "inbox: header Idempotency-Key is 300 bytes long, over the limit of 255"},
		{"ControlIdempotencyKey", with(func(r *http.Request) { r.Header.Set("Idempotency-Key", "a\tb") }), 400, `inbox: header Idempotency-Key "a\tb" is not UTF-8 without control characters`},
		{"NoMessageID", with(func(r *http.Request) { r.Header.Del("Relay-Message-Id") }), 400, "inbox: header Relay-Message-Id is missing"},
		{"TwoMessageIDs", with(func(r *http.Request) { r.Header.Add("Relay-Message-Id", "2") }), 400, "inbox: header Relay-Message-Id appears 2 times"},
		{"LetterMessageID", with(func(r *http.Request) { r.Header.Set("Relay-Message-Id", "4a") }), 400, `inbox: header Relay-Message-Id: "4a" is not a positive decimal integer`},
		{"SignedMessageID", with(func(r *http.Request) { r.Header.Set("Relay-Message-Id", "+4") }), 400, `inbox: header Relay-Message-Id: "+4" is not a positive decimal integer`},
		{"NegativeMessageID", with(func(r *http.Request) { r.Header.Set("Relay-Message-Id", "-4") }), 400, `"-4" is not a positive decimal integer`},
		{"ZeroMessageID", with(func(r *http.Request) { r.Header.Set("Relay-Message-Id", "0") }), 400, `"0" is not a positive decimal integer`},
		{"OverflowMessageID", with(func(r *http.Request) { r.Header.Set("Relay-Message-Id", "9223372036854775808") }), 400, `"9223372036854775808" is not a positive decimal integer of at most 9223372036854775807`},
		{"LongMessageID", with(func(r *http.Request) { r.Header.Set("Relay-Message-Id", strings.Repeat("1", 40)) }), 400, "inbox: header Relay-Message-Id: 40 digits long, over the 19 of an int64"},
		{"LongMessageKey", with(func(r *http.Request) { r.Header.Set("Relay-Message-Key", strings.Repeat("k", 2000)) }), 400, "inbox: header Relay-Message-Key is 2000 bytes long, over the limit of 1024"},
		{"TwoMessageKeys", with(func(r *http.Request) { r.Header.Add("Relay-Message-Key", "order-2") }), 400, "inbox: header Relay-Message-Key appears 2 times, want at most once"},
		{"LargeBody", request("order-1", 1, strings.Repeat("x", 65)), 413, "inbox: the body is 65 bytes long, over the limit of 64 bytes (inbox.Config.MaxBody)"},
		{"LargeBodyUnannounced", with(func(r *http.Request) {
			r.Body = io.NopCloser(strings.NewReader(strings.Repeat("x", 100)))
			r.ContentLength = -1
		}), 413, "inbox: the body is over the limit of 64 bytes (inbox.Config.MaxBody)"},
	} {
		w := serve(h, tc.r)
		require.Equal(t, tc.status, w.Code, "%s: %s", tc.name, w.Body)
		require.Contains(t, w.Body.String(), tc.want, tc.name)
		require.Empty(t, w.Header().Get(inbox.HeaderOutcome), tc.name)
	}
	require.Equal(t, 0, b.count(t, "inbox"))
	require.Equal(t, 0, b.count(t, "keys"))

	// At the limit, and without Relay-Message-Key (the relay omits an empty key).
	ok := ib.Handler(b.apply)
	w := serve(ok, with(func(r *http.Request) {
		r.Body = io.NopCloser(strings.NewReader(strings.Repeat("x", 64)))
		r.ContentLength = 64
		r.Header.Del("Relay-Message-Key")
		r.Header.Set("Relay-Attempt", "not a number, only logged")
	}))
	require.Equal(t, http.StatusNoContent, w.Code, w.Body.String())
	require.Equal(t, 1, b.count(t, "fx"))
}

// TestHandlerBehindRelay: the relay delivers through its HTTPSender to the
// Handler while every first answer is lost (the receiver committed, then the
// answer went nowhere, as when it is killed before answering). Each message
// is delivered twice and applied once, and the relay records every row SENT.
func TestHandlerBehindRelay(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ib := b.inbox(t)
	ctx := context.Background()

	var (
		mu   sync.Mutex
		seen = map[string]int{} // deliveries by Idempotency-Key
	)
	handler := ib.Handler(b.apply)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen[r.Header.Get("Idempotency-Key")]++
		first := seen[r.Header.Get("Idempotency-Key")] == 1
		mu.Unlock()
		if !first {
			handler.ServeHTTP(w, r)
			return
		}
		rec := httptest.NewRecorder()
		handler.ServeHTTP(rec, r) // applied and committed; the answer is lost
		http.Error(w, "the answer was lost", http.StatusBadGateway)
	}))
	t.Cleanup(srv.Close)

	outbox := pgserver.Name(t) + "_outbox"
	require.NoError(t, relay.CreateTable(ctx, b.pool, outbox))
	t.Cleanup(func() { _, _ = b.pool.Exec(context.Background(), "DROP TABLE "+pgx.Identifier{outbox}.Sanitize()) })
	var ids []int64
	for i := range 12 {
		id, err := relay.Enqueue(ctx, b.pool, outbox, relay.Outgoing{Type: "order", Key: fmt.Sprintf("order-%d", i%3), Payload: fmt.Appendf(nil, `{"n": %d}`, i)})
		require.NoError(t, err)
		ids = append(ids, id)
	}
	sender, err := relay.NewHTTPSender(relay.HTTPSenderConfig{Type: "order", URL: relay.URLWithKey(srv.URL + "/orders")})
	require.NoError(t, err)
	cfg := relay.DefaultConfig()
	cfg.AppName, cfg.Table, cfg.RetryBackoff = outbox, outbox, 0
	cfg.Logger = slog.New(slog.DiscardHandler)
	r, err := relay.New(b.pool, cfg, sender)
	require.NoError(t, err)
	for deadline := time.Now().Add(time.Minute); ; {
		_, err := r.Run(ctx)
		require.NoError(t, err)
		var left int
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{outbox}.Sanitize()+" WHERE status <> 'SENT'").Scan(&left))
		if left == 0 {
			break
		}
		require.True(t, time.Now().Before(deadline), "%d rows not SENT", left)
	}

	require.Equal(t, len(ids), b.count(t, "fx"))
	mu.Lock()
	defer mu.Unlock()
	for _, id := range ids {
		key := fmt.Sprintf("public.%s/%d", outbox, id)
		require.Equal(t, 1, b.effectCount(t, key), "message %s", key)
		require.Equal(t, 2, seen[key], "message %s is delivered twice", key)
	}
}
