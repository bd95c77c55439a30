package relay

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
)

// Headers travel with a message from its producer to its destination: a
// Sender gets them in [Message.Headers], and the HTTPSender, the Kafka sender
// and the NATS sender put them in the request's headers, the record's and the
// message's. They carry metadata beside the payload, typically the W3C trace
// context (traceparent, tracestate) that the otel module stores.
//
// They are stored in the optional headers column (jsonb, one object of
// strings), which CreateTable and SchemaSQL add; a table without it (a JVM
// service's) keeps working, and its messages have no headers. The rules,
// checked by Enqueue and again by the relay on every row it reads (a row that
// breaks them, written by another producer, is marked dead with the reason):
//
//   - a name is an HTTP token (letters, digits and !#$%&'*+-.^_`|~), unique
//     whatever its case, and not one the senders set themselves:
//     Idempotency-Key, Content-Type, Relay-*, Nats-*, nor one Go's HTTP
//     client would drop (Host, Content-Length, Transfer-Encoding, Trailer);
//   - a value has no control characters other than tab;
//   - at most [HeadersMax] headers, names and values of at most
//     [HeadersBytesMax] bytes in all.
const (
	HeadersMax      = 64      // headers of one message, at most
	HeadersBytesMax = 8 << 10 // bytes of one message's header names and values, at most
)

// headersColumn is the optional column that stores a message's headers.
const headersColumn = "headers"

// reservedHeaders are the names (canonical, as net/http writes them) a
// message's headers may not take: the senders set them from the message, or
// Go's HTTP client drops or rewrites them.
var reservedHeaders = map[string]string{
	"Idempotency-Key":   "the senders set it from the message (Message.IdempotencyKey)",
	"Content-Type":      "the senders set it (application/json, or the HTTPSender's configured one)",
	"Host":              "Go's HTTP client takes it from the URL, never from the headers",
	"Content-Length":    "Go's HTTP client computes it from the body",
	"Transfer-Encoding": "Go's HTTP client chooses it",
	"Trailer":           "Go's HTTP client drops it from a request's headers",
}

// reservedHeaderPrefixes are the name prefixes (canonical) kept for the
// senders: the HTTPSender's Relay-* headers and the NATS server's Nats-*.
var reservedHeaderPrefixes = map[string]string{
	"Relay-": "the HTTPSender sets the Relay-* headers from the message",
	"Nats-":  "the NATS server reads the Nats-* headers (Nats-Msg-Id is the NATS sender's deduplication id)",
}

// ValidateHeaders returns an error naming the first header of h that breaks
// the rules of [HeadersMax], nil when every one keeps them: what Enqueue and
// the relay check, for a producer that writes by plain SQL, or a Sender (or a
// wrapper of one) that adds headers.
func ValidateHeaders(h map[string]string) error { return validateHeaders(h) }

// validateHeaders is ValidateHeaders.
func validateHeaders(h map[string]string) error {
	if len(h) == 0 {
		return nil
	}
	if len(h) > HeadersMax {
		return fmt.Errorf("has %d headers, more than HeadersMax (%d)", len(h), HeadersMax)
	}
	size := 0
	seen := make(map[string]string, len(h))
	for _, name := range slices.Sorted(maps.Keys(h)) {
		value := h[name]
		size += len(name) + len(value)
		if !validToken(name) {
			return fmt.Errorf("header name %.80q is not an HTTP token (letters, digits and !#$%%&'*+-.^_`|~)", name)
		}
		canonical := canonicalHeader(name)
		if why, ok := reservedHeaders[canonical]; ok {
			return fmt.Errorf("must not set header %s: %s", canonical, why)
		}
		for prefix, why := range reservedHeaderPrefixes {
			if strings.HasPrefix(canonical, prefix) {
				return fmt.Errorf("must not set header %s: %s", name, why)
			}
		}
		if other, ok := seen[canonical]; ok {
			return fmt.Errorf("has headers %q and %q, one header to HTTP, whose names ignore case", other, name)
		}
		seen[canonical] = name
		if !validHeaderValue(value) {
			return fmt.Errorf("header %s has a value with control characters: %.80q", name, value)
		}
	}
	if size > HeadersBytesMax {
		return fmt.Errorf("headers take %d bytes, more than HeadersBytesMax (%d)", size, HeadersBytesMax)
	}
	return nil
}

// canonicalHeader is name as net/http writes it ("idempotency-key" is
// "Idempotency-Key"), for a name that is a token.
func canonicalHeader(name string) string {
	b := []byte(name)
	upper := true
	for i, c := range b {
		switch {
		case upper && 'a' <= c && c <= 'z':
			b[i] = c - 'a' + 'A'
		case !upper && 'A' <= c && c <= 'Z':
			b[i] = c - 'A' + 'a'
		}
		upper = c == '-'
	}
	return string(b)
}

// encodeHeaders is h as the headers column stores it; nil (SQL NULL) when h is empty.
func encodeHeaders(h map[string]string) (*string, error) {
	if len(h) == 0 {
		return nil, nil
	}
	b, err := json.Marshal(h)
	if err != nil {
		return nil, err
	}
	s := string(b)
	return &s, nil
}

// decodeHeaders reads the headers column as the pass selected it (jsonb as
// text; nil when NULL) and checks it: a row whose headers break the rules is
// undeliverable, and the error says why.
func decodeHeaders(text []byte) (map[string]string, error) {
	if text == nil {
		return nil, nil
	}
	var h map[string]string
	if err := json.Unmarshal(text, &h); err != nil {
		return nil, fmt.Errorf("headers is not a JSON object of strings: %.120s", text)
	}
	if err := validateHeaders(h); err != nil {
		return nil, fmt.Errorf("headers %w", err)
	}
	if len(h) == 0 {
		return nil, nil
	}
	return h, nil
}

// headersMigration is the statement that adds the headers column to table
// (quoted), for an existing table; docs/operations.md gives it too.
func headersMigration(table string) string {
	return "ALTER TABLE " + table + " ADD COLUMN IF NOT EXISTS " + headersColumn + " jsonb"
}
