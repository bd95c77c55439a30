package relay_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/xadm/relay"
)

// received is one request as an httptest server saw it.
type received struct {
	Method string
	Path   string // escaped, as sent
	Header http.Header
	Body   []byte
}

// httpTestBundle is a real HTTP server that records what it receives and
// answers with reply.
type httpTestBundle struct {
	srv *httptest.Server

	mu       sync.Mutex
	requests []received
}

func (b *httpTestBundle) received(t *testing.T) []received {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]received(nil), b.requests...)
}

// setupHTTPServer starts a server that records each request and then calls
// reply (nil answers 204).
func setupHTTPServer(t *testing.T, reply http.HandlerFunc) *httpTestBundle {
	t.Helper()
	b := &httpTestBundle{}
	b.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		b.mu.Lock()
		b.requests = append(b.requests, received{Method: r.Method, Path: r.URL.EscapedPath(), Header: r.Header.Clone(), Body: body})
		b.mu.Unlock()
		if reply == nil {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		reply(w, r)
	}))
	t.Cleanup(b.srv.Close)
	return b
}

// newHTTPSender returns a sender of type "order" to base/orders/<key>, with cfg's other fields.
func newHTTPSender(t *testing.T, base string, cfg relay.HTTPSenderConfig) *relay.HTTPSender {
	t.Helper()
	if cfg.Type == "" {
		cfg.Type = "order"
	}
	if cfg.URL == nil {
		cfg.URL = relay.URLWithKey(base + "/orders")
	}
	s, err := relay.NewHTTPSender(cfg)
	require.NoError(t, err)
	return s
}

func testMessage() relay.Message {
	return relay.Message{
		ID:        42,
		Type:      "order",
		Key:       "k1",
		Payload:   []byte(`{"id":"k1","total":10}`),
		Attempts:  2,
		CreatedAt: time.Now(),
	}
}

// replyStatus answers code with body.
func replyStatus(code int, body string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(code)
		_, _ = io.WriteString(w, body)
	}
}

