package relay

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/xadm/relay/internal/headers"
	"github.com/xadm/relay/internal/signing"
)

// httpSenderTimeoutDefault is the default of [HTTPSenderConfig.Timeout].
const httpSenderTimeoutDefault = 10 * time.Second

// The request headers an HTTPSender sets from the message. docs/receivers.md
// in the store.Table is the contract they make with a receiver.
const (
	headerIdempotencyKey = "Idempotency-Key"
	headerMessageKey     = "Relay-Message-Key"
	headerMessageID      = "Relay-Message-Id"
	headerMessageType    = "Relay-Message-Type"
	headerAttempt        = "Relay-Attempt"

	// headerReservedPrefix names the headers the sender keeps for itself.
	headerReservedPrefix = "Relay-"
)

const (
	// httpDrainLimit is how much of a response body Send reads before closing
	// it, so that the connection goes back to the pool. A longer body costs the
	// connection instead of the time to read it.
	httpDrainLimit = 64 << 10

	// httpErrorBodyLimit is how many bytes of a failure's body go into the error
	// text, which ends up in the last_error column.
	httpErrorBodyLimit = 200
)

// HTTPSender delivers messages of one type by HTTP to a URL built from the
// message. Build it with [NewHTTPSender]; it is safe for concurrent use.
//
// Each [HTTPSender.Send] makes one request (the relay does the retrying), with
// the payload verbatim as the body and these headers:
//
//	Content-Type: application/json        unless [HTTPSenderConfig.Header] sets another
//	Idempotency-Key: <Message.IdempotencyKey()>  this one message: "public.mensagem_m2m/42"
//	Relay-Message-Key: <Message.Key>      the natural key; omitted when empty
//	Relay-Message-Id: <Message.ID>        grows with each message of a key
//	Relay-Message-Type: <Message.Type>
//	Relay-Attempt: <Message.Attempts+1>   the attempt being made, from 1
//
// and the message's own [Message.Headers] (a W3C traceparent, say), except
// those [HTTPSenderConfig.Header] sets, which win. With
// [HTTPSenderConfig.SigningSecrets], each attempt is also signed anew by the
// Standard Webhooks scheme:
//
//	Webhook-Id: <Message.IdempotencyKey()>
//	Webhook-Timestamp: <the attempt's send time, Unix seconds>
//	Webhook-Signature: v1,<base64 HMAC-SHA256 of id.timestamp.body> …  one per secret
//
// Idempotency-Key is the same on every retry of a message and different for
// every other message, those of the same key included, so a receiver that
// replays its stored answer for a repeated Idempotency-Key (as Stripe does),
// or refuses one with a different body (as the IETF draft asks), still gets
// and applies each message of a key. Delivery is at-least-once and, after a
// failover, an older message of a key can arrive after a newer one: a receiver
// that stores each key's state ignores a message whose Relay-Message-Id is lower
// than the last one it applied for that key, and answers it 2xx.
// docs/receivers.md in the store.Table is the whole contract, with a receiver.
//
// By default any 2xx answer is success. A 4xx answer is [Permanent], except
// 408 Request Timeout, 425 Too Early and 429 Too Many Requests; 5xx, those
// three, a 3xx the client did not follow, transport errors and timeouts are
// retried (see [HTTPStatusOutcome]); [HTTPSenderConfig.StatusOutcomes] changes
// that for the statuses it lists. The error text reads well in the last_error
// column:
//
//	PUT http://orders.internal/orders/42: 503 Service Unavailable: upstream busy
type HTTPSender struct {
	typ     string
	url     func(m Message) (string, error)
	method  string
	client  *http.Client
	timeout time.Duration
	header  http.Header
	status  map[int]HTTPOutcome // the overrides of HTTPSenderConfig.StatusOutcomes
	signer  *signing.Signer     // nil: requests go unsigned
	secrets []string            // what an error text must never show (secretsOf)
}

