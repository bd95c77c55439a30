package headers

import (
	"context"
	"encoding/json"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/xadm/relay/internal/testkit/pgserver"
)

// TestMain gets a real PostgreSQL (RELAY_TEST_DATABASE_URL, or the local
// binaries): the parser is held to what the server writes.
func TestMain(m *testing.M) { os.Exit(pgserver.Run(m, "RELAY_TEST_DATABASE_URL")) }

// headersSeeds are header objects as text, as PostgreSQL writes them and not.
var headersSeeds = []string{
	`{}`, ` { } `, `{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}`,
	`{"a": "1", "b": "2"}`, `{"a":"1","a":"2"}`, `{"q": "say \"hi\" \\ \/ \b\f\n\r\t"}`, `{"é": "ação ✓"}`,
	`{"u": "\u00e9"}`, `{"u": "\ud83d\ude00"}`, `{"n": 1}`, `{"n": null}`, `null`, `[]`, `"x"`, ``, `{`, `{"a"}`,
	`{"a": "b",}`, `{"a": "b"} x`, `{"a": "b"`, "{\"a\": \"\xff\"}", "{\"a\": \"tab\there\"}", `{"a": "\x"}`,
	`{"a": "b" "c": "d"}`, `{"a" "b"}`, `{,}`, "{\"\\\xff\": \"x\"}",
}

// checkParseHeaders fails t unless parseHeaders reads text as json.Unmarshal
// does, whenever it reads it at all.
func checkParseHeaders(t *testing.T, text string) {
	t.Helper()
	got, ok := parse([]byte(text))
	if !ok {
		return // json.Unmarshal judges it
	}
	var want map[string]string
	require.NoError(t, json.Unmarshal([]byte(text), &want), "parseHeaders read %q, which json.Unmarshal refuses", text)
	require.Equal(t, want, got, "%q", text)
}

// TestParseHeadersAsEncodingJSON: the relay's reading of the headers column
// is encoding/json's, wherever it reads without it.
func TestParseHeadersAsEncodingJSON(t *testing.T) {
	for _, text := range headersSeeds {
		checkParseHeaders(t, text)
	}
}

// FuzzParseHeaders: the same, for any text (go test runs the seeds; go test
// -fuzz FuzzParseHeaders looks further).
func FuzzParseHeaders(f *testing.F) {
	for _, text := range headersSeeds {
		f.Add(text)
	}
	f.Fuzz(checkParseHeaders)
}

// TestParseHeadersReadsWhatTheServerWrites: the headers the rules allow, as
// the server writes them out of a jsonb column (its spacing, its escapes),
// are read without encoding/json, and as they were written.
func TestParseHeadersReadsWhatTheServerWrites(t *testing.T) {
	t.Parallel()
	pool := pgserver.Pool(t, pgserver.Shared().URL, pgserver.Name(t), 2)
	for _, h := range []map[string]string{
		{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "tracestate": "congo=t61rcWkgMzE"},
		{"X-Tenant": "acme"},
		{"X-Quote": `say "hi" \ / done`, "X-Tab": "a\tb", "X-Text": "ação ✓ 😀", "X-Empty": ""},
	} {
		require.NoError(t, Validate(h))
		stored, err := Encode(h)
		require.NoError(t, err)
		var text []byte
		require.NoError(t, pool.QueryRow(context.Background(), `SELECT $1::jsonb::text`, *stored).Scan(&text))
		got, ok := parse(text)
		require.True(t, ok, "the server wrote %s", text)
		require.Equal(t, h, got, "the server wrote %s", text)
	}
}

// BenchmarkDecodeHeaders is the reading of one row's headers (a traceparent
// and a tenant, as the server writes them), by the relay and by
// encoding/json alone: go test -run xxx -bench DecodeHeaders -benchmem .
func BenchmarkDecodeHeaders(b *testing.B) {
	text := []byte(`{"X-Tenant": "acme", "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}`)
	b.Run("decodeHeaders", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := Decode(text); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding-json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var h map[string]string
			if err := json.Unmarshal(text, &h); err != nil {
				b.Fatal(err)
			}
		}
	})
}
