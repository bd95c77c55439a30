package inbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"

	"github.com/xadm/relay"
)

// The request headers the relay's HTTPSender sets, which [Inbox.Handler] reads.
const (
	headerIdempotencyKey = "Idempotency-Key"
	headerMessageID      = "Relay-Message-Id"
	headerMessageKey     = "Relay-Message-Key"
	headerMessageType    = "Relay-Message-Type"
	headerAttempt        = "Relay-Attempt"
)

// HeaderOutcome is the response header in which [Inbox.Handler] names the
// [Outcome] of a 2xx answer: "applied", "duplicate" or "stale".
const HeaderOutcome = "Relay-Inbox-Outcome"

// Handler returns an http.Handler that receives one relay message per
// request with [Inbox.Receive] and answers as the relay's HTTPSender expects:
//
//	204 No Content            applied, or a duplicate, or stale (HeaderOutcome says which)
//	400 Bad Request           Idempotency-Key or Relay-Message-Id missing, repeated or malformed;
//	                          Relay-Message-Key too long, or not the path's {key}: the body names the header
//	401 Unauthorized          with [Config.SigningSecrets]: the signature missing, malformed or wrong,
//	                          its timestamp outside [Config.SignatureTolerance], or its Webhook-Id not the
//	                          Idempotency-Key: the body says which
//	413 Content Too Large     a body over [Config.MaxBody]
//	422 Unprocessable Content the key received before with another body ([ErrBodyMismatch]),
//	                          or apply's [relay.Permanent] error
//	503 Service Unavailable   anything else: the database away, apply's other errors
//
// The relay marks the row SENT on a 2xx, dead on a 4xx, and retries a 5xx. A
// 4xx or 5xx applied and recorded nothing. The body of a 4xx or 5xx is one
// line saying why, which the relay keeps in the row's last_error.
//
// With [Config.SigningSecrets], the signature is checked first: the headers
// and the timestamp before the body is read, the signature over the body's
// raw bytes as soon as it is; a request that fails is answered 401 before
// any other header is read. Without it, the Handler verifies nothing: the
// middleware around it must authenticate the requests.
//
// The message is read from the headers Idempotency-Key, Relay-Message-Id,
// Relay-Message-Key (the natural key; absent means the empty key),
// Relay-Message-Type and Relay-Attempt (read when it is a number), and the
// body, verbatim: its bytes are what the signature covers and what a
// duplicate is compared by, so the same message re-serialised (another
// sender's JSON spacing) is another body, a 422. apply gets the request's
// context, so the middleware around the Handler (authentication, tracing)
// reaches it. The method and the path are the mux's business: mount it as
// "PUT /orders/{key}", say; mounted with a wildcard named key ({key} or
// {key...}), a request whose path's key is not its Relay-Message-Key is
// answered 400, naming both.
//
// A request with a control character in a header value never reaches the
// Handler: Go's http.Server answers it "400 Bad Request" itself, with no
// word of which header (the relay's HTTPSender never sends one: it refuses
// such a message at once, naming it).
func (ib *Inbox) Handler(apply ApplyFunc) http.Handler {
	if ib.verifier == nil {
		ib.unsigned.Do(func() {
			ib.logger.LogAttrs(context.Background(), slog.LevelInfo,
				"inbox: the Handler verifies no signature (Config.SigningSecrets is empty): the middleware around it must authenticate its requests")
		})
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m, status, err := ib.readRequest(w, r)
		if err != nil {
			http.Error(w, err.Error(), status)
			return
		}
		outcome, err := ib.Receive(r.Context(), m, apply)
		if err != nil {
			status := http.StatusServiceUnavailable
			switch {
			case relay.IsPermanent(err):
				status = http.StatusUnprocessableEntity
			case r.Context().Err() == nil: // not the client gone away, which hears no answer
				ib.logger.LogAttrs(r.Context(), slog.LevelWarn, "inbox: message not received, answered 503",
					slog.String("idempotency_key", m.IdempotencyKey), slog.String("error", err.Error()))
			}
			http.Error(w, err.Error(), status)
			return
		}
		w.Header().Set(HeaderOutcome, outcome.String())
		w.WriteHeader(http.StatusNoContent)
	})
}