func TestNewHTTPSender(t *testing.T) {
	t.Parallel()

	okURL := relay.URLWithKey("http://localhost")

	t.Run("Defaults", func(t *testing.T) {
		t.Parallel()
		s, err := relay.NewHTTPSender(relay.HTTPSenderConfig{Type: "order", URL: okURL})
		require.NoError(t, err)
		require.Equal(t, "order", s.Type())
		var sender relay.Sender = s
		require.Equal(t, "order", sender.Type())
	})

	for _, tt := range []struct {
		name string
		cfg  relay.HTTPSenderConfig
		want []string
	}{
		{"ZeroValue", relay.HTTPSenderConfig{}, []string{
			"relay: HTTPSenderConfig.Type must not be empty",
			"relay: HTTPSenderConfig.URL must not be nil",
		}},
		{"BlankType", relay.HTTPSenderConfig{Type: "  ", URL: okURL}, []string{"relay: HTTPSenderConfig.Type must not be empty"}},
		{"TypeWithNewline", relay.HTTPSenderConfig{Type: "a\nb", URL: okURL}, []string{"relay: HTTPSenderConfig.Type \"a\\nb\" must not contain control characters"}},
		{"NilURL", relay.HTTPSenderConfig{Type: "order"}, []string{"relay: HTTPSenderConfig.URL must not be nil"}},
		{"BadMethod", relay.HTTPSenderConfig{Type: "order", URL: okURL, Method: "PUT NOW"}, []string{`relay: HTTPSenderConfig.Method "PUT NOW" is not a valid HTTP method`}},
		{"NegativeTimeout", relay.HTTPSenderConfig{Type: "order", URL: okURL, Timeout: -time.Second}, []string{"relay: HTTPSenderConfig.Timeout must not be negative, got -1s"}},
		{"ReservedHeader", relay.HTTPSenderConfig{Type: "order", URL: okURL, Header: http.Header{"idempotency-key": {"x"}}}, []string{"relay: HTTPSenderConfig.Header must not set Idempotency-Key"}},
		{"RelayHeader", relay.HTTPSenderConfig{Type: "order", URL: okURL, Header: http.Header{"Relay-Attempt": {"1"}}}, []string{"relay: HTTPSenderConfig.Header must not set Relay-Attempt"}},
		{"MessageKeyHeader", relay.HTTPSenderConfig{Type: "order", URL: okURL, Header: http.Header{"relay-message-key": {"x"}}}, []string{"relay: HTTPSenderConfig.Header must not set Relay-Message-Key"}},
		{"ReservedPrefix", relay.HTTPSenderConfig{Type: "order", URL: okURL, Header: http.Header{"Relay-Tenant": {"x"}}}, []string{"relay: HTTPSenderConfig.Header must not set Relay-Tenant"}},
		{"StatusOutOfRange", relay.HTTPSenderConfig{Type: "order", URL: okURL, StatusOutcomes: map[int]relay.HTTPOutcome{99: relay.HTTPRetry, 600: relay.HTTPSuccess}}, []string{
			"relay: HTTPSenderConfig.StatusOutcomes has 99, which is not an HTTP status (100 to 599)",
			"relay: HTTPSenderConfig.StatusOutcomes has 600, which is not an HTTP status (100 to 599)",
		}},
		{"ZeroOutcome", relay.HTTPSenderConfig{Type: "order", URL: okURL, StatusOutcomes: map[int]relay.HTTPOutcome{409: 0}}, []string{"relay: HTTPSenderConfig.StatusOutcomes maps 409 to HTTPOutcome(0); want HTTPSuccess, HTTPRetry or HTTPPermanent"}},
		{"UnknownOutcome", relay.HTTPSenderConfig{Type: "order", URL: okURL, StatusOutcomes: map[int]relay.HTTPOutcome{401: 7}}, []string{"relay: HTTPSenderConfig.StatusOutcomes maps 401 to HTTPOutcome(7)"}},
		{"HostHeader", relay.HTTPSenderConfig{Type: "order", URL: okURL, Header: http.Header{"Host": {"example.com"}}}, []string{"relay: HTTPSenderConfig.Header must not set Host"}},
		{"BadHeaderName", relay.HTTPSenderConfig{Type: "order", URL: okURL, Header: http.Header{"X Token": {"x"}}}, []string{`relay: HTTPSenderConfig.Header "X Token" is not a valid header name`}},
		{"BadHeaderValue", relay.HTTPSenderConfig{Type: "order", URL: okURL, Header: http.Header{"Authorization": {"Bearer x\r\nEvil: 1"}}}, []string{"relay: HTTPSenderConfig.Header Authorization has a value with control characters"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s, err := relay.NewHTTPSender(tt.cfg)
			require.Nil(t, s)
			require.Error(t, err)
			for _, want := range tt.want {
				require.ErrorContains(t, err, want)
			}
		})
	}
}

