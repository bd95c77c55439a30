// Package headers is a message's headers as the relay checks, stores and
// reads them: the rules a producer's headers must keep (names that are HTTP
// tokens and not the senders' own, values without control characters, at
// most Max of them and BytesMax bytes), and the headers column's JSON.
//
// # Failure handling
//
// Enqueue refuses headers that break the rules; a row whose headers another
// producer wrote against them is read with the reason ([Decode]'s error),
// and the pass marks it dead rather than deliver it with some dropped.
package headers

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"unicode/utf8"
)

// The bounds of one message's headers (relay.HeadersMax, relay.HeadersBytesMax).
const (
	Max      = 64      // headers of one message, at most
	BytesMax = 8 << 10 // bytes of one message's header names and values, at most
)

// Column is the optional column that stores a message's headers.
const Column = "headers"

// reservedHeaders are the names a message's headers may not take, whatever
// their case: the senders set them from the message, or Go's HTTP client
// drops or rewrites them.
var reservedHeaders = []struct{ name, why string }{
	{"Idempotency-Key", "the senders set it from the message (Message.IdempotencyKey)"},
	{"Content-Type", "the senders set it (application/json, or the HTTPSender's configured one)"},
	{"Host", "Go's HTTP client takes it from the URL, never from the headers"},
	{"Content-Length", "Go's HTTP client computes it from the body"},
	{"Transfer-Encoding", "Go's HTTP client chooses it"},
	{"Trailer", "Go's HTTP client drops it from a request's headers"},
	{"Webhook-Id", "the HTTPSender sets it when it signs (HTTPSenderConfig.SigningSecrets)"},
	{"Webhook-Timestamp", "the HTTPSender sets it when it signs (HTTPSenderConfig.SigningSecrets)"},
	{"Webhook-Signature", "the HTTPSender sets it when it signs (HTTPSenderConfig.SigningSecrets)"},
}

// reservedHeaderPrefixes are the name prefixes kept for the senders, whatever
// their case: the HTTPSender's Relay-* headers and the NATS server's Nats-*.
var reservedHeaderPrefixes = []struct{ prefix, why string }{
	{"Relay-", "the HTTPSender sets the Relay-* headers from the message"},
	{"Nats-", "the NATS server reads the Nats-* headers (Nats-Msg-Id is the NATS sender's deduplication id)"},
}

// Validate returns an error naming the first header of h that breaks the
// rules, nil when every one keeps them. The relay checks every row it reads,
// so the common case, headers that keep the rules, allocates nothing; only a
// failure walks them in order, to name the first by name.
func Validate(h map[string]string) error {
	if len(h) == 0 {
		return nil
	}
	if len(h) > Max {
		return fmt.Errorf("has %d headers, more than HeadersMax (%d)", len(h), Max)
	}
	var names [Max]string // on the stack: the twins' check compares them without walking h again
	size, valid, n := 0, true, 0
	for name, value := range h {
		size += len(name) + len(value)
		if headerProblem(name, value) != "" {
			valid = false
			break
		}
		names[n] = name
		n++
	}
	if valid && caseTwin(names[:n]) != "" {
		valid = false
	}
	if valid {
		if size > BytesMax {
			return fmt.Errorf("headers take %d bytes, more than HeadersBytesMax (%d)", size, BytesMax)
		}
		return nil
	}
	sorted := slices.Sorted(maps.Keys(h))
	for _, name := range sorted {
		if problem := headerProblem(name, h[name]); problem != "" {
			return errors.New(problem)
		}
	}
	return errors.New(caseTwin(sorted))
}

// headerProblem says what is wrong with one header; "" when nothing is.
func headerProblem(name, value string) string {
	if !ValidToken(name) {
		return fmt.Sprintf("header name %.80q is not an HTTP token (letters, digits and !#$%%&'*+-.^_`|~)", name)
	}
	for _, r := range reservedHeaders {
		if strings.EqualFold(name, r.name) {
			return "must not set header " + r.name + ": " + r.why
		}
	}
	for _, r := range reservedHeaderPrefixes {
		if len(name) >= len(r.prefix) && strings.EqualFold(name[:len(r.prefix)], r.prefix) {
			return "must not set header " + name + ": " + r.why
		}
	}
	if !ValidValue(value) {
		return fmt.Sprintf("header %s has a value with control characters: %.80q", name, value)
	}
	return ""
}

// caseTwin names two of names that differ only in case (one header to
// HTTP), the first such pair (the first in order, when names are sorted); ""
// when none do.
func caseTwin(names []string) string {
	for i, a := range names {
		for _, b := range names[i+1:] {
			if strings.EqualFold(a, b) {
				first, second := min(a, b), max(a, b)
				return fmt.Sprintf("has headers %q and %q, one header to HTTP, whose names ignore case", first, second)
			}
		}
	}
	return ""
}

