package signing_test

import (
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/xadm/relay/internal/signing"
)

func secret(b byte, n int) (raw []byte, serialised string) {
	raw = []byte(strings.Repeat(string([]byte{b}), n))
	return raw, "whsec_" + base64.StdEncoding.EncodeToString(raw)
}

func edKeys(seed byte) (priv, pub string) {
	s := []byte(strings.Repeat(string([]byte{seed}), ed25519.SeedSize))
	k := ed25519.NewKeyFromSeed(s)
	return "whsk_" + base64.StdEncoding.EncodeToString(s),
		"whpk_" + base64.StdEncoding.EncodeToString(k.Public().(ed25519.PublicKey))
}

// TestSignHMAC checks a v1 signature against HMAC-SHA256 computed here from
// the specification's words, and the order of several.
func TestSignHMAC(t *testing.T) {
	t.Parallel()
	rawA, a := secret('a', 32)
	rawB, b := secret('b', 24)
	s, err := signing.NewSigner("F", []string{a, b})
	require.NoError(t, err)
	body := []byte(`{"id": 1}`)
	got := s.Sign("public.outbox/1", 1700000000, body)
	mac := func(k []byte) string {
		h := hmac.New(sha256.New, k)
		h.Write([]byte("public.outbox/1.1700000000." + string(body)))
		return "v1," + base64.StdEncoding.EncodeToString(h.Sum(nil))
	}
	require.Equal(t, mac(rawA)+" "+mac(rawB), got)
}

func TestVerify(t *testing.T) {
	t.Parallel()
	_, a := secret('a', 32)
	_, b := secret('b', 32)
	edPriv, edPub := edKeys(7)
	now := time.Unix(1700000000, 0)
	body := []byte(`{"id": 1}`)
	sign := func(keys ...string) signing.Headers {
		s, err := signing.NewSigner("F", keys)
		require.NoError(t, err)
		return signing.Headers{ID: "public.outbox/1", Timestamp: "1700000000", Signature: s.Sign("public.outbox/1", 1700000000, body),
			IDs: 1, Timestamps: 1, Signatures: 1}
	}
	v, err := signing.NewVerifier("F", []string{b, a, edPub}, 0)
	require.NoError(t, err)
	require.Equal(t, signing.ToleranceDefault, v.Tolerance())

	for name, h := range map[string]signing.Headers{
		"HMAC":      sign(a),
		"Rotation":  sign(b, a),
		"Ed25519":   sign(edPriv),
		"Both":      sign(edPriv, b),
		"OldAndNew": sign("whsec_"+base64.StdEncoding.EncodeToString([]byte(strings.Repeat("z", 32))), a),
	} {
		require.NoError(t, v.CheckTime(h, now), name)
		require.NoError(t, v.Verify(h, body), name)
	}

	retired := sign("whsec_" + base64.StdEncoding.EncodeToString([]byte(strings.Repeat("r", 32))))
	require.ErrorContains(t, v.Verify(retired, body), "no signature matches")
	require.ErrorContains(t, v.Verify(sign(a), []byte(`{"id": 2}`)), "no signature matches")
	other := sign(a)
	other.ID = "public.outbox/2"
	require.ErrorContains(t, v.Verify(other, body), "no signature matches")
	malformed := sign(a)
	malformed.Signature = "garbage"
	require.ErrorContains(t, v.Verify(malformed, body), "malformed")
	unknown := sign(a)
	unknown.Signature = "v2,AAAA"
	require.ErrorContains(t, v.Verify(unknown, body), "no signature of a version")

	for name, c := range map[string]struct {
		mut  func(*signing.Headers)
		want string
	}{
		"NoSignature":  {func(h *signing.Headers) { h.Signatures, h.Signature = 0, "" }, "Webhook-Signature is missing"},
		"NoID":         {func(h *signing.Headers) { h.IDs, h.ID = 0, "" }, "Webhook-Id is missing"},
		"TwoTimes":     {func(h *signing.Headers) { h.Timestamps = 2 }, "appears 2 times"},
		"NotNumber":    {func(h *signing.Headers) { h.Timestamp = "-5" }, "not a Unix time"},
		"TooOld":       {func(h *signing.Headers) { h.Timestamp = strconv.Itoa(1700000000 - 301) }, "5m1s old, beyond the tolerance of 5m0s"},
		"TooNew":       {func(h *signing.Headers) { h.Timestamp = strconv.Itoa(1700000000 + 301) }, "in the future"},
		"EmptyID":      {func(h *signing.Headers) { h.ID = "" }, "Webhook-Id is empty"},
		"JustInWindow": {func(h *signing.Headers) { h.Timestamp = strconv.Itoa(1700000000 - 300) }, ""},
	} {
		h := sign(a)
		c.mut(&h)
		err := v.CheckTime(h, now)
		if c.want == "" {
			require.NoError(t, err, name)
			continue
		}
		require.ErrorContains(t, err, c.want, name)
	}
}

// TestKeysRefused: each malformed key is refused naming the field and its
// index, never quoting the key.
func TestKeysRefused(t *testing.T) {
	t.Parallel()
	_, short := secret('s', 16)
	_, long := secret('l', 65)
	edPriv, edPub := edKeys(3)
	for _, c := range []struct {
		key, want string
		sign      bool
	}{
		{"whsec_not base64!", "is not whsec_ followed by standard base64", true},
		{short, "of 16 bytes", true},
		{long, "of 65 bytes", false},
		{"", "is empty", true},
		{"MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "is not a Standard Webhooks key", true},
		{edPub, "cannot sign", true},
		{edPriv, "keep the private key on the sender's side", false},
		{"whpk_" + base64.StdEncoding.EncodeToString([]byte("short")), "want the 32-byte", false},
	} {
		var err error
		if c.sign {
			_, err = signing.NewSigner("Cfg.Keys", []string{"whsec_" + base64.StdEncoding.EncodeToString(make([]byte, 32)), c.key})
		} else {
			_, err = signing.NewVerifier("Cfg.Keys", []string{"whsec_" + base64.StdEncoding.EncodeToString(make([]byte, 32)), c.key}, 0)
		}
		require.ErrorContains(t, err, "Cfg.Keys[1] ", c.key)
		require.ErrorContains(t, err, c.want, c.key)
		if len(c.key) > 8 {
			require.NotContains(t, err.Error(), c.key[6:])
		}
	}
}