func TestHTTPSenderRequest(t *testing.T) {
	t.Parallel()

	t.Run("HeadersAndBody", func(t *testing.T) {
		t.Parallel()
		b := setupHTTPServer(t, nil)
		s := newHTTPSender(t, b.srv.URL, relay.HTTPSenderConfig{
			Header: http.Header{"Authorization": {"Bearer s3cret"}, "x-tenant": {"t1", "t2"}},
		})

		m := testMessage()
		m.Key = "A/1 ü"
		require.NoError(t, s.Send(context.Background(), m))

		reqs := b.received(t)
		require.Len(t, reqs, 1)
		r := reqs[0]
		require.Equal(t, http.MethodPut, r.Method)
		require.Equal(t, "/orders/A%2F1%20%C3%BC", r.Path)
		require.Equal(t, m.Payload, r.Body)
		require.Equal(t, "application/json", r.Header.Get("Content-Type"))
		require.Equal(t, "42", r.Header.Get("Idempotency-Key"), "a hand-built message's IdempotencyKey is its id")
		require.Equal(t, "A/1 ü", r.Header.Get("Relay-Message-Key"))
		require.Equal(t, "42", r.Header.Get("Relay-Message-Id"))
		require.Equal(t, "order", r.Header.Get("Relay-Message-Type"))
		require.Equal(t, "3", r.Header.Get("Relay-Attempt"))
		require.Equal(t, "Bearer s3cret", r.Header.Get("Authorization"))
		require.Equal(t, []string{"t1", "t2"}, r.Header.Values("X-Tenant"))
		require.Equal(t, fmt.Sprint(len(m.Payload)), r.Header.Get("Content-Length"))
	})

	t.Run("FirstAttemptIsOne", func(t *testing.T) {
		t.Parallel()
		b := setupHTTPServer(t, nil)
		s := newHTTPSender(t, b.srv.URL, relay.HTTPSenderConfig{})

		m := testMessage()
		m.Attempts = 0
		require.NoError(t, s.Send(context.Background(), m))
		require.Equal(t, "1", b.received(t)[0].Header.Get("Relay-Attempt"))
	})

	t.Run("DefaultMethodIsPUT", func(t *testing.T) {
		t.Parallel()
		b := setupHTTPServer(t, nil)
		s := newHTTPSender(t, b.srv.URL, relay.HTTPSenderConfig{})
		require.NoError(t, s.Send(context.Background(), testMessage()))
		require.Equal(t, http.MethodPut, b.received(t)[0].Method)
	})

	t.Run("ConfiguredPOST", func(t *testing.T) {
		t.Parallel()
		b := setupHTTPServer(t, nil)
		s := newHTTPSender(t, b.srv.URL, relay.HTTPSenderConfig{
			Method: http.MethodPost,
			URL:    func(relay.Message) (string, error) { return b.srv.URL + "/events", nil },
		})
		require.NoError(t, s.Send(context.Background(), testMessage()))
		r := b.received(t)[0]
		require.Equal(t, http.MethodPost, r.Method)
		require.Equal(t, "/events", r.Path)
	})

	t.Run("ContentTypeFromHeader", func(t *testing.T) {
		t.Parallel()
		b := setupHTTPServer(t, nil)
		s := newHTTPSender(t, b.srv.URL, relay.HTTPSenderConfig{
			Header: http.Header{"Content-Type": {"application/cloudevents+json"}},
		})
		require.NoError(t, s.Send(context.Background(), testMessage()))
		require.Equal(t, []string{"application/cloudevents+json"}, b.received(t)[0].Header.Values("Content-Type"))
	})

	t.Run("HeaderCopiedAtConstruction", func(t *testing.T) {
		t.Parallel()
		b := setupHTTPServer(t, nil)
		h := http.Header{"Authorization": {"Bearer old"}}
		s := newHTTPSender(t, b.srv.URL, relay.HTTPSenderConfig{Header: h})
		h.Set("Authorization", "Bearer new")
		require.NoError(t, s.Send(context.Background(), testMessage()))
		require.Equal(t, "Bearer old", b.received(t)[0].Header.Get("Authorization"))
	})

	t.Run("EmptyPayload", func(t *testing.T) {
		t.Parallel()
		b := setupHTTPServer(t, nil)
		s := newHTTPSender(t, b.srv.URL, relay.HTTPSenderConfig{})
		m := testMessage()
		m.Payload = nil
		require.NoError(t, s.Send(context.Background(), m))
		require.Empty(t, b.received(t)[0].Body)
	})

	t.Run("EmptyKeyOmitsMessageKey", func(t *testing.T) {
		t.Parallel()
		b := setupHTTPServer(t, nil)
		s := newHTTPSender(t, b.srv.URL, relay.HTTPSenderConfig{
			URL: func(relay.Message) (string, error) { return b.srv.URL + "/events", nil },
		})
		m := testMessage()
		m.Key = ""
		require.NoError(t, s.Send(context.Background(), m))
		h := b.received(t)[0].Header
		_, ok := h["Relay-Message-Key"]
		require.False(t, ok)
		require.Equal(t, "42", h.Get("Idempotency-Key"), "the message still has its own idempotency key")
	})

	t.Run("CustomClientOverTLS", func(t *testing.T) {
		t.Parallel()
		var got atomic.Int32
		srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			got.Add(1)
			w.WriteHeader(http.StatusOK)
		}))
		t.Cleanup(srv.Close)
		s := newHTTPSender(t, srv.URL, relay.HTTPSenderConfig{Client: srv.Client()})
		require.NoError(t, s.Send(context.Background(), testMessage()))
		require.Equal(t, int32(1), got.Load())
	})
}

