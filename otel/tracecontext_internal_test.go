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

// checkTraceContextAsThePropagator fails t unless readTraceHeaders and
// parseTraceContext read from traceparent and tracestate (named in their
// case, and in others) what propagation.TraceContext's Extract reads through
// a headerCarrier, and withTraceContext hands on the headers that its Inject
// makes of them (injected, the path of any other propagator).
func checkTraceContextAsThePropagator(t *testing.T, traceparent, tracestate string) {
	t.Helper()
	for _, names := range [][2]string{{traceparentHeader, tracestateHeader}, {"TraceParent", "TRACESTATE"}} {
		h := map[string]string{"X-Tenant": "acme"}
		if traceparent != "" {
			h[names[0]] = traceparent
		}
		if tracestate != "" {
			h[names[1]] = tracestate
		}
		want := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), headerCarrier(h)))
		th := readTraceHeaders(h)
		got := parseTraceContext(th.parent, th.state)
		require.True(t, want.Equal(got), "%v: the propagator reads %v, parseTraceContext %v", h, want, got)

		for _, sc := range []trace.SpanContext{got, got.WithRemote(false), got.WithTraceFlags(0xff), got.WithTraceState(trace.TraceState{})} {
			if !sc.IsValid() {
				continue // start hands the headers on as they came
			}
			wantH, wantErr := injected(propagation.TraceContext{}, trace.ContextWithSpanContext(context.Background(), sc), h)
			gotH, gotErr := withTraceContext(h, &th, sc)
			require.Equal(t, wantErr == nil, gotErr == nil, "%v, %v: %v, %v", h, sc, wantErr, gotErr)
			if wantErr == nil {
				require.Equal(t, wantH, gotH, "%v, %v", h, sc)
			}
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
