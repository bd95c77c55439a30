package signing

import (
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// The headers of a signed request, in Go's canonical form (HTTP header names
// are case-insensitive; the specification writes them in lower case).
const (
	HeaderID        = "Webhook-Id"
	HeaderTimestamp = "Webhook-Timestamp"
	HeaderSignature = "Webhook-Signature"
)

// The serialised keys' prefixes and the signatures' versions.
const (
	prefixSecret  = "whsec_" // HMAC-SHA256 shared secret
	prefixPrivate = "whsk_"  // Ed25519 private key (seed)
	prefixPublic  = "whpk_"  // Ed25519 public key

	versionHMAC    = "v1"
	versionEd25519 = "v1a"
)

// The bounds of a whsec_ secret's random bytes, from the specification.
const (
	secretMinBytes = 24
	secretMaxBytes = 64
)

// ToleranceDefault is the default of a verifier's tolerance: how far a
// request's timestamp may be from the verifier's clock, either way.
const ToleranceDefault = 5 * time.Minute

// key is one parsed key: an HMAC secret, or an Ed25519 key (private to sign,
// public to verify).
type key struct {
	secret []byte
	priv   ed25519.PrivateKey
	pub    ed25519.PublicKey
}

func (k key) version() string {
	if k.secret != nil {
		return versionHMAC
	}
	return versionEd25519
}

// parse parses serialised key i of field; sign says whether it is to sign
// (whsec_ or whsk_) or to verify (whsec_ or whpk_). Its errors never quote
// the key.
func parse(field string, i int, s string, sign bool) (key, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%s[%d] %s", field, i, fmt.Sprintf(format, args...))
	}
	decode := func(prefix string) ([]byte, error) {
		b, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(s, prefix))
		if err != nil {
			return nil, bad("is not %s followed by standard base64 (with padding)", prefix)
		}
		return b, nil
	}
	switch {
	case strings.HasPrefix(s, prefixSecret):
		b, err := decode(prefixSecret)
		if err != nil {
			return key{}, err
		}
		if len(b) < secretMinBytes || len(b) > secretMaxBytes {
			return key{}, bad("is a whsec_ secret of %d bytes; the Standard Webhooks specification asks for %d to %d random bytes", len(b), secretMinBytes, secretMaxBytes)
		}
		return key{secret: b}, nil
	case strings.HasPrefix(s, prefixPrivate):
		if !sign {
			return key{}, bad("is an Ed25519 private key (whsk_): a verifier takes the public key (whpk_); keep the private key on the sender's side only")
		}
		b, err := decode(prefixPrivate)
		if err != nil {
			return key{}, err
		}
		if len(b) != ed25519.SeedSize {
			return key{}, bad("is a whsk_ key of %d bytes; want the %d-byte Ed25519 seed", len(b), ed25519.SeedSize)
		}
		priv := ed25519.NewKeyFromSeed(b)
		return key{priv: priv, pub: priv.Public().(ed25519.PublicKey)}, nil
	case strings.HasPrefix(s, prefixPublic):
		if sign {
			return key{}, bad("is an Ed25519 public key (whpk_), which cannot sign: the sender takes the private key (whsk_)")
		}
		b, err := decode(prefixPublic)
		if err != nil {
			return key{}, err
		}
		if len(b) != ed25519.PublicKeySize {
			return key{}, bad("is a whpk_ key of %d bytes; want the %d-byte Ed25519 public key", len(b), ed25519.PublicKeySize)
		}
		return key{pub: ed25519.PublicKey(b)}, nil
	case s == "":
		return key{}, bad("is empty")
	}
	if sign {
		return key{}, bad("is not a Standard Webhooks key: want whsec_ (HMAC-SHA256) or whsk_ (Ed25519) followed by base64")
	}
	return key{}, bad("is not a Standard Webhooks key: want whsec_ (HMAC-SHA256) or whpk_ (Ed25519 public key) followed by base64")
}

func parseAll(field string, secrets []string, sign bool) ([]key, error) {
	keys := make([]key, 0, len(secrets))
	var errs []error
	for i, s := range secrets {
		k, err := parse(field, i, s, sign)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		keys = append(keys, k)
	}
	return keys, errors.Join(errs...)
}

// Signer signs with each of its keys. Its zero value signs with none.
type Signer struct{ keys []key }

// NewSigner parses secrets (whsec_ or whsk_), or returns an error naming
// field and the index of each it refuses. No secrets makes a nil Signer.
func NewSigner(field string, secrets []string) (*Signer, error) {
	if len(secrets) == 0 {
		return nil, nil
	}
	keys, err := parseAll(field, secrets, true)
	if err != nil {
		return nil, err
	}
	return &Signer{keys: keys}, nil
}

// Sign returns the webhook-signature header of id, timestamp ts and body: one
// signature per key, in the order given, separated by spaces.
func (s *Signer) Sign(id string, ts int64, body []byte) string {
	var b strings.Builder
	tsText := strconv.FormatInt(ts, 10)
	for i, k := range s.keys {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(k.version())
		b.WriteByte(',')
		b.WriteString(base64.StdEncoding.EncodeToString(k.sign(id, tsText, body)))
	}
	return b.String()
}

// sign is k's signature of id.ts.body.
func (k key) sign(id, ts string, body []byte) []byte {
	if k.secret != nil {
		h := hmac.New(sha256.New, k.secret)
		h.Write([]byte(id))
		h.Write([]byte{'.'})
		h.Write([]byte(ts))
		h.Write([]byte{'.'})
		h.Write(body)
		return h.Sum(nil)
	}
	return ed25519.Sign(k.priv, content(id, ts, body))
}

