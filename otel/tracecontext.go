package otelrelay

import (
	"maps"
	"strings"

	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/xadm/relay"
)

// The W3C trace context read from a message's headers and written into them
// without the propagator's interfaces, when the propagator is
// propagation.TraceContext (the one a service sets most often, and the one
// WithPropagator names in the docs). It reads and writes exactly what
// TraceContext's Extract and Inject do (TestTraceContextAsThePropagator and
// its fuzz test hold them to it), without the context, the carrier and the
// checks of a header that any propagator could have set: propagation was
// the largest part of a wrapped send's own cost, and this takes about a
// seventh off an unsampled send (docs/tracing.md).

const (
	traceparentHeader = "traceparent"
	tracestateHeader  = "tracestate"
	traceparentLen    = 55 // 00-<trace id>-<span id>-<flags>
)

// isTraceContext reports whether p is propagation.TraceContext itself.
func isTraceContext(p propagation.TextMapPropagator) bool {
	_, ok := p.(propagation.TraceContext)
	return ok
}

// parseTraceContext is the span context that propagation.TraceContext's
// Extract reads from a traceparent and a tracestate; an invalid one when
// traceparent is missing or malformed. A malformed tracestate is dropped, and
// the traceparent kept, as the specification asks.
func parseTraceContext(p, state string) trace.SpanContext {
	var version, flags [1]byte
	var scc trace.SpanContextConfig
	if len(p) == traceparentLen && p[:3] == "00-" && p[35] == '-' && p[52] == '-' { // version 00, as written: no search for the fields
		if !unhexInto(scc.TraceID[:], p[3:35]) || !unhexInto(scc.SpanID[:], p[36:52]) || !unhexInto(flags[:], p[53:]) {
			return trace.SpanContext{}
		}
		p = ""
	} else if !hexPart(version[:], &p) || version[0] == 0xff ||
		!hexPart(scc.TraceID[:], &p) || !hexPart(scc.SpanID[:], &p) || !hexPart(flags[:], &p) {
		return trace.SpanContext{}
	}
	if version[0] == 0 && (p != "" || flags[0] > 3) { // version 00 has neither more fields nor other flags
		return trace.SpanContext{}
	}
	scc.TraceFlags = trace.TraceFlags(flags[0]) & (trace.FlagsSampled | trace.FlagsRandom)
	if state != "" {
		scc.TraceState, _ = trace.ParseTraceState(state)
	}
	scc.Remote = true
	sc := trace.NewSpanContext(scc)
	if !sc.IsValid() {
		return trace.SpanContext{}
	}
	return sc
}

// traceHeaders is what one walk of a message's headers finds for the W3C
// trace context: its traceparent and tracestate, as a headerCarrier reads
// them (a name in its exact case first, else in any case), and the sizes
// the headers handed on are checked with.
type traceHeaders struct {
	parent, state           string
	exactParent, exactState bool
	others                  int // names of either in another case
	size                    int // of every name and value
	traceSize               int // of the names and values of either, in any case
}

func readTraceHeaders(h map[string]string) (t traceHeaders) {
	for name, v := range h {
		t.size += len(name) + len(v)
		switch {
		case len(name) != len(traceparentHeader) && len(name) != len(tracestateHeader):
			continue
		case name == traceparentHeader:
			t.parent, t.exactParent = v, true
		case name == tracestateHeader:
			t.state, t.exactState = v, true
		case strings.EqualFold(name, traceparentHeader):
			if !t.exactParent {
				t.parent = v
			}
			t.others++
		case strings.EqualFold(name, tracestateHeader):
			if !t.exactState {
				t.state = v
			}
			t.others++
		default:
			continue
		}
		t.traceSize += len(name) + len(v)
	}
	return t
}