// readRequest reads the message of r, or says which status refuses it and
// why: the signature first (verify.go), then the relay's headers.
func (ib *Inbox) readRequest(w http.ResponseWriter, r *http.Request) (Message, int, error) {
	var m Message
	sig, err := ib.checkTime(r)
	if err != nil {
		return m, http.StatusUnauthorized, err
	}
	var status int
	if m.Body, status, err = ib.readBody(w, r); err != nil {
		return m, status, err
	}
	if err := ib.verify(r, sig, m.Body); err != nil {
		return m, http.StatusUnauthorized, err
	}

	key, err := single(r, headerIdempotencyKey)
	if err != nil {
		return m, http.StatusBadRequest, err
	}
	switch {
	case len(key) > MaxIdempotencyKey:
		return m, http.StatusBadRequest, fmt.Errorf("inbox: header %s is %d bytes long, over the limit of %d", headerIdempotencyKey, len(key), MaxIdempotencyKey)
	case !printable(key):
		return m, http.StatusBadRequest, fmt.Errorf("inbox: header %s %q is not UTF-8 without control characters", headerIdempotencyKey, key)
	}
	m.IdempotencyKey = key

	id, err := single(r, headerMessageID)
	if err != nil {
		return m, http.StatusBadRequest, err
	}
	if m.ID, err = ParseMessageID(id); err != nil {
		return m, http.StatusBadRequest, fmt.Errorf("inbox: header %s: %w", headerMessageID, err)
	}

	if vs := r.Header.Values(headerMessageKey); len(vs) > 1 {
		return m, http.StatusBadRequest, fmt.Errorf("inbox: header %s appears %d times, want at most once", headerMessageKey, len(vs))
	}
	m.Key = r.Header.Get(headerMessageKey)
	if !ib.keepStale && len(m.Key) > MaxKey {
		return m, http.StatusBadRequest, fmt.Errorf("inbox: header %s is %d bytes long, over the limit of %d", headerMessageKey, len(m.Key), MaxKey)
	}
	if pathKey, ok := pathKey(r); ok && pathKey != m.Key {
		return m, http.StatusBadRequest, fmt.Errorf("inbox: the path's key %q is not the header %s %q: a message is applied under one key", pathKey, headerMessageKey, m.Key)
	}
	m.Type = r.Header.Get(headerMessageType)
	m.Attempt, _ = strconv.Atoi(r.Header.Get(headerAttempt)) // for logs only
	return m, 0, nil
}

// readBody reads r's body, up to the inbox's MaxBody, or says which status
// refuses it and why.
func (ib *Inbox) readBody(w http.ResponseWriter, r *http.Request) ([]byte, int, error) {
	if r.ContentLength > ib.maxBody {
		return nil, http.StatusRequestEntityTooLarge, ib.tooLarge(r.ContentLength)
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, ib.maxBody))
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		return nil, http.StatusRequestEntityTooLarge, ib.tooLarge(-1)
	case err != nil:
		// The client went away, or sent a body shorter than it said: nobody
		// reads this answer; 400 tells a proxy in between not to retry it.
		return nil, http.StatusBadRequest, fmt.Errorf("inbox: read the body: %w", err)
	}
	return body, 0, nil
}

// pathKey is the value of the request's path wildcard named key, when the
// pattern it was routed by has one ({key} or {key...}).
func pathKey(r *http.Request) (string, bool) {
	if !strings.Contains(r.Pattern, "{key}") && !strings.Contains(r.Pattern, "{key...}") {
		return "", false
	}
	return r.PathValue("key"), true
}

// tooLarge says that a body of length n (-1: unknown) is over the limit.
func (ib *Inbox) tooLarge(n int64) error {
	if n < 0 {
		return fmt.Errorf("inbox: the body is over the limit of %d bytes (inbox.Config.MaxBody)", ib.maxBody)
	}
	return fmt.Errorf("inbox: the body is %d bytes long, over the limit of %d bytes (inbox.Config.MaxBody)", n, ib.maxBody)
}

// single returns the one value of header name, or an error naming it when it
// is absent, empty or repeated.
func single(r *http.Request, name string) (string, error) {
	vs := r.Header.Values(name)
	switch {
	case len(vs) == 0:
		return "", fmt.Errorf("inbox: header %s is missing", name)
	case len(vs) > 1:
		return "", fmt.Errorf("inbox: header %s appears %d times, want it once", name, len(vs))
	case vs[0] == "":
		return "", fmt.Errorf("inbox: header %s is empty", name)
	}
	return vs[0], nil
}

// ParseMessageID parses a Relay-Message-Id: a positive decimal int64, digits
// only. The kafka and natsjs modules read their headers with it.
func ParseMessageID(s string) (int64, error) {
	if s == "" {
		return 0, errors.New("empty, want a positive decimal integer")
	}
	if len(s) > 19 {
		return 0, fmt.Errorf("%d digits long, over the 19 of an int64", len(s))
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, fmt.Errorf("%q is not a positive decimal integer", s)
		}
	}
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil || id <= 0 {
		return 0, fmt.Errorf("%q is not a positive decimal integer of at most 9223372036854775807", s)
	}
	return id, nil
}