// HTTPSenderConfig configures [NewHTTPSender].
type HTTPSenderConfig struct {
	// Type is the message type the sender delivers. Required.
	Type string

	// URL returns the absolute http or https URL that m goes to, typically a
	// base plus the escaped key (see [URLWithKey]). An error, or a URL that
	// does not parse, fails the message permanently. Required.
	URL func(m Message) (string, error)

	// Method is the request method. Defaults to PUT, which suits a receiver
	// that stores the message under its key and so is idempotent by itself.
	Method string

	// Client sends the requests. Defaults to a client shared by the
	// HTTPSenders that leave it nil: it keeps connections alive (up to 16 idle
	// per host), takes proxies from the environment like
	// [http.DefaultTransport], and does not follow redirects, because Go turns
	// a redirected PUT or POST into a GET whose 200 would pass for delivery.
	Client *http.Client

	// TLS configures the TLS of a client like the default one, of this
	// sender's own: the CAs it trusts (RootCAs), and the client certificate
	// of mutual TLS for a destination that requires one (Certificates, or
	// GetClientCertificate to pick a renewed certificate up without a
	// restart; docs/security.md). NewHTTPSender clones it. Not allowed with
	// Client: configure that client's transport instead. Defaults to nil: the
	// system's CAs, no client certificate.
	TLS *tls.Config

	// Timeout bounds one request, from dialling to reading the answer, on top
	// of the relay's ctx (whose [Config.SendTimeout] wins when
	// it is shorter). Defaults to 10s.
	Timeout time.Duration

	// Header is added to every request, for Authorization, say. It may set
	// Content-Type, but not the headers the sender sets from the message
	// (Idempotency-Key and Relay-*) nor Host or Content-Length, which Go
	// ignores here. NewHTTPSender copies it. Optional.
	Header http.Header

	// SigningSecrets sign every request by the Standard Webhooks scheme
	// (standardwebhooks.com): each is a "whsec_" secret (base64 of 24 to 64
	// random bytes: HMAC-SHA256, signature "v1") or a "whsk_" Ed25519
	// private key (base64 of its 32-byte seed: signature "v1a"), and each
	// adds its signature to the Webhook-Signature header, so that during a
	// rotation the old and the new secret sign together. The receiver checks
	// them with the same secrets (whpk_ public keys for whsk_):
	// [inbox.Config.SigningSecrets]. NewHTTPSender refuses a malformed one,
	// naming its index, never its value. Defaults to none: requests go
	// unsigned.
	SigningSecrets []string

	// StatusOutcomes overrides what the response statuses it lists mean; the
	// others keep [HTTPStatusOutcome]'s default. For a receiver that answers
	// 409 Conflict to a message it has already applied:
	//
	//	StatusOutcomes: map[int]relay.HTTPOutcome{http.StatusConflict: relay.HTTPSuccess}
	//
	// For one that follows the IETF Idempotency-Key draft, whose 409 means "a
	// request with this key is still in progress", {409: HTTPRetry}; and
	// {401: HTTPRetry, 403: HTTPRetry} retries, instead of killing, the rows
	// refused while a credential rotates (until [Config.MaxAttempts]). Keys
	// are statuses from 100 to 599. NewHTTPSender copies it. Optional.
	StatusOutcomes map[int]HTTPOutcome
}

// HTTPOutcome is what an [HTTPSender] makes of a response status: see
// [HTTPStatusOutcome] and [HTTPSenderConfig.StatusOutcomes].
type HTTPOutcome int

// The outcomes of a response status. The zero HTTPOutcome is none of them.
const (
	// HTTPSuccess: the receiver has the message (it applied it now, or had
	// already); Send returns nil and the row becomes SENT.
	HTTPSuccess HTTPOutcome = iota + 1
	// HTTPRetry: not this time; the row becomes ERROR and a later pass
	// retries it, until [Config.MaxAttempts].
	HTTPRetry
	// HTTPPermanent: sending the message again cannot succeed; the error is
	// wrapped with [Permanent] and the row is dead at once.
	HTTPPermanent
)

