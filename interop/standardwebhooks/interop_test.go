package standardwebhooks_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	sw "github.com/standard-webhooks/standard-webhooks/libraries/go"
	"github.com/stretchr/testify/require"

	"github.com/xadm/relay"
	"github.com/xadm/relay/inbox"
	"github.com/xadm/relay/internal/testkit/pgserver"
	"github.com/xadm/relay/internal/testkit/testlog"
)

// TestMain gets a real PostgreSQL and fails, never skips, when none can be had.
func TestMain(m *testing.M) { os.Exit(pgserver.Run(m, "RELAY_TEST_DATABASE_URL")) }

// secret is a whsec_ secret of n bytes of b.
func secret(b byte, n int) string {
	return "whsec_" + base64.StdEncoding.EncodeToString([]byte(strings.Repeat(string([]byte{b}), n)))
}

// payloads are bodies a signature must survive byte for byte: spacing,
// escapes, non-ASCII text, dots (the signed content's separator), a large one.
var payloads = []string{
	`{}`,
	`{"id": 1, "total_cents": 1250}`,
	`{"name":"Zoë \u00e9 漢字 🚀","note":"a.b.c"}`,
	`{"text": "line\nbreak\ttab \"quoted\" back\\slash"}`,
	`[1, 2.5, -3e10, true, false, null]`,
	`{"big": "` + strings.Repeat("x", 64<<10) + `"}`,
}

// TestReferenceVerifiesRelay: every request the relay signs, for every
// payload and key, with one secret or two (a rotation, in either order),
// across retries, is verified by the reference library with each secret.
func TestReferenceVerifiesRelay(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	a, b := secret('a', 32), secret('b', 24)
	refA, err := sw.NewWebhook(a)
	require.NoError(t, err)
	refB, err := sw.NewWebhook(b)
	require.NoError(t, err)

	var mu sync.Mutex
	verified, failed, requests := 0, []string{}, 0
	dest := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		require.NoError(t, err)
		mu.Lock()
		defer mu.Unlock()
		requests++
		for _, ref := range []*sw.Webhook{refA, refB} {
			if !strings.Contains(r.URL.Path, "/both/") && ref == refB {
				continue // signed with a alone
			}
			if err := ref.Verify(body, r.Header); err != nil {
				failed = append(failed, fmt.Sprintf("%s: %v", r.URL.Path, err))
				continue
			}
			verified++
		}
		if r.Header.Get("Relay-Attempt") == "1" && strings.HasSuffix(r.URL.Path, "-retry") {
			w.WriteHeader(http.StatusServiceUnavailable) // a retry: signed again
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	defer dest.Close()

	pool := pgserver.Pool(t, pgserver.Shared().URL, pgserver.Name(t), 8)
	table := pgserver.Name(t)
	require.NoError(t, relay.CreateTable(ctx, pool, table))
	one, err := relay.NewHTTPSender(relay.HTTPSenderConfig{Type: "one", URL: relay.URLWithKey(dest.URL + "/one"), SigningSecrets: []string{a}})
	require.NoError(t, err)
	both, err := relay.NewHTTPSender(relay.HTTPSenderConfig{Type: "both", URL: relay.URLWithKey(dest.URL + "/both"), SigningSecrets: []string{b, a}})
	require.NoError(t, err)

	want := 0
	for _, typ := range []string{"one", "both"} {
		for i, p := range payloads {
			keys := []string{fmt.Sprintf("k%d", i), fmt.Sprintf("k%d.dots", i)}
			if i == 0 {
				keys = append(keys, "k0-retry") // one per type: more failures in a row would pause the type
			}
			for _, key := range keys {
				_, err := pool.Exec(ctx, "INSERT INTO "+pgx.Identifier{table}.Sanitize()+" (type, natural_key, payload) VALUES ($1, $2, $3)", typ, key, p)
				require.NoError(t, err)
				attempts := 1
				if strings.HasSuffix(key, "-retry") {
					attempts = 2
				}
				if typ == "both" {
					want += 2 * attempts
				} else {
					want += attempts
				}
			}
		}
	}
	cfg := relay.DefaultConfig()
	cfg.AppName, cfg.Table, cfg.RetryBackoff, cfg.Logger = table, table, 0, (&testlog.Buffer{}).Logger()
	r, err := relay.New(pool, cfg, one, both)
	require.NoError(t, err)
	for range 20 { // until a pass finds nothing: the retries' second attempts included
		n, err := r.Run(ctx)
		require.NoError(t, err)
		if n == 0 {
			break
		}
	}
	var sent int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{table}.Sanitize()+" WHERE status = 'SENT'").Scan(&sent))
	require.Equal(t, 2*(2*len(payloads)+1), sent)

	mu.Lock()
	defer mu.Unlock()
	require.Empty(t, failed, "the reference refused some of the relay's requests")
	require.Equal(t, want, verified, "of %d requests", requests)
	t.Logf("the reference verified %d signatures of %d requests: 100%%", verified, requests)
}