func TestHTTPSenderStatus(t *testing.T) {
	t.Parallel()

	for _, code := range []int{http.StatusOK, http.StatusCreated, http.StatusAccepted, http.StatusNoContent} {
		t.Run(fmt.Sprintf("Success%d", code), func(t *testing.T) {
			t.Parallel()
			b := setupHTTPServer(t, replyStatus(code, ""))
			s := newHTTPSender(t, b.srv.URL, relay.HTTPSenderConfig{})
			require.NoError(t, s.Send(context.Background(), testMessage()))
		})
	}

	for _, tt := range []struct {
		code      int
		permanent bool
	}{
		{http.StatusBadRequest, true},
		{http.StatusUnauthorized, true},
		{http.StatusNotFound, true},
		{http.StatusConflict, true},
		{http.StatusUnprocessableEntity, true},
		{http.StatusRequestTimeout, false},
		{http.StatusTooEarly, false},
		{http.StatusTooManyRequests, false},
		{http.StatusInternalServerError, false},
		{http.StatusBadGateway, false},
		{http.StatusServiceUnavailable, false},
		{http.StatusGatewayTimeout, false},
	} {
		kind := "Retryable"
		if tt.permanent {
			kind = "Permanent"
		}
		t.Run(fmt.Sprintf("%s%d", kind, tt.code), func(t *testing.T) {
			t.Parallel()
			b := setupHTTPServer(t, replyStatus(tt.code, "nope"))
			s := newHTTPSender(t, b.srv.URL, relay.HTTPSenderConfig{})

			err := s.Send(context.Background(), testMessage())
			require.Error(t, err)
			require.Equal(t, tt.permanent, relay.IsPermanent(err))
			require.ErrorContains(t, err, fmt.Sprintf("PUT %s/orders/k1: %d %s: nope", b.srv.URL, tt.code, http.StatusText(tt.code)))
		})
	}

	t.Run("ErrorText", func(t *testing.T) {
		t.Parallel()
		b := setupHTTPServer(t, replyStatus(http.StatusServiceUnavailable, "  overloaded,\n\ttry later \r\n"))
		s := newHTTPSender(t, b.srv.URL, relay.HTTPSenderConfig{})

		err := s.Send(context.Background(), testMessage())
		require.EqualError(t, err, fmt.Sprintf("PUT %s/orders/k1: 503 Service Unavailable: overloaded, try later", b.srv.URL))
	})

	t.Run("ErrorTextWithoutBody", func(t *testing.T) {
		t.Parallel()
		b := setupHTTPServer(t, replyStatus(http.StatusBadGateway, ""))
		s := newHTTPSender(t, b.srv.URL, relay.HTTPSenderConfig{})

		err := s.Send(context.Background(), testMessage())
		require.EqualError(t, err, fmt.Sprintf("PUT %s/orders/k1: 502 Bad Gateway", b.srv.URL))
	})

	t.Run("ErrorTextBodyCut", func(t *testing.T) {
		t.Parallel()
		b := setupHTTPServer(t, replyStatus(http.StatusInternalServerError, strings.Repeat("é", 5000)))
		s := newHTTPSender(t, b.srv.URL, relay.HTTPSenderConfig{})

		err := s.Send(context.Background(), testMessage())
		require.Error(t, err)
		prefix := fmt.Sprintf("PUT %s/orders/k1: 500 Internal Server Error: ", b.srv.URL)
		require.True(t, strings.HasPrefix(err.Error(), prefix), err.Error())
		body := strings.TrimPrefix(err.Error(), prefix)
		require.Equal(t, strings.Repeat("é", 100)+"…", body)
	})

	t.Run("ErrorTextSafeForPostgres", func(t *testing.T) {
		t.Parallel()
		b := setupHTTPServer(t, replyStatus(http.StatusInternalServerError, "a\x00b\xffc\x1bd"))
		s := newHTTPSender(t, b.srv.URL, relay.HTTPSenderConfig{})

		err := s.Send(context.Background(), testMessage())
		require.Error(t, err)
		require.True(t, utf8.ValidString(err.Error()))
		require.NotContains(t, err.Error(), "\x00")
		require.True(t, strings.HasSuffix(err.Error(), ": a b\uFFFDc d"), err.Error())
	})

	t.Run("RetryAfterInErrorText", func(t *testing.T) {
		t.Parallel()
		b := setupHTTPServer(t, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Retry-After", "30")
			w.WriteHeader(http.StatusTooManyRequests)
		})
		s := newHTTPSender(t, b.srv.URL, relay.HTTPSenderConfig{})

		err := s.Send(context.Background(), testMessage())
		require.False(t, relay.IsPermanent(err))
		require.EqualError(t, err, fmt.Sprintf("PUT %s/orders/k1: 429 Too Many Requests (Retry-After: 30)", b.srv.URL))
	})

	t.Run("RedirectNotFollowed", func(t *testing.T) {
		t.Parallel()
		b := setupHTTPServer(t, func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/moved" {
				w.WriteHeader(http.StatusOK)
				return
			}
			w.Header().Set("Location", "/moved")
			w.WriteHeader(http.StatusFound)
		})
		s := newHTTPSender(t, b.srv.URL, relay.HTTPSenderConfig{})

		err := s.Send(context.Background(), testMessage())
		require.Error(t, err)
		require.False(t, relay.IsPermanent(err))
		require.EqualError(t, err, fmt.Sprintf("PUT %s/orders/k1: 302 Found (Location: /moved)", b.srv.URL))
		require.Len(t, b.received(t), 1, "the redirect must not be followed")
	})
}

