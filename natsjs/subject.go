package natsjs

import (
	"errors"
	"fmt"
	"strings"

	"github.com/xadm/relay"
)

// SubjectPrefixDefault is the first token(s) of every subject when
// [Config.SubjectPrefix] is empty: "relay.<type>.<key>".
const SubjectPrefixDefault = "relay"

// subjectMax is the longest subject the sender publishes. A NATS server closes
// the connection of a client whose protocol line exceeds its max_control_line
// (4096 bytes by default), failing every publish in flight on it; the line holds
// the subject, the reply inbox and two lengths, so 4000 bytes leaves them room.
const subjectMax = 4000

// emptyToken is the token of the empty string: a lone "%" is never produced for
// any other string, since every other "%" is followed by two hex digits.
const emptyToken = "%"

const upperHex = "0123456789ABCDEF"

// Token encodes s as one NATS subject token, reversibly and without collisions,
// so that any natural key or message type fits between two dots.
//
// The encoding is percent-encoding (RFC 3986) of the bytes of s, with every byte
// escaped as %XX (uppercase hex) except the letters A-Z and a-z, the digits and
// the three marks "-", "_" and "~", which stand for themselves. So "order-17"
// stays "order-17", "a.b" becomes "a%2Eb", "tenant 1/x*" becomes
// "tenant%201%2Fx%2A", and "ü" becomes "%C3%BC". The empty string, which has no
// bytes to escape, is the token "%". The result never holds ".", "*", ">",
// whitespace or any other byte that NATS or a protocol line treats specially,
// and is never empty. [ParseToken] reverses it.
func Token(s string) string {
	if s == "" {
		return emptyToken
	}
	n := 0
	for i := 0; i < len(s); i++ {
		if !unreserved(s[i]) {
			n++
		}
	}
	if n == 0 {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 2*n)
	for i := 0; i < len(s); i++ {
		c := s[i]
		if unreserved(c) {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(upperHex[c>>4])
		b.WriteByte(upperHex[c&0x0f])
	}
	return b.String()
}

// ParseToken returns the string that [Token] encoded as tok. It accepts only
// what Token produces (uppercase hex, no escaped letter or digit), so each
// string has exactly one token and each token exactly one string.
func ParseToken(tok string) (string, error) {
	if tok == emptyToken {
		return "", nil
	}
	if tok == "" {
		return "", errors.New("natsjs: empty token: Token never produces one")
	}
	var b strings.Builder
	b.Grow(len(tok))
	for i := 0; i < len(tok); i++ {
		c := tok[i]
		switch {
		case unreserved(c):
			b.WriteByte(c)
		case c == '%':
			if i+2 >= len(tok) {
				return "", fmt.Errorf("natsjs: token %q: %% at %d is not followed by two hex digits", tok, i)
			}
			hi, ok1 := unhex(tok[i+1])
			lo, ok2 := unhex(tok[i+2])
			if !ok1 || !ok2 {
				return "", fmt.Errorf("natsjs: token %q: %% at %d is not followed by two uppercase hex digits", tok, i)
			}
			v := hi<<4 | lo
			if unreserved(v) {
				return "", fmt.Errorf("natsjs: token %q: %q is escaped at %d but Token leaves it as is", tok, v, i)
			}
			b.WriteByte(v)
			i += 2
		default:
			return "", fmt.Errorf("natsjs: token %q: byte %q at %d is not produced by Token", tok, c, i)
		}
	}
	return b.String(), nil
}

// unreserved reports whether Token leaves c as it is.
func unreserved(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_' || c == '~'
}

func unhex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// subjectOf is the subject m is published to: Config.Subject's, or
// "<prefix>.<Token(type)>.<Token(key)>".
func (s *Sender) subjectOf(m relay.Message) (string, error) {
	if s.subject != nil {
		subj, err := s.customSubject(m)
		if err != nil {
			return "", err
		}
		if err := checkSubject(subj); err != nil {
			return "", fmt.Errorf("natsjs: Config.Subject returned %.200q for message %d: %w", subj, m.ID, err)
		}
		return subj, nil
	}
	subj := s.prefix + Token(m.Type) + "." + Token(m.Key)
	if len(subj) > subjectMax {
		return "", fmt.Errorf("natsjs: the subject of message %d is %d bytes, above the %d a NATS server's default max_control_line leaves for it: "+
			"shorten the natural key or publish to a Config.Subject of your own", m.ID, len(subj), subjectMax)
	}
	return subj, nil
}

// customSubject calls Config.Subject, a panic in it failing only m.
func (s *Sender) customSubject(m relay.Message) (subj string, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("natsjs: Config.Subject panicked for message %d: %v", m.ID, p)
		}
	}()
	return s.subject(m), nil
}

// checkSubject reports what makes subj unpublishable: empty, an empty token, a
// wildcard token, whitespace, or too long.
func checkSubject(subj string) error {
	if subj == "" {
		return errors.New("a subject must not be empty")
	}
	if len(subj) > subjectMax {
		return fmt.Errorf("a subject of %d bytes is above the %d a NATS server's default max_control_line leaves for it", len(subj), subjectMax)
	}
	for _, tok := range strings.Split(subj, ".") {
		if err := checkToken(tok); err != nil {
			return err
		}
	}
	return nil
}

// checkToken reports what makes tok unfit for a published subject.
func checkToken(tok string) error {
	switch {
	case tok == "":
		return errors.New("a subject token must not be empty (two dots in a row, or a leading or trailing dot)")
	case tok == "*" || tok == ">":
		return fmt.Errorf("the wildcard %q cannot be published to", tok)
	case strings.ContainsAny(tok, " \t\r\n\f\v"):
		return fmt.Errorf("a subject token must not hold whitespace: %q", tok)
	}
	return nil
}