// request is a relay delivery of message id as the HTTPSender makes it,
// signed by ref at ts with the reference library.
func request(t *testing.T, ref *sw.Webhook, id int64, body string, ts time.Time) *http.Request {
	t.Helper()
	r := httptest.NewRequest(http.MethodPut, "/orders/k", strings.NewReader(body))
	key := "public.outbox/" + strconv.FormatInt(id, 10)
	r.Header.Set("Idempotency-Key", key)
	r.Header.Set("Relay-Message-Id", strconv.FormatInt(id, 10))
	r.Header.Set("Relay-Message-Key", "k"+strconv.FormatInt(id, 10))
	sig, err := ref.Sign(key, ts, []byte(body))
	require.NoError(t, err)
	r.Header.Set(sw.HeaderWebhookID, key)
	r.Header.Set(sw.HeaderWebhookTimestamp, strconv.FormatInt(ts.Unix(), 10))
	r.Header.Set(sw.HeaderWebhookSignature, sig)
	return r
}

// receiver is an inbox that verifies with secrets, and its Handler.
func receiver(t *testing.T, secrets ...string) http.Handler {
	t.Helper()
	pool := pgserver.Pool(t, pgserver.Shared().URL, pgserver.Name(t), 4)
	table := pgserver.Name(t)
	require.NoError(t, inbox.CreateTable(t.Context(), pool, table))
	ib, err := inbox.New(pool, inbox.Config{Table: table, SigningSecrets: secrets, Logger: (&testlog.Buffer{}).Logger()})
	require.NoError(t, err)
	return ib.Handler(func(context.Context, pgx.Tx, inbox.Message) error { return nil })
}

func serve(h http.Handler, r *http.Request) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// TestInboxAcceptsReference: the inbox applies what the reference signs, with
// its secret alone or among others.
func TestInboxAcceptsReference(t *testing.T) {
	t.Parallel()
	s := secret('r', 32)
	ref, err := sw.NewWebhook(s)
	require.NoError(t, err)
	h := receiver(t, secret('o', 32), s)
	for i, p := range payloads {
		w := serve(h, request(t, ref, int64(i+1), p, time.Now()))
		require.Equal(t, http.StatusNoContent, w.Code, w.Body.String())
		require.Equal(t, "applied", w.Header().Get(inbox.HeaderOutcome))
	}
}