func TestHTTPStatusOutcome(t *testing.T) {
	t.Parallel()

	for _, tt := range []struct {
		status int
		want   relay.HTTPOutcome
	}{
		{100, relay.HTTPRetry},
		{200, relay.HTTPSuccess},
		{204, relay.HTTPSuccess},
		{299, relay.HTTPSuccess},
		{301, relay.HTTPRetry},
		{304, relay.HTTPRetry},
		{400, relay.HTTPPermanent},
		{401, relay.HTTPPermanent},
		{403, relay.HTTPPermanent},
		{404, relay.HTTPPermanent},
		{408, relay.HTTPRetry},
		{409, relay.HTTPPermanent},
		{422, relay.HTTPPermanent},
		{425, relay.HTTPRetry},
		{429, relay.HTTPRetry},
		{499, relay.HTTPPermanent},
		{500, relay.HTTPRetry},
		{503, relay.HTTPRetry},
		{599, relay.HTTPRetry},
	} {
		require.Equal(t, tt.want, relay.HTTPStatusOutcome(tt.status), "status %d", tt.status)
	}

	require.Equal(t, "success", relay.HTTPSuccess.String())
	require.Equal(t, "retry", relay.HTTPRetry.String())
	require.Equal(t, "permanent", relay.HTTPPermanent.String())
	require.Equal(t, "HTTPOutcome(0)", relay.HTTPOutcome(0).String())
}