// content is the signed content, id.ts.body, in one slice (Ed25519 needs it whole).
func content(id, ts string, body []byte) []byte {
	c := make([]byte, 0, len(id)+len(ts)+2+len(body))
	c = append(c, id...)
	c = append(c, '.')
	c = append(c, ts...)
	c = append(c, '.')
	return append(c, body...)
}

// Verifier checks requests against its keys and tolerance.
type Verifier struct {
	keys      []key
	tolerance time.Duration
}

// NewVerifier parses secrets (whsec_ or whpk_), or returns an error naming
// field and the index of each it refuses. No secrets makes a nil Verifier.
// A tolerance of 0 is [ToleranceDefault].
func NewVerifier(field string, secrets []string, tolerance time.Duration) (*Verifier, error) {
	if len(secrets) == 0 {
		return nil, nil
	}
	keys, err := parseAll(field, secrets, false)
	if err != nil {
		return nil, err
	}
	if tolerance == 0 {
		tolerance = ToleranceDefault
	}
	return &Verifier{keys: keys, tolerance: tolerance}, nil
}

// Tolerance is how far a timestamp may be from the clock, either way.
func (v *Verifier) Tolerance() time.Duration { return v.tolerance }

// Headers are a request's three signature headers: each value as received,
// with how many times the header appeared.
type Headers struct {
	ID, Timestamp, Signature    string
	IDs, Timestamps, Signatures int
}

// FromHTTP reads the signature headers of h.
func FromHTTP(h http.Header) Headers {
	ids, tss, sigs := h.Values(HeaderID), h.Values(HeaderTimestamp), h.Values(HeaderSignature)
	first := func(vs []string) string {
		if len(vs) == 0 {
			return ""
		}
		return vs[0]
	}
	return Headers{ID: first(ids), Timestamp: first(tss), Signature: first(sigs), IDs: len(ids), Timestamps: len(tss), Signatures: len(sigs)}
}

// CheckTime checks the headers' presence and form, and the timestamp against
// now: what can be refused before the body is read.
func (v *Verifier) CheckTime(h Headers, now time.Time) error {
	for _, c := range []struct {
		name  string
		value string
		n     int
	}{{HeaderID, h.ID, h.IDs}, {HeaderTimestamp, h.Timestamp, h.Timestamps}, {HeaderSignature, h.Signature, h.Signatures}} {
		switch {
		case c.n == 0:
			return fmt.Errorf("header %s is missing: the request is not signed", c.name)
		case c.n > 1:
			return fmt.Errorf("header %s appears %d times, want it once", c.name, c.n)
		case c.value == "":
			return fmt.Errorf("header %s is empty", c.name)
		}
	}
	ts, ok := parseTimestamp(h.Timestamp)
	if !ok {
		return fmt.Errorf("header %s %q is not a Unix time in seconds (decimal digits)", HeaderTimestamp, clip(h.Timestamp))
	}
	at := time.Unix(ts, 0)
	switch d := now.Sub(at); {
	case d > v.tolerance:
		return fmt.Errorf("header %s %d is %s old, beyond the tolerance of %s: a replay, or a clock off", HeaderTimestamp, ts, d.Truncate(time.Second), v.tolerance)
	case -d > v.tolerance:
		return fmt.Errorf("header %s %d is %s in the future, beyond the tolerance of %s: a clock off", HeaderTimestamp, ts, (-d).Truncate(time.Second), v.tolerance)
	}
	return nil
}

// Verify checks that one signature of h.Signature is a signature of
// h.ID.h.Timestamp.body by one of v's keys. Call [Verifier.CheckTime] first.
func (v *Verifier) Verify(h Headers, body []byte) error {
	entries := strings.Split(h.Signature, " ")
	wellFormed, known := 0, 0
	var msg []byte // Ed25519's content, made once
	for _, e := range entries {
		version, sig, ok := strings.Cut(e, ",")
		if !ok || version == "" || sig == "" {
			continue
		}
		wellFormed++
		for _, k := range v.keys {
			if k.version() != version {
				continue
			}
			known++
			if k.secret != nil {
				want := versionHMAC + "," + base64.StdEncoding.EncodeToString(k.sign(h.ID, h.Timestamp, body))
				if hmac.Equal([]byte(e), []byte(want)) {
					return nil
				}
				continue
			}
			raw, err := base64.StdEncoding.DecodeString(sig)
			if err != nil || len(raw) != ed25519.SignatureSize {
				continue
			}
			if msg == nil {
				msg = content(h.ID, h.Timestamp, body)
			}
			if ed25519.Verify(k.pub, msg, raw) {
				return nil
			}
		}
	}
	switch {
	case wellFormed == 0:
		return fmt.Errorf("header %s is malformed: want space-separated <version>,<base64 signature> entries", HeaderSignature)
	case known == 0:
		return fmt.Errorf("header %s has no signature of a version this receiver holds a key for (%s)", HeaderSignature, v.versions())
	}
	return fmt.Errorf("header %s: no signature matches the id, timestamp and body with the configured keys: a forgery, a body changed on the way, or a key retired or not yet configured", HeaderSignature)
}

// versions names the versions of v's keys.
func (v *Verifier) versions() string {
	var hasHMAC, hasEd bool
	for _, k := range v.keys {
		if k.secret != nil {
			hasHMAC = true
		} else {
			hasEd = true
		}
	}
	switch {
	case hasHMAC && hasEd:
		return versionHMAC + " and " + versionEd25519
	case hasEd:
		return versionEd25519
	}
	return versionHMAC
}

// parseTimestamp parses decimal digits only, at most 19 of them.
func parseTimestamp(s string) (int64, bool) {
	if s == "" || len(s) > 19 {
		return 0, false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	return n, err == nil
}

// clip shortens a header value quoted in an error.
func clip(s string) string {
	if len(s) > 40 {
		return s[:40] + "…"
	}
	return s
}
