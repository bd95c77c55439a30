package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestOneTrace runs the example, as `go run . -out spans.json -svg trace.svg`
// does, and checks that the spans the stdout exporter wrote are one trace: the
// request, its insert, the relay's send and the receiver's span, each a child
// of the one before it; and that the picture is drawn.
func TestOneTrace(t *testing.T) {
	dir := t.TempDir()
	out, svg := filepath.Join(dir, "spans.json"), filepath.Join(dir, "trace.svg")
	var report bytes.Buffer
	require.NoError(t, run(context.Background(), options{out: out, svg: svg}, &bytes.Buffer{}, &report))
	require.Contains(t, report.String(), "the receiver got order-42 with traceparent 00-")
	require.Contains(t, report.String(), "metric messaging.client.sent.messages")

	data, err := os.ReadFile(out)
	require.NoError(t, err)
	type span struct {
		Name        string
		SpanContext struct{ TraceID, SpanID string }
		Parent      struct{ TraceID, SpanID string }
	}
	byName := map[string]span{}
	dec := json.NewDecoder(bytes.NewReader(data))
	for dec.More() {
		var s span
		require.NoError(t, dec.Decode(&s))
		byName[s.Name] = s
	}
	require.Len(t, byName, 4, "spans: %v", byName)
	request, send, got := byName["POST /orders"], byName["send order"], byName["PUT /orders/{key}"]
	require.Equal(t, request.SpanContext.TraceID, send.SpanContext.TraceID)
	require.Equal(t, request.SpanContext.TraceID, got.SpanContext.TraceID)
	require.Equal(t, request.SpanContext.SpanID, send.Parent.SpanID)
	require.Equal(t, send.SpanContext.SpanID, got.Parent.SpanID)

	picture, err := os.ReadFile(svg)
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(string(picture), "<svg"))
	for _, name := range []string{"POST /orders", "send order", "PUT /orders/{key}"} {
		require.Contains(t, string(picture), name)
	}
}