// Encode is h as the headers column stores it; nil (SQL NULL) when h is empty.
func Encode(h map[string]string) (*string, error) {
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

// Decode reads the headers column as the pass selected it (jsonb as
// text; nil when NULL) and checks it: a row whose headers break the rules is
// undeliverable, and the error says why.
func Decode(text []byte) (map[string]string, error) {
	if text == nil {
		return nil, nil
	}
	h, ok := parse(text)
	if !ok { // what parse does not read, encoding/json judges
		if err := json.Unmarshal(text, &h); err != nil {
			return nil, fmt.Errorf("headers is not a JSON object of strings: %.120s", text)
		}
	}
	if err := Validate(h); err != nil {
		return nil, fmt.Errorf("headers %w", err)
	}
	if len(h) == 0 {
		return nil, nil
	}
	return h, nil
}

// parse reads text, a JSON object of strings as PostgreSQL writes
// jsonb out, into a map, as json.Unmarshal would; false for anything else
// (other values, \u escapes, bytes that are not UTF-8, a malformed object),
// which Decode hands to json.Unmarshal. The relay reads every row's
// headers, and encoding/json's reflection took some 2 µs of each row with a
// traceparent; this takes a fraction of it. FuzzParseHeaders holds it to
// json.Unmarshal.
func parse(text []byte) (map[string]string, bool) {
	s := string(text) // one copy: the names and values are slices of it, unless escaped
	i := skipSpace(s, 0)
	if i == len(s) || s[i] != '{' {
		return nil, false
	}
	h := make(map[string]string, min(strings.Count(s, ":"), Max)) // at most a header a colon; more than Max is refused after
	i = skipSpace(s, i+1)
	if i < len(s) && s[i] == '}' {
		return h, skipSpace(s, i+1) == len(s)
	}
	for {
		name, j, ok := jsonString(s, i)
		if !ok {
			return nil, false
		}
		if j = skipSpace(s, j); j == len(s) || s[j] != ':' {
			return nil, false
		}
		value, k, ok := jsonString(s, skipSpace(s, j+1))
		if !ok {
			return nil, false
		}
		h[name] = value
		if k = skipSpace(s, k); k == len(s) {
			return nil, false
		}
		switch s[k] {
		case ',':
			i = skipSpace(s, k+1)
		case '}':
			return h, skipSpace(s, k+1) == len(s)
		default:
			return nil, false
		}
	}
}

// skipSpace is the first index of s from i that is not JSON white space.
func skipSpace(s string, i int) int {
	for i < len(s) && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r') {
		i++
	}
	return i
}

// jsonString reads the JSON string that starts at s[i], and returns its
// value and the index after it; false for what parse leaves to
// encoding/json.
func jsonString(s string, i int) (string, int, bool) {
	if i == len(s) || s[i] != '"' {
		return "", 0, false
	}
	start, ascii := i+1, true
	for j := start; j < len(s); j++ {
		switch c := s[j]; {
		case c == '"':
			v := s[start:j]
			if !ascii && !utf8.ValidString(v) {
				return "", 0, false
			}
			return v, j + 1, true
		case c == '\\':
			return unescape(s, start, j)
		case c < 0x20:
			return "", 0, false
		case c >= 0x80:
			ascii = false
		}
	}
	return "", 0, false
}

// unescape is jsonString from its first escape, at s[esc], on.
func unescape(s string, start, esc int) (string, int, bool) {
	var b strings.Builder
	b.WriteString(s[start:esc])
	for j := esc; j < len(s); j++ {
		c := s[j]
		switch {
		case c == '"':
			v := b.String()
			if !utf8.ValidString(v) {
				return "", 0, false
			}
			return v, j + 1, true
		case c < 0x20:
			return "", 0, false
		case c != '\\':
			b.WriteByte(c)
			continue
		}
		if j++; j == len(s) {
			return "", 0, false
		}
		switch s[j] {
		case '"', '\\', '/':
			b.WriteByte(s[j])
		case 'b':
			b.WriteByte('\b')
		case 'f':
			b.WriteByte('\f')
		case 'n':
			b.WriteByte('\n')
		case 'r':
			b.WriteByte('\r')
		case 't':
			b.WriteByte('\t')
		default: // \u, and what is no escape
			return "", 0, false
		}
	}
	return "", 0, false
}

// ValidToken reports whether s is an HTTP token (RFC 9110), as method and
// header names must be.
func ValidToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}

// ValidValue reports whether s can be sent as a header value: no control
// characters other than tab, as net/http's transport demands.
func ValidValue(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < ' ' && c != '\t' || c == 0x7f {
			return false
		}
	}
	return true
}