func TestHTTPSenderStatusOutcomes(t *testing.T) {
	t.Parallel()

	outcomes := map[int]relay.HTTPOutcome{
		http.StatusConflict:           relay.HTTPSuccess,   // "already applied"
		http.StatusUnauthorized:       relay.HTTPRetry,     // a credential rotating
		http.StatusServiceUnavailable: relay.HTTPPermanent, // whatever the receiver means by it
		http.StatusAccepted:           relay.HTTPRetry,     // "queued, not applied": not good enough
	}
	for _, tt := range []struct {
		status    int
		want      relay.HTTPOutcome
		errSuffix string
	}{
		{http.StatusConflict, relay.HTTPSuccess, ""},
		{http.StatusUnauthorized, relay.HTTPRetry, "401 Unauthorized: nope"},
		{http.StatusServiceUnavailable, relay.HTTPPermanent, "503 Service Unavailable: nope"},
		{http.StatusAccepted, relay.HTTPRetry, "202 Accepted: nope"},
		// Statuses it does not list keep the default.
		{http.StatusOK, relay.HTTPSuccess, ""},
		{http.StatusForbidden, relay.HTTPPermanent, "403 Forbidden: nope"},
		{http.StatusBadGateway, relay.HTTPRetry, "502 Bad Gateway: nope"},
	} {
		t.Run(fmt.Sprintf("%d%s", tt.status, tt.want), func(t *testing.T) {
			t.Parallel()
			b := setupHTTPServer(t, replyStatus(tt.status, "nope"))
			s := newHTTPSender(t, b.srv.URL, relay.HTTPSenderConfig{StatusOutcomes: outcomes})

			err := s.Send(context.Background(), testMessage())
			if tt.want == relay.HTTPSuccess {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			require.Equal(t, tt.want == relay.HTTPPermanent, relay.IsPermanent(err))
			require.ErrorContains(t, err, fmt.Sprintf("PUT %s/orders/k1: %s", b.srv.URL, tt.errSuffix))
		})
	}

	t.Run("CopiedAtConstruction", func(t *testing.T) {
		t.Parallel()
		b := setupHTTPServer(t, replyStatus(http.StatusConflict, ""))
		m := map[int]relay.HTTPOutcome{http.StatusConflict: relay.HTTPSuccess}
		s := newHTTPSender(t, b.srv.URL, relay.HTTPSenderConfig{StatusOutcomes: m})
		m[http.StatusConflict] = relay.HTTPPermanent
		require.NoError(t, s.Send(context.Background(), testMessage()))
	})
}

func TestHTTPSenderFailure(t *testing.T) {
	t.Parallel()

	t.Run("Timeout", func(t *testing.T) {
		t.Parallel()
		b := setupHTTPServer(t, func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-r.Context().Done(): // the client gave up: let the server close quickly
			case <-time.After(2 * time.Second):
			}
		})
		s := newHTTPSender(t, b.srv.URL, relay.HTTPSenderConfig{Timeout: 50 * time.Millisecond})

		start := time.Now()
		err := s.Send(context.Background(), testMessage())
		elapsed := time.Since(start)

		require.Error(t, err)
		require.Less(t, elapsed, time.Second)
		require.False(t, relay.IsPermanent(err))
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.ErrorContains(t, err, fmt.Sprintf("PUT %s/orders/k1: no answer within 50ms", b.srv.URL))
	})

	t.Run("ParentContextCanceled", func(t *testing.T) {
		t.Parallel()
		b := setupHTTPServer(t, func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-r.Context().Done():
			case <-time.After(2 * time.Second):
			}
		})
		s := newHTTPSender(t, b.srv.URL, relay.HTTPSenderConfig{})

		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		time.AfterFunc(50*time.Millisecond, cancel)

		start := time.Now()
		err := s.Send(ctx, testMessage())
		elapsed := time.Since(start)

		require.Error(t, err)
		require.Less(t, elapsed, time.Second)
		require.ErrorIs(t, err, context.Canceled)
		require.False(t, relay.IsPermanent(err))
		require.EqualError(t, err, fmt.Sprintf("PUT %s/orders/k1: context canceled", b.srv.URL))
	})

	t.Run("ParentContextCanceledWithCause", func(t *testing.T) {
		t.Parallel()
		b := setupHTTPServer(t, nil)
		s := newHTTPSender(t, b.srv.URL, relay.HTTPSenderConfig{})

		errLost := errors.New("election lost")
		ctx, cancel := context.WithCancelCause(context.Background())
		cancel(errLost)

		err := s.Send(ctx, testMessage())
		require.ErrorIs(t, err, context.Canceled)
		require.ErrorIs(t, err, errLost)
		require.False(t, relay.IsPermanent(err))
		require.Empty(t, b.received(t))
	})

	t.Run("ParentDeadline", func(t *testing.T) {
		t.Parallel()
		b := setupHTTPServer(t, func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-r.Context().Done():
			case <-time.After(2 * time.Second):
			}
		})
		s := newHTTPSender(t, b.srv.URL, relay.HTTPSenderConfig{}) // 10s, longer than ctx's

		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()

		err := s.Send(ctx, testMessage())
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.False(t, relay.IsPermanent(err))
		require.EqualError(t, err, fmt.Sprintf("PUT %s/orders/k1: context deadline exceeded", b.srv.URL))
	})

	t.Run("ConnectionRefused", func(t *testing.T) {
		t.Parallel()
		srv := httptest.NewServer(http.NotFoundHandler())
		base := srv.URL
		srv.Close()
		s := newHTTPSender(t, base, relay.HTTPSenderConfig{})

		err := s.Send(context.Background(), testMessage())
		require.Error(t, err)
		require.False(t, relay.IsPermanent(err))
		require.ErrorContains(t, err, fmt.Sprintf("PUT %s/orders/k1: dial tcp", base))
	})

	errNoRoute := errors.New("no route for this message")
	for _, tt := range []struct {
		name string
		url  func(relay.Message) (string, error)
		want string
	}{
		{"URLFuncError", func(relay.Message) (string, error) { return "", errNoRoute }, "URL of message 42: no route for this message"},
		{"URLWithKeyEmptyKey", func(m relay.Message) (string, error) {
			m.Key = ""
			return relay.URLWithKey("http://localhost")(m)
		}, "URL of message 42: empty Key"},
		{"MalformedURL", func(relay.Message) (string, error) { return "http://[::1", nil }, "PUT: invalid URL: parse"},
		{"MissingScheme", func(relay.Message) (string, error) { return "://orders/1", nil }, "PUT: invalid URL: parse"},
		{"RelativeURL", func(relay.Message) (string, error) { return "/orders/1", nil }, `PUT /orders/1: unsupported scheme ""`},
		{"UnsupportedScheme", func(relay.Message) (string, error) { return "ftp://localhost/orders/1", nil }, `PUT ftp://localhost/orders/1: unsupported scheme "ftp" (want http or https)`},
		{"NoHost", func(relay.Message) (string, error) { return "http:///orders/1", nil }, "PUT http:///orders/1: URL has no host"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s, err := relay.NewHTTPSender(relay.HTTPSenderConfig{Type: "order", URL: tt.url})
			require.NoError(t, err)

			err = s.Send(context.Background(), testMessage())
			require.Error(t, err)
			require.True(t, relay.IsPermanent(err), "want permanent: %v", err)
			require.ErrorContains(t, err, tt.want)
			if tt.name == "URLFuncError" {
				require.ErrorIs(t, err, errNoRoute)
			}
		})
	}

	t.Run("KeyWithControlCharacters", func(t *testing.T) {
		t.Parallel()
		b := setupHTTPServer(t, nil)
		s := newHTTPSender(t, b.srv.URL, relay.HTTPSenderConfig{})
		m := testMessage()
		m.Key = "k1\r\nEvil: 1"

		err := s.Send(context.Background(), m)
		require.True(t, relay.IsPermanent(err), "want permanent: %v", err)
		require.ErrorContains(t, err, "Relay-Message-Key")
		require.Empty(t, b.received(t))
	})

	t.Run("PasswordRedacted", func(t *testing.T) {
		t.Parallel()
		b := setupHTTPServer(t, replyStatus(http.StatusServiceUnavailable, ""))
		s := newHTTPSender(t, b.srv.URL, relay.HTTPSenderConfig{
			URL: func(relay.Message) (string, error) {
				return strings.Replace(b.srv.URL, "://", "://user:hunter2@", 1) + "/orders/k1", nil
			},
		})

		err := s.Send(context.Background(), testMessage())
		require.Error(t, err)
		require.NotContains(t, err.Error(), "hunter2")
		require.ErrorContains(t, err, "user:xxxxx@")
	})
}