// String returns "success", "retry" or "permanent".
func (o HTTPOutcome) String() string {
	switch o {
	case HTTPSuccess:
		return "success"
	case HTTPRetry:
		return "retry"
	case HTTPPermanent:
		return "permanent"
	}
	return "HTTPOutcome(" + strconv.Itoa(int(o)) + ")"
}

// HTTPStatusOutcome returns what a response status means by default: a 2xx is
// [HTTPSuccess]; a 4xx is [HTTPPermanent] (the request itself is wrong: the
// payload, the URL, the credentials), except 408 Request Timeout, 425 Too
// Early and 429 Too Many Requests, which are [HTTPRetry]; anything else (5xx,
// a 3xx the client did not follow) is [HTTPRetry].
func HTTPStatusOutcome(status int) HTTPOutcome {
	switch {
	case status >= 200 && status <= 299:
		return HTTPSuccess
	case status == http.StatusRequestTimeout, status == http.StatusTooEarly, status == http.StatusTooManyRequests:
		return HTTPRetry
	case status >= 400 && status <= 499:
		return HTTPPermanent
	}
	return HTTPRetry
}

// NewHTTPSender returns an [HTTPSender] configured by cfg, or an error naming
// each field it refuses, as in "relay: HTTPSenderConfig.Type must not be empty".
func NewHTTPSender(cfg HTTPSenderConfig) (*HTTPSender, error) {
	s := &HTTPSender{
		typ:     cfg.Type,
		url:     cfg.URL,
		method:  cfg.Method,
		client:  cfg.Client,
		timeout: cfg.Timeout,
		header:  make(http.Header, len(cfg.Header)),
	}
	if len(cfg.StatusOutcomes) > 0 {
		s.status = make(map[int]HTTPOutcome, len(cfg.StatusOutcomes))
	}
	if s.method == "" {
		s.method = http.MethodPut
	}
	if s.client == nil && cfg.TLS != nil {
		s.client = newHTTPClient(cfg.TLS.Clone())
	}
	if s.client == nil {
		s.client = defaultHTTPClient()
	}
	if s.timeout == 0 {
		s.timeout = httpSenderTimeoutDefault
	}

	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("relay: HTTPSenderConfig.%s %s", field, fmt.Sprintf(format, args...)))
	}
	if strings.TrimSpace(s.typ) == "" {
		bad("Type", "must not be empty")
	} else if !headers.ValidValue(s.typ) {
		bad("Type", "%q must not contain control characters: it is sent in the %s header", s.typ, headerMessageType)
	}
	if s.url == nil {
		bad("URL", "must not be nil (try relay.URLWithKey(base))")
	}
	if cfg.Client != nil && cfg.TLS != nil {
		bad("TLS", "must be nil when Client is set: configure the TLS of Client's transport instead")
	}
	signer, err := signing.NewSigner("relay: HTTPSenderConfig.SigningSecrets", cfg.SigningSecrets)
	if err != nil {
		errs = append(errs, err)
	}
	s.signer = signer
	s.secrets = secretsOf(cfg.Header, cfg.SigningSecrets)
	if !headers.ValidToken(s.method) {
		bad("Method", "%q is not a valid HTTP method", s.method)
	}
	if s.timeout < 0 {
		bad("Timeout", "must not be negative, got %s", s.timeout)
	}
	for name, values := range cfg.Header {
		switch canonical := http.CanonicalHeaderKey(name); {
		case !headers.ValidToken(name):
			bad("Header", "%q is not a valid header name", name)
		case canonical == headerIdempotencyKey || strings.HasPrefix(canonical, headerReservedPrefix):
			bad("Header", "must not set %s: the sender sets Idempotency-Key and the Relay-* headers from each message", canonical)
		case canonical == "Host" || canonical == "Content-Length":
			bad("Header", "must not set %s: Go ignores it in a request's headers", canonical)
		case canonical == signing.HeaderID || canonical == signing.HeaderTimestamp || canonical == signing.HeaderSignature:
			bad("Header", "must not set %s: the sender sets the Standard Webhooks headers when it signs (SigningSecrets)", canonical)
		default:
			for _, v := range values {
				if !headers.ValidValue(v) {
					bad("Header", "%s has a value with control characters", canonical)
					break
				}
				s.header.Add(canonical, v)
			}
		}
	}
	for _, status := range slices.Sorted(maps.Keys(cfg.StatusOutcomes)) {
		switch o := cfg.StatusOutcomes[status]; {
		case status < 100 || status > 599:
			bad("StatusOutcomes", "has %d, which is not an HTTP status (100 to 599)", status)
		case o != HTTPSuccess && o != HTTPRetry && o != HTTPPermanent:
			bad("StatusOutcomes", "maps %d to %s; want HTTPSuccess, HTTPRetry or HTTPPermanent", status, o)
		default:
			s.status[status] = o
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return s, nil
}

// Type returns the message type s delivers, [HTTPSenderConfig.Type].
func (s *HTTPSender) Type() string { return s.typ }

// Send delivers m with one request and returns nil when the answer's outcome
// is [HTTPSuccess] (by default, a 2xx). The error of an [HTTPPermanent] answer
// is wrapped with [Permanent]; when ctx ends first, the error wraps ctx.Err()
// and returns at once.
func (s *HTTPSender) Send(ctx context.Context, m Message) error {
	rawURL, err := s.url(m)
	if err != nil {
		return Permanent(fmt.Errorf("URL of message %d: %w", m.ID, err))
	}
	// A header value the transport would refuse fails every attempt alike.
	if !headers.ValidValue(m.Key) {
		return Permanent(fmt.Errorf("message %d: Key %q has control characters, which the %s header cannot carry", m.ID, m.Key, headerMessageKey))
	}
	if !headers.ValidValue(m.Type) {
		return Permanent(fmt.Errorf("message %d: Type %q has control characters, which the %s header cannot carry", m.ID, m.Type, headerMessageType))
	}
	if err := headers.Validate(m.Headers); err != nil {
		return Permanent(fmt.Errorf("message %d: Headers %w", m.ID, err))
	}

	reqCtx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel() // after the deferred drain below: the body is read under reqCtx

	req, err := http.NewRequestWithContext(reqCtx, s.method, rawURL, bytes.NewReader(m.Payload))
	if err != nil {
		return Permanent(fmt.Errorf("%s: invalid URL: %w", s.method, err))
	}
	target := s.method + " " + req.URL.Redacted()
	if req.URL.Scheme != "http" && req.URL.Scheme != "https" {
		return Permanent(fmt.Errorf("%s: unsupported scheme %q (want http or https)", target, req.URL.Scheme))
	}
	if req.URL.Host == "" {
		return Permanent(fmt.Errorf("%s: URL has no host", target))
	}

	req.Header = s.header.Clone()
	// The message's headers, under those the sender was configured with
	// (Authorization, say), which a producer cannot replace.
	for name, value := range m.Headers {
		if canonical := http.CanonicalHeaderKey(name); req.Header[canonical] == nil {
			req.Header[canonical] = []string{value}
		}
	}
	if req.Header.Get("Content-Type") == "" {
		req.Header.Set("Content-Type", "application/json")
	}
	// One message, never a whole key: a receiver that replays its answer for a
	// repeated Idempotency-Key would otherwise drop every later message of the key.
	req.Header.Set(headerIdempotencyKey, m.IdempotencyKey())
	if m.Key != "" {
		req.Header.Set(headerMessageKey, m.Key)
	}
	req.Header.Set(headerMessageID, strconv.FormatInt(m.ID, 10))
	req.Header.Set(headerMessageType, m.Type)
	req.Header.Set(headerAttempt, strconv.Itoa(m.Attempts+1))
	if s.signer != nil {
		// Signed anew on every attempt: a retry gets a fresh timestamp.
		id := m.IdempotencyKey()
		ts := time.Now().Unix()
		req.Header.Set(signing.HeaderID, id)
		req.Header.Set(signing.HeaderTimestamp, strconv.FormatInt(ts, 10))
		req.Header.Set(signing.HeaderSignature, s.signer.Sign(id, ts, m.Payload))
	}

	resp, err := s.client.Do(req)
	if err != nil {
		return s.transportError(ctx, reqCtx, target, err)
	}
	defer func() {
		// Drain (bounded) and close, so that the connection is reused.
		_, _ = io.CopyN(io.Discard, resp.Body, httpDrainLimit)
		_ = resp.Body.Close()
	}()

	outcome := s.outcome(resp.StatusCode)
	if outcome == HTTPSuccess {
		return nil
	}
	err = errors.New(target + ": " + describeResponse(resp, s.secrets))
	if outcome == HTTPPermanent {
		return Permanent(err)
	}
	return err
}

// outcome is what status means to s: its override, else the default.
func (s *HTTPSender) outcome(status int) HTTPOutcome {
	if o, ok := s.status[status]; ok {
		return o
	}
	return HTTPStatusOutcome(status)
}

// transportError describes a request that got no answer. It is never
// permanent: the network, the receiver or the deadline may do better next time.
func (s *HTTPSender) transportError(ctx, reqCtx context.Context, target string, err error) error {
	// url.Error repeats the method and the URL, which target already has.
	var uerr *url.Error
	if errors.As(err, &uerr) {
		err = uerr.Err
	}
	if ctxErr := ctx.Err(); ctxErr != nil {
		if cause := context.Cause(ctx); cause != ctxErr {
			return fmt.Errorf("%s: %w: %w", target, ctxErr, cause)
		}
		return fmt.Errorf("%s: %w", target, ctxErr)
	}
	if reqCtx.Err() != nil {
		return fmt.Errorf("%s: no answer within %s: %w", target, s.timeout, err)
	}
	return fmt.Errorf("%s: %w", target, err)
}

// describeResponse is the status of resp, with Location and Retry-After when
// present and the start of the body, as one line fit for the last_error
// column, with secrets (secretsOf) replaced before anything is cut.
func describeResponse(resp *http.Response, secrets []string) string {
	var b strings.Builder
	if text := http.StatusText(resp.StatusCode); text != "" {
		b.WriteString(strconv.Itoa(resp.StatusCode) + " " + text)
	} else if resp.Status != "" {
		b.WriteString(resp.Status)
	} else {
		b.WriteString(strconv.Itoa(resp.StatusCode))
	}
	for _, name := range []string{"Location", "Retry-After"} {
		if v := oneLine([]byte(redact(resp.Header.Get(name), secrets))); v != "" {
			b.WriteString(" (" + name + ": " + v + ")")
		}
	}
	// Read more than is kept: oneLine collapses whitespace, and cuts with "…".
	head, _ := io.ReadAll(io.LimitReader(resp.Body, 4*httpErrorBodyLimit))
	if body := oneLine([]byte(redact(string(head), secrets))); body != "" {
		b.WriteString(": " + body)
	}
	return b.String()
}

// credentialNames are the words that make a configured header's value a
// credential, whatever their case: its value is never shown in an error.
var credentialNames = []string{"authorization", "cookie", "token", "key", "secret", "auth", "password", "session", "signature"}

// secretsOf returns the values that an error text must never show: the
// values of the configured headers whose names say they are credentials
// (Authorization, X-Api-Key, …), with the credentials after an
// Authorization scheme ("Bearer …") on their own, and the signing secrets,
// with and without their prefix. A receiver that echoes the request in its
// error body would otherwise put them in the row's last_error.
func secretsOf(h http.Header, signingSecrets []string) []string {
	var out []string
	add := func(v string) {
		if v = strings.TrimSpace(v); len(v) >= 8 {
			out = append(out, v)
		}
	}
	for name, values := range h {
		lower := strings.ToLower(name)
		if !slices.ContainsFunc(credentialNames, func(w string) bool { return strings.Contains(lower, w) }) {
			continue
		}
		for _, v := range values {
			add(v)
			if _, cred, ok := strings.Cut(strings.TrimSpace(v), " "); ok {
				add(cred)
			}
		}
	}
	for _, sec := range signingSecrets {
		add(sec)
		if _, b64, ok := strings.Cut(sec, "_"); ok {
			add(b64)
		}
	}
	// Longest first: a value that contains another is replaced whole.
	slices.SortFunc(out, func(a, b string) int { return len(b) - len(a) })
	return out
}

// redact replaces every secret in text with "[redacted]".
func redact(text string, secrets []string) string {
	for _, sec := range secrets {
		if strings.Contains(text, sec) {
			text = strings.ReplaceAll(text, sec, "[redacted]")
		}
	}
	return text
}

// oneLine makes p safe and short for a text column: valid UTF-8 (PostgreSQL
// refuses anything else, NUL included), control characters and runs of
// whitespace as one space, at most httpErrorBodyLimit bytes, cut on a rune
// boundary and marked with "…".
func oneLine(p []byte) string {
	s := strings.ToValidUTF8(string(p), "\uFFFD")
	s = strings.Join(strings.FieldsFunc(s, func(r rune) bool {
		return unicode.IsSpace(r) || unicode.IsControl(r)
	}), " ")
	if len(s) <= httpErrorBodyLimit {
		return s
	}
	cut := httpErrorBodyLimit
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return strings.TrimRight(s[:cut], " ") + "…"
}

// URLWithKey returns an [HTTPSenderConfig.URL] that sends each message to
// base + "/" + its key, escaped as one path segment: with base
// "https://orders.internal/orders", the key "A/1" goes to
// https://orders.internal/orders/A%2F1. It is the one layout common enough to
// ship; write the function yourself for anything else (the type in the path,
// a query string). A trailing slash on base is dropped; a message with an
// empty key fails permanently, rather than be sent to base itself.
func URLWithKey(base string) func(m Message) (string, error) {
	base = strings.TrimRight(base, "/")
	return func(m Message) (string, error) {
		switch m.Key {
		case "":
			return "", errors.New("empty Key: URLWithKey needs a key for the path")
		case ".", "..": // would name base or its parent after path cleaning
			return base + "/" + strings.Repeat("%2E", len(m.Key)), nil
		}
		return base + "/" + url.PathEscape(m.Key), nil
	}
}

// defaultHTTPClient is the client of the HTTPSenders configured without one.
var defaultHTTPClient = sync.OnceValue(func() *http.Client { return newHTTPClient(nil) })

// newHTTPClient is a client like the default one, with tlsConfig (nil: Go's
// default) for its connections.
func newHTTPClient(tlsConfig *tls.Config) *http.Client {
	var t *http.Transport
	if dt, ok := http.DefaultTransport.(*http.Transport); ok {
		t = dt.Clone() // dial, TLS handshake and idle timeouts, proxies from the environment
	} else {
		t = &http.Transport{
			Proxy:                 http.ProxyFromEnvironment,
			ForceAttemptHTTP2:     true,
			MaxIdleConns:          100,
			IdleConnTimeout:       90 * time.Second,
			TLSHandshakeTimeout:   10 * time.Second,
			ExpectContinueTimeout: time.Second,
		}
	}
	// The default of 2 would close connections as soon as [Config.Concurrency]
	// puts more than two requests in flight to one receiver.
	t.MaxIdleConnsPerHost = 16
	if tlsConfig != nil {
		t.TLSClientConfig = tlsConfig
	}
	return &http.Client{
		Transport: t,
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}
}
