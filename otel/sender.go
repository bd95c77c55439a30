package otelrelay

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/xadm/relay"
)

// AttemptKey is the attribute of a send span that says which attempt at the
// message it is, from 1 (relay.Message.Attempts + 1).
const AttemptKey = attribute.Key("relay.message.attempt")

// operationName is the messaging.operation.name of a send span.
const operationName = "send"

// WrapSender returns s with each send in a span (see the package's doc): the
// span is linked to the producer's span whose trace context [Enqueue] stored
// in the message's headers (or its child, with [AsChild]), and its own trace
// context goes into a copy of the headers that s gets, a span the sampler
// left out too (sampled flag 0, so that the receiver keeps the decision).
// When s is a [relay.BatchSender], so is the result, with one span per
// message of a batch. Options: [WithTracerProvider], [WithPropagator],
// [WithSystem], [AsChild]. The sampler is given the span's name, kind,
// link (or parent) and the destination's attributes; the message's id and
// attempt are set on a recorded span only.
//
// The wrapper changes nothing else: s gets the same context, the same
// message (its headers aside), and its error or panic reaches the relay as
// it was. A panic of the tracer or the propagator costs the span only: s
// then gets the message as it came. A recorded span ends off the Send's
// path, on a goroutine of the module's (in batches, a few milliseconds
// later, with its Send's end as its end), so that a span processor that
// blocks (a synchronous exporter that hangs) never holds a Send past its
// deadline; while one End does not return, up to 4096 spans wait and later
// ones are dropped. [Flush] waits for the spans of the sends that returned.
func WrapSender(s relay.Sender, opts ...Option) relay.Sender {
	c := newConfig(opts)
	tp := c.tracerProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	w := &sender{next: s, c: c, tracer: tp.Tracer(ScopeName)}
	if b, ok := s.(relay.BatchSender); ok {
		return &batchSender{sender: w, batch: b}
	}
	return w
}

type sender struct {
	next   relay.Sender
	c      config
	tracer trace.Tracer
	kind   atomic.Pointer[spanKind] // the last type's; see kindOf
}

// Type returns the wrapped sender's type.
func (w *sender) Type() string { return w.next.Type() }

// Send sends m through the wrapped sender in a span.
func (w *sender) Send(ctx context.Context, m relay.Message) (err error) {
	sctx, span, out := w.start(ctx, m)
	defer func() {
		if p := recover(); p != nil {
			w.end(span, fmt.Errorf("panic: %v", p))
			panic(p) // the relay's own recover marks the message, as without the wrapper
		}
	}()
	err = w.next.Send(sctx, out)
	w.end(span, err)
	return err
}

// sendSpan is a send's span, and whether it records (the sampler kept it).
type sendSpan struct {
	trace.Span
	recording bool
}

type batchSender struct {
	*sender
	batch relay.BatchSender
}

// SendBatch sends ms through the wrapped sender's SendBatch, each message in
// a span of its own.
func (w *batchSender) SendBatch(ctx context.Context, ms []relay.Message) (errs []error) {
	spans := make([]sendSpan, len(ms))
	outs := make([]relay.Message, len(ms))
	for i, m := range ms {
		_, spans[i], outs[i] = w.start(ctx, m)
	}
	defer func() {
		if p := recover(); p != nil {
			for _, span := range spans {
				w.end(span, fmt.Errorf("panic: %v", p))
			}
			panic(p)
		}
	}()
	errs = w.batch.SendBatch(ctx, outs)
	for i, span := range spans {
		var err error
		switch {
		case len(errs) != len(ms):
			err = fmt.Errorf("SendBatch returned %d results for %d messages", len(errs), len(ms))
		default:
			err = errs[i]
		}
		w.end(span, err)
	}
	return errs
}

// start starts m's send span and returns its context and m with the span's
// trace context in a copy of its headers. When anything in it panics, or the
// headers it would make are not valid, it returns ctx and m as they came,
// and a span (perhaps nil) that end ends.
//
// It runs once per message: what does not change from one message to the
// next is built once (kindOf), Start's options are reused (startArgs), the
// message's id and attempt are built only for a span the sampler kept, and
// the W3C headers are read and written directly (tracecontext.go).
func (w *sender) start(ctx context.Context, m relay.Message) (sctx context.Context, span sendSpan, out relay.Message) {
	defer func() {
		if recover() != nil {
			sctx, out = ctx, m
		}
	}()
	prop := w.c.propagatorOf()
	w3c := isTraceContext(prop)
	k := w.kindOf(m.Type)
	a := startArgsPool.Get().(*startArgs)
	parent, opts := ctx, a.opts[:2]
	opts[1] = k.attrs
	var t traceHeaders
	if len(m.Headers) > 0 {
		// The producer's span, read into an empty context: a span the relay's
		// own ctx carries is no producer.
		var producer trace.SpanContext
		if w3c {
			t = readTraceHeaders(m.Headers)
			producer = parseTraceContext(t.parent, t.state)
		} else {
			producer = trace.SpanContextFromContext(prop.Extract(context.Background(), headerCarrier(m.Headers)))
		}
		if producer.IsValid() {
			if w.c.child {
				parent = trace.ContextWithRemoteSpanContext(ctx, producer)
			} else {
				a.link[0].SpanContext = producer
				opts = append(opts, a.withLink) // in a.opts: no allocation
			}
		}
	}
	sctx, span.Span = w.tracer.Start(parent, k.name, opts...)
	if span.recording = span.IsRecording(); span.recording {
		a.attrs[0] = semconv.MessagingMessageID(m.IdempotencyKey())
		a.attrs[1] = AttemptKey.Int(m.Attempts + 1)
		span.SetAttributes(a.attrs[:]...)
	}
	a.release()

	// The send span's context replaces the producer's in a copy of the
	// headers, whatever the case of the names the producer wrote, and the
	// producer's tracestate goes with its traceparent: it belongs to the
	// producer's trace, not to the send span's (which may have none). The
	// producer's other headers (its baggage too) travel. Headers the senders
	// would refuse are never handed over.
	var headers map[string]string
	var err error
	switch sc := span.SpanContext(); {
	case w3c && !sc.IsValid(): // no trace context to carry (a no-op tracer)
		return sctx, span, m
	case w3c:
		headers, err = withTraceContext(m.Headers, &t, sc)
	default:
		headers, err = injected(prop, sctx, m.Headers)
	}
	if err != nil { // too many, or too large, with the propagator's
		span.SetAttributes(attribute.String("relay.propagation.error", err.Error()))
		return sctx, span, m
	}
	out = m
	out.Headers = headers
	return sctx, span, out
}

