package otelrelay

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// traceContextSeeds are traceparent and tracestate headers, valid and not,
// for the propagator's own reading to judge.
var traceContextSeeds = [][2]string{
	{"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", ""},
	{"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00", "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"},
	{"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-03", "not a trace state"},
	{"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-04", ""},          // a reserved flag in version 00
	{"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra", ""},    // more fields in version 00
	{"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-09-extra", "a=b"}, // a later version may have them
	{"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-09extra", ""},     // but flags of two digits
	{"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", ""},          // the version that never is
	{"fe-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", ""},          // the last version that may be
	{"00-4BF92F3577B34DA6A3CE929D0E0E4736-00F067AA0BA902B7-01", ""},          // upper case
	{"00-00000000000000000000000000000000-00f067aa0ba902b7-01", ""},          // no trace id
	{"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", ""},          // no span id
	{"00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01", ""},          // a field too short
	{"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1", ""},           // flags too short
	{"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-", ""},            // no flags
	{"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7", ""},             // nor their delimiter
	{"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902g7-01", ""},          // not hex
	{"0-04bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", ""},          // a short version
	{"", "a=b"},
	{"-", ""},
	{"00--", ""},
}

// checkTraceContextAsThePropagator fails t unless extractTraceContext reads
// from traceparent and tracestate (named in their case, and in others) what
// propagation.TraceContext's Extract reads through a headerCarrier, and injectTraceContext writes for it what its Inject writes.
func checkTraceContextAsThePropagator(t *testing.T, traceparent, tracestate string) {
	t.Helper()
	var got trace.SpanContext
	for _, names := range [][2]string{{traceparentHeader, tracestateHeader}, {"TraceParent", "TRACESTATE"}} {
		h := map[string]string{"X-Tenant": "acme"}
		if traceparent != "" {
			h[names[0]] = traceparent
		}
		if tracestate != "" {
			h[names[1]] = tracestate
		}
		want := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), headerCarrier(h)))
		got = extractTraceContext(h)
		require.True(t, want.Equal(got), "%v: the propagator reads %v, extractTraceContext %v", h, want, got)
	}

	for _, sc := range []trace.SpanContext{got, got.WithRemote(false), got.WithTraceFlags(0xff), got.WithTraceState(trace.TraceState{})} {
		wantH := propagation.MapCarrier{}
		propagation.TraceContext{}.Inject(trace.ContextWithSpanContext(context.Background(), sc), wantH)
		gotH := &pairs{}
		injectTraceContext(sc, gotH)
		require.Equal(t, len(wantH), gotH.n, "%v: %v, %v", sc, wantH, gotH.all())
		for name, value := range wantH {
			require.Equal(t, value, gotH.Get(name), "%v: %s", sc, name)
		}
	}
}

// TestTraceContextAsThePropagator: the W3C trace context read and written
// directly is what propagation.TraceContext reads and writes, for valid
// headers and for each way of being invalid.
func TestTraceContextAsThePropagator(t *testing.T) {
	for _, s := range traceContextSeeds {
		checkTraceContextAsThePropagator(t, s[0], s[1])
	}
	require.True(t, isTraceContext(propagation.TraceContext{}))
	require.False(t, isTraceContext(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{})))
}

// FuzzTraceContextAsThePropagator: the same, for any headers (go test runs
// the seeds; go test -fuzz FuzzTraceContextAsThePropagator looks further).
func FuzzTraceContextAsThePropagator(f *testing.F) {
	for _, s := range traceContextSeeds {
		f.Add(s[0], s[1])
	}
	f.Fuzz(checkTraceContextAsThePropagator)
}