// TestInboxRefusesWhatReferenceRefuses: for each request the reference
// refuses, the inbox answers 401 and applies nothing; for each it accepts,
// the inbox applies it.
func TestInboxRefusesWhatReferenceRefuses(t *testing.T) {
	t.Parallel()
	s, other := secret('s', 32), secret('x', 32)
	ref, err := sw.NewWebhook(s)
	require.NoError(t, err)
	otherRef, err := sw.NewWebhook(other)
	require.NoError(t, err)
	h := receiver(t, s)
	body := `{"id": 1}`
	sigOf := func(r *http.Request) string { return r.Header.Get(sw.HeaderWebhookSignature) }

	cases := []struct {
		name string
		make func(id int64) *http.Request
	}{
		{"Valid", func(id int64) *http.Request { return request(t, ref, id, body, time.Now()) }},
		{"FourMinutesOld", func(id int64) *http.Request { return request(t, ref, id, body, time.Now().Add(-4*time.Minute)) }},
		{"SixMinutesOld", func(id int64) *http.Request { return request(t, ref, id, body, time.Now().Add(-6*time.Minute)) }},
		{"SixMinutesAhead", func(id int64) *http.Request { return request(t, ref, id, body, time.Now().Add(6*time.Minute)) }},
		{"OtherSecret", func(id int64) *http.Request { return request(t, otherRef, id, body, time.Now()) }},
		{"OtherAndOurs", func(id int64) *http.Request {
			r := request(t, ref, id, body, time.Now())
			o := request(t, otherRef, id, body, time.Now())
			r.Header.Set(sw.HeaderWebhookSignature, sigOf(o)+" "+sigOf(r))
			return r
		}},
		{"UnknownVersionAndOurs", func(id int64) *http.Request {
			r := request(t, ref, id, body, time.Now())
			r.Header.Set(sw.HeaderWebhookSignature, "v9,AAAA "+sigOf(r))
			return r
		}},
		{"TamperedBody", func(id int64) *http.Request {
			r := request(t, ref, id, body, time.Now())
			r.Body = io.NopCloser(strings.NewReader(`{"id": 2}`))
			r.ContentLength = 9
			return r
		}},
		{"ReSerialisedBody", func(id int64) *http.Request {
			r := request(t, ref, id, body, time.Now())
			r.Body = io.NopCloser(strings.NewReader(`{"id":1}`))
			r.ContentLength = 8
			return r
		}},
		{"OtherID", func(id int64) *http.Request {
			r := request(t, ref, id, body, time.Now())
			r.Header.Set(sw.HeaderWebhookID, "public.outbox/999")
			return r
		}},
		{"OtherTimestamp", func(id int64) *http.Request {
			r := request(t, ref, id, body, time.Now())
			r.Header.Set(sw.HeaderWebhookTimestamp, strconv.FormatInt(time.Now().Unix()-1, 10))
			return r
		}},
		{"NoSignature", func(id int64) *http.Request {
			r := request(t, ref, id, body, time.Now())
			r.Header.Del(sw.HeaderWebhookSignature)
			return r
		}},
		{"NoID", func(id int64) *http.Request {
			r := request(t, ref, id, body, time.Now())
			r.Header.Del(sw.HeaderWebhookID)
			return r
		}},
		{"NoTimestamp", func(id int64) *http.Request {
			r := request(t, ref, id, body, time.Now())
			r.Header.Del(sw.HeaderWebhookTimestamp)
			return r
		}},
		{"TimestampNotANumber", func(id int64) *http.Request {
			r := request(t, ref, id, body, time.Now())
			r.Header.Set(sw.HeaderWebhookTimestamp, "soon")
			return r
		}},
		{"SignatureWithoutVersion", func(id int64) *http.Request {
			r := request(t, ref, id, body, time.Now())
			r.Header.Set(sw.HeaderWebhookSignature, strings.TrimPrefix(sigOf(r), "v1,"))
			return r
		}},
		{"SignatureAsV1a", func(id int64) *http.Request {
			r := request(t, ref, id, body, time.Now())
			r.Header.Set(sw.HeaderWebhookSignature, "v1a,"+strings.TrimPrefix(sigOf(r), "v1,"))
			return r
		}},
		{"SignatureTruncated", func(id int64) *http.Request {
			r := request(t, ref, id, body, time.Now())
			r.Header.Set(sw.HeaderWebhookSignature, sigOf(r)[:20])
			return r
		}},
	}
	accepted, refused := 0, 0
	for i, c := range cases {
		id := int64(i + 1)
		r := c.make(id)
		// What the reference makes of the request, read from a copy of its body.
		raw, err := io.ReadAll(r.Body)
		require.NoError(t, err)
		r.Body = io.NopCloser(strings.NewReader(string(raw)))
		refErr := ref.Verify(raw, r.Header)

		w := serve(h, r)
		if refErr != nil {
			refused++
			require.Equal(t, http.StatusUnauthorized, w.Code, "%s: the reference refuses it (%v); the inbox answered %s", c.name, refErr, w.Body.String())
			continue
		}
		accepted++
		require.Equal(t, http.StatusNoContent, w.Code, "%s: the reference accepts it; the inbox answered %s", c.name, w.Body.String())
	}
	require.Equal(t, 4, accepted, "Valid, FourMinutesOld, OtherAndOurs, UnknownVersionAndOurs")
	require.Equal(t, len(cases)-4, refused)
}