// injected is a copy of h with what prop injects for sctx in place of the
// producer's headers of the same names, whatever their case.
func injected(prop propagation.TextMapPropagator, sctx context.Context, h map[string]string) (map[string]string, error) {
	set := &pairs{}
	prop.Inject(sctx, set)
	staleState := set.Get(traceparentHeader) != "" && set.Get(tracestateHeader) == ""
	headers := make(map[string]string, len(h)+set.n)
	for name, value := range h {
		if !set.named(name) && !(staleState && strings.EqualFold(name, tracestateHeader)) {
			headers[name] = value
		}
	}
	for _, kv := range set.all() {
		headers[kv[0]] = kv[1]
	}
	return headers, relay.ValidateHeaders(headers)
}

// startArgs are a send span's options and message attributes, reused from
// send to send: the SDK copies what it keeps before Start and SetAttributes
// return, so the link and the attributes cost no allocation of ours.
type startArgs struct {
	opts     [3]trace.SpanStartOption // the kind, the type's attributes, withLink
	link     [1]trace.Link
	withLink trace.SpanStartOption // over link
	attrs    [2]attribute.KeyValue // the message's id and attempt
}

var startArgsPool = sync.Pool{New: func() any {
	a := &startArgs{}
	a.opts[0] = trace.WithSpanKind(trace.SpanKindProducer)
	a.withLink = trace.WithLinks(a.link[:]...)
	return a
}}

// release puts a back in startArgsPool, keeping nothing of the message's.
func (a *startArgs) release() {
	a.opts[1], a.opts[2] = nil, nil
	a.link[0] = trace.Link{}
	a.attrs = [2]attribute.KeyValue{}
	startArgsPool.Put(a)
}

// spanKind is what the send spans of one message type share: their name and
// the attributes that name the destination, built once.
type spanKind struct {
	typ   string
	name  string
	attrs trace.SpanStartOption
}

// kindOf returns typ's spanKind: the last one built, which for a sender of
// one type is every message's, or a new one.
func (w *sender) kindOf(typ string) *spanKind {
	if k := w.kind.Load(); k != nil && k.typ == typ {
		return k
	}
	k := &spanKind{typ: typ, name: operationName + " " + typ, attrs: trace.WithAttributes(
		semconv.MessagingSystemKey.String(w.c.system),
		semconv.MessagingDestinationName(typ),
		semconv.MessagingOperationName(operationName),
		semconv.MessagingOperationTypeSend,
	)}
	w.kind.Store(k)
	return k
}

// pairs is a carrier for what a propagator injects: a header or two, kept in
// the carrier itself rather than in a map or a slice of their own.
type pairs struct {
	n    int
	kv   [2][2]string
	more [][2]string // beyond two, for a propagator that sets more
}

// all is p's pairs, in the order they were first set.
func (p *pairs) all() [][2]string {
	if p.n <= len(p.kv) {
		return p.kv[:p.n]
	}
	return p.more
}

// named reports whether name is, whatever its case, one of p's names: a
// header of the producer's trace context, which the send span's replaces.
func (p *pairs) named(name string) bool {
	for _, kv := range p.all() {
		if strings.EqualFold(name, kv[0]) {
			return true
		}
	}
	return false
}

func (p *pairs) Get(key string) string {
	for _, kv := range p.all() {
		if kv[0] == key {
			return kv[1]
		}
	}
	return ""
}

func (p *pairs) Set(key, value string) {
	all := p.all()
	for i := range all {
		if all[i][0] == key {
			all[i][1] = value
			return
		}
	}
	switch {
	case p.n < len(p.kv):
		p.kv[p.n] = [2]string{key, value}
	case p.n == len(p.kv):
		p.more = append(append(make([][2]string, 0, 2*len(p.kv)), p.kv[:]...), [2]string{key, value})
	default:
		p.more = append(p.more, [2]string{key, value})
	}
	p.n++
}

func (p *pairs) Keys() []string {
	keys := make([]string, 0, p.n)
	for _, kv := range p.all() {
		keys = append(keys, kv[0])
	}
	return keys
}

// end records err's outcome on a recorded span, and hands it to be ended off
// the Send's path (ender.go); a span that does not record has nothing to
// export, and ends here. A panic inside costs the span only.
func (w *sender) end(span sendSpan, err error) {
	if span.Span == nil {
		return
	}
	defer func() { _ = recover() }()
	if !span.recording {
		span.End()
		return
	}
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
		span.SetAttributes(semconv.ErrorTypeKey.String(errorType(err)))
	}
	spanEnds.end(span.Span)
}

// errorType is a failure's error.type: few values, as the conventions ask.
func errorType(err error) string {
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(err, context.Canceled):
		return "canceled"
	case relay.IsPermanent(err):
		return "permanent"
	default:
		return semconv.ErrorTypeOther.Value.AsString()
	}
}