func TestHTTPSenderConnectionReuse(t *testing.T) {
	t.Parallel()

	var conns atomic.Int32
	bigBody := strings.Repeat("x", 16<<10) // more than one read, less than the drain limit
	var n atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		switch n.Add(1) % 4 {
		case 1:
			w.WriteHeader(http.StatusOK)
		case 2:
			w.WriteHeader(http.StatusServiceUnavailable)
		case 3:
			w.WriteHeader(http.StatusNotFound)
		default:
			w.WriteHeader(http.StatusCreated)
		}
		_, _ = io.WriteString(w, bigBody)
	}))
	srv.Config.ConnState = func(_ net.Conn, state http.ConnState) {
		if state == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)

	s := newHTTPSender(t, srv.URL, relay.HTTPSenderConfig{})
	for i := range 8 {
		m := testMessage()
		m.ID = int64(i + 1)
		m.Key = fmt.Sprintf("k%d", i+1)
		_ = s.Send(context.Background(), m) // half of them fail on purpose
	}
	require.Equal(t, int32(8), n.Load())
	require.Equal(t, int32(1), conns.Load(), "every send must reuse the one connection")
}

func TestHTTPSenderURLWithKey(t *testing.T) {
	t.Parallel()

	for _, tt := range []struct {
		name, base, key, want string
	}{
		{"Plain", "http://h/orders", "k1", "http://h/orders/k1"},
		{"TrailingSlash", "http://h/orders/", "k1", "http://h/orders/k1"},
		{"SlashAndSpace", "http://h/orders", "A/1 b", "http://h/orders/A%2F1%20b"},
		{"QuestionMarkAndHash", "http://h/orders", "a?b#c", "http://h/orders/a%3Fb%23c"},
		{"Dot", "http://h/orders", ".", "http://h/orders/%2E"},
		{"DotDot", "http://h/orders", "..", "http://h/orders/%2E%2E"},
		{"Unicode", "http://h/orders", "ü", "http://h/orders/%C3%BC"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := relay.URLWithKey(tt.base)(relay.Message{Key: tt.key})
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
		})
	}

	t.Run("EmptyKey", func(t *testing.T) {
		t.Parallel()
		_, err := relay.URLWithKey("http://h/orders")(relay.Message{ID: 7})
		require.ErrorContains(t, err, "empty Key")
	})
}

