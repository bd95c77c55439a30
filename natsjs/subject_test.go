package natsjs_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xadm/relay/natsjs"
)

func TestToken(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ in, want string }{
		{"42", "42"},
		{"order-17_a~B", "order-17_a~B"},
		{"a.b", "a%2Eb"},
		{"*", "%2A"},
		{">", "%3E"},
		{"tenant 1/x", "tenant%201%2Fx"},
		{"tab\there", "tab%09here"},
		{"line\r\nbreak", "line%0D%0Abreak"},
		{"100%", "100%25"},
		{"ü", "%C3%BC"},
		{"", "%"},
		{"%", "%25"},
		{"\x00\xff", "%00%FF"},
	} {
		got := natsjs.Token(tt.in)
		require.Equal(t, tt.want, got, "Token(%q)", tt.in)
		back, err := natsjs.ParseToken(got)
		require.NoError(t, err, "ParseToken(%q)", got)
		require.Equal(t, tt.in, back)
	}
}

func TestParseTokenRefusesWhatTokenNeverProduces(t *testing.T) {
	t.Parallel()
	for _, tok := range []string{
		"",      // Token never gives an empty token
		"a.b",   // a dot splits tokens
		"a%2eb", // lowercase hex: "a%2Eb" is the one token of "a.b"
		"%41",   // an escaped letter: "A" is its own token
		"%2",    // truncated
		"a%",    // truncated
		"%G0",   // not hex
		"a b",   // whitespace
		"*",     // a wildcard
	} {
		_, err := natsjs.ParseToken(tok)
		require.Error(t, err, "ParseToken(%q)", tok)
	}
}

// FuzzToken checks that Token gives every string one valid subject token that
// ParseToken reverses (so no two strings share a token), and that ParseToken
// accepts only the tokens Token produces.
func FuzzToken(f *testing.F) {
	for _, s := range []string{"", "42", "a.b", "*", ">", " ", "%", "%25", "ü", "\x00", "a%2Eb", "%41"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		tok := natsjs.Token(s)
		require.NotEmpty(t, tok)
		require.False(t, strings.ContainsAny(tok, ".*> \t\r\n\f\v"), "Token(%q) = %q", s, tok)
		for i := 0; i < len(tok); i++ {
			require.True(t, tok[i] > 0x20 && tok[i] < 0x7f, "Token(%q) = %q holds byte %#x", s, tok, tok[i])
		}
		back, err := natsjs.ParseToken(tok)
		require.NoError(t, err)
		require.Equal(t, s, back)

		// s read as a token: valid only if it is some string's one token.
		if parsed, err := natsjs.ParseToken(s); err == nil {
			require.Equal(t, s, natsjs.Token(parsed), "ParseToken accepted %q, which Token does not produce", s)
		}
	})
}