// withTraceContext is a copy of h with sc's trace context in place of the
// producer's (t, read from h), whatever the case of its names: sc's
// traceparent, and sc's tracestate or none (the producer's belongs to its
// trace). The other headers are h's: the relay checked them when it read the
// row, so only the count and the size can break the rules here.
func withTraceContext(h map[string]string, t *traceHeaders, sc trace.SpanContext) (map[string]string, error) {
	var out map[string]string
	if len(h) == 0 {
		out = make(map[string]string, 1)
	} else {
		out = maps.Clone(h)
	}
	if t.others > 0 {
		for name := range out {
			if name != traceparentHeader && name != tracestateHeader &&
				(strings.EqualFold(name, traceparentHeader) || strings.EqualFold(name, tracestateHeader)) {
				delete(out, name)
			}
		}
	}
	parent := formatTraceparent(sc)
	out[traceparentHeader] = parent
	size := t.size - t.traceSize + len(traceparentHeader) + len(parent)
	if state := sc.TraceState().String(); state != "" {
		out[tracestateHeader] = state
		size += len(tracestateHeader) + len(state)
	} else if t.exactState {
		delete(out, tracestateHeader)
	}
	if len(out) > relay.HeadersMax || size > relay.HeadersBytesMax {
		return nil, relay.ValidateHeaders(out)
	}
	return out, nil
}

// hexPart decodes the next '-'-separated field of *p into dst, which it must
// fill exactly, in lower-case hex, and leaves the rest in *p.
func hexPart(dst []byte, p *string) bool {
	part, rest, _ := strings.Cut(*p, "-")
	*p = rest
	return unhexInto(dst, part)
}

// unhexInto decodes part into dst, which it must fill exactly, in lower-case hex.
func unhexInto(dst []byte, part string) bool {
	if len(part) != 2*len(dst) {
		return false
	}
	invalid := byte(0) // any digit's value above 0xf, which none has
	for i := range dst {
		hi, lo := unhex(part[2*i]), unhex(part[2*i+1])
		dst[i] = hi<<4 | lo
		invalid |= hi | lo
	}
	return invalid <= 0xf
}

// unhex is c's value as a lower-case hex digit; above 0xf when it is none.
func unhex(c byte) byte { return unhexTable[c] }

// unhexTable is unhex's answer for each byte.
var unhexTable = func() (t [256]byte) {
	for c := range t {
		switch {
		case '0' <= c && c <= '9':
			t[c] = byte(c - '0')
		case 'a' <= c && c <= 'f':
			t[c] = byte(c - 'a' + 10)
		default:
			t[c] = 0xff
		}
	}
	return t
}()

// formatTraceparent is sc's traceparent, as propagation.TraceContext writes it.
func formatTraceparent(sc trace.SpanContext) string {
	const digits = "0123456789abcdef"
	var b [traceparentLen]byte
	tid, sid := sc.TraceID(), sc.SpanID()
	flags := byte(sc.TraceFlags() & (trace.FlagsSampled | trace.FlagsRandom))
	n := copy(b[:], "00")
	for _, part := range [][]byte{tid[:], sid[:], {flags}} {
		b[n] = '-'
		n++
		for _, c := range part {
			b[n], b[n+1] = digits[c>>4], digits[c&0xf]
			n += 2
		}
	}
	return string(b[:n])
}

// headerCarrier is a message's headers as a propagator reads them: by name,
// whatever its case, as HTTP reads headers (a producer may have written
// TraceParent; the relay's rules keep names unique whatever their case).
type headerCarrier map[string]string

// Get is the value of the header named key, whatever its case.
func (h headerCarrier) Get(key string) string {
	if v, ok := h[key]; ok {
		return v
	}
	for name, v := range h {
		if strings.EqualFold(name, key) {
			return v
		}
	}
	return ""
}

// Set does nothing: a headerCarrier is only read (by Extract), and the
// headers it reads are the relay's, never to be changed in place.
func (headerCarrier) Set(string, string) {}

// Keys are the headers' names.
func (h headerCarrier) Keys() []string { return propagation.MapCarrier(h).Keys() }