func ExampleNewHTTPSender() {
	// A receiver that stores orders under their key.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		fmt.Println(r.Method, r.URL.EscapedPath(), string(body))
		for _, h := range []string{"Idempotency-Key", "Relay-Message-Key", "Relay-Message-Id", "Relay-Message-Type", "Relay-Attempt"} {
			fmt.Printf("  %s: %s\n", h, r.Header.Get(h))
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()

	sender, err := relay.NewHTTPSender(relay.HTTPSenderConfig{
		Type:   "order",
		URL:    relay.URLWithKey(srv.URL + "/orders"),
		Header: http.Header{"Authorization": {"Bearer token"}},
		// This receiver answers 409 to a message it already has: that is a success.
		StatusOutcomes: map[int]relay.HTTPOutcome{http.StatusConflict: relay.HTTPSuccess},
	})
	if err != nil {
		panic(err)
	}

	// A message read by the relay has "<table>/<id>" as its Idempotency-Key;
	// this one, built by hand, has its id.
	err = sender.Send(context.Background(), relay.Message{ID: 7, Type: "order", Key: "A/1", Payload: []byte(`{"total":10}`)})
	fmt.Println(err)
	// Output:
	// PUT /orders/A%2F1 {"total":10}
	//   Idempotency-Key: 7
	//   Relay-Message-Key: A/1
	//   Relay-Message-Id: 7
	//   Relay-Message-Type: order
	//   Relay-Attempt: 1
	// <nil>
}
