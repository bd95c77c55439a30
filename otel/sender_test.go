package otelrelay_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/xadm/relay"
	otelrelay "github.com/xadm/relay/otel"
)

// produce writes one message of type "order" under a producer span and
// returns that span's context.
func (w *world) produce(t *testing.T, key string) trace.SpanContext {
	t.Helper()
	ctx, span := w.tp.Tracer("producer").Start(context.Background(), "POST /orders", trace.WithSpanKind(trace.SpanKindServer))
	_, err := otelrelay.Enqueue(ctx, w.pool, w.table,
		relay.Outgoing{Type: "order", Key: key, Payload: []byte(`{"total": 3}`), Headers: map[string]string{"X-Tenant": "acme"}},
		otelrelay.WithPropagator(w.prop))
	require.NoError(t, err)
	span.End()
	return span.SpanContext()
}

func (w *world) httpSender(t *testing.T, url string) relay.Sender {
	t.Helper()
	s, err := relay.NewHTTPSender(relay.HTTPSenderConfig{Type: "order", URL: relay.URLWithKey(url)})
	require.NoError(t, err)
	return s
}

// TestSendSpanLinkedToProducer: by default the relay's send span starts a
// trace of its own, linked to the producer's span, and the receiver's span
// is its child, with the messaging conventions' attributes.
func TestSendSpanLinkedToProducer(t *testing.T) {
	t.Parallel()
	w := setup(t)
	rc := w.receiver(t)
	producer := w.produce(t, "o1")

	r, err := relay.New(w.pool, w.cfg, otelrelay.WrapSender(w.httpSender(t, rc.URL),
		otelrelay.WithTracerProvider(w.tp), otelrelay.WithPropagator(w.prop)))
	require.NoError(t, err)
	n, err := r.Run(context.Background())
	require.NoError(t, err)
	require.Equal(t, 1, n)

	send, got := w.span(t, "send order"), w.span(t, "PUT /orders")
	require.Equal(t, trace.SpanKindProducer, send.SpanKind())
	require.NotEqual(t, producer.TraceID(), send.SpanContext().TraceID(), "a trace of its own")
	require.False(t, send.Parent().IsValid())
	require.Len(t, send.Links(), 1)
	require.Equal(t, producer.SpanID(), send.Links()[0].SpanContext.SpanID())
	require.Equal(t, producer.TraceID(), send.Links()[0].SpanContext.TraceID())
	require.Equal(t, send.SpanContext().SpanID(), got.Parent().SpanID(), "the receiver continues the send span")
	require.Equal(t, send.SpanContext().TraceID(), got.SpanContext().TraceID())

	a := attrs(send)
	require.Equal(t, "relay", a["messaging.system"].AsString())
	require.Equal(t, "order", a["messaging.destination.name"].AsString())
	require.Equal(t, "send", a["messaging.operation.name"].AsString())
	require.Equal(t, "send", a["messaging.operation.type"].AsString())
	require.Equal(t, rc.got()[0].Get("Idempotency-Key"), a["messaging.message.id"].AsString())
	require.Equal(t, int64(1), a["relay.message.attempt"].AsInt64())
	require.Equal(t, codes.Unset, send.Status().Code)
	require.Equal(t, "acme", rc.got()[0].Get("X-Tenant"), "the producer's other headers travel too")
}

// TestSendSpanChildOfProducer: with AsChild, the request, the send and the
// receiver's handling are one trace.
func TestSendSpanChildOfProducer(t *testing.T) {
	t.Parallel()
	w := setup(t)
	rc := w.receiver(t)
	producer := w.produce(t, "o1")

	r, err := relay.New(w.pool, w.cfg, otelrelay.WrapSender(w.httpSender(t, rc.URL),
		otelrelay.WithTracerProvider(w.tp), otelrelay.WithPropagator(w.prop), otelrelay.AsChild()))
	require.NoError(t, err)
	_, err = r.Run(context.Background())
	require.NoError(t, err)

	send, got := w.span(t, "send order"), w.span(t, "PUT /orders")
	require.Equal(t, producer.TraceID(), send.SpanContext().TraceID())
	require.Equal(t, producer.SpanID(), send.Parent().SpanID())
	require.True(t, send.Parent().IsRemote())
	require.Empty(t, send.Links())
	require.Equal(t, producer.TraceID(), got.SpanContext().TraceID())
	require.Equal(t, send.SpanContext().SpanID(), got.Parent().SpanID())
}

// TestSendSpanOfAFailure: a failed send's span has the error, error.type,
// and the attempt; its retry is a span of its own.
func TestSendSpanOfAFailure(t *testing.T) {
	t.Parallel()
	w := setup(t)
	rc := w.receiver(t)
	rc.answer(http.StatusServiceUnavailable)
	w.produce(t, "retried")
	sender := otelrelay.WrapSender(w.httpSender(t, rc.URL), otelrelay.WithTracerProvider(w.tp), otelrelay.WithPropagator(w.prop))
	r, err := relay.New(w.pool, w.cfg, sender)
	require.NoError(t, err)
	_, err = r.Run(context.Background())
	require.NoError(t, err)
	rc.answer(http.StatusBadRequest)
	_, err = r.Run(context.Background())
	require.NoError(t, err)

	spans := w.ended(t)
	var sends []map[string]string
	for _, s := range spans {
		if s.Name() == "send order" {
			require.Equal(t, codes.Error, s.Status().Code)
			a := attrs(s)
			sends = append(sends, map[string]string{"error.type": a["error.type"].AsString(), "attempt": a["relay.message.attempt"].String()})
			require.NotEmpty(t, s.Events(), "the error is recorded")
		}
	}
	require.Equal(t, []map[string]string{{"error.type": "_OTHER", "attempt": "1"}, {"error.type": "permanent", "attempt": "2"}}, sends)
}

// panicky is a propagator that panics at every call.
type panicky struct{}

func (panicky) Inject(context.Context, propagation.TextMapCarrier) { panic("inject") }
func (panicky) Extract(context.Context, propagation.TextMapCarrier) context.Context {
	panic("extract")
}
func (panicky) Fields() []string { panic("fields") }

// TestInstrumentationPanicsCostTheSpanOnly: a propagator that panics costs
// the trace context, never the message: it is written, and delivered, with
// its headers as they were.
func TestInstrumentationPanicsCostTheSpanOnly(t *testing.T) {
	t.Parallel()
	w := setup(t)
	rc := w.receiver(t)
	_, err := otelrelay.Enqueue(context.Background(), w.pool, w.table,
		relay.Outgoing{Type: "order", Key: "k", Payload: []byte(`{}`), Headers: map[string]string{"X-A": "1"}},
		otelrelay.WithPropagator(panicky{}))
	require.NoError(t, err)
	r, err := relay.New(w.pool, w.cfg, otelrelay.WrapSender(w.httpSender(t, rc.URL),
		otelrelay.WithTracerProvider(w.tp), otelrelay.WithPropagator(panicky{})))
	require.NoError(t, err)
	n, err := r.Run(context.Background())
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Len(t, rc.got(), 1)
	require.Equal(t, "1", rc.got()[0].Get("X-A"))
	require.Empty(t, rc.got()[0].Get("Traceparent"))
	var status string
	require.NoError(t, w.pool.QueryRow(context.Background(), "SELECT status FROM "+w.table).Scan(&status))
	require.Equal(t, "SENT", status)
}

// batchRecorder is a BatchSender that records what it got, and panics when asked.
type batchRecorder struct {
	got   []relay.Message
	panic bool
}

func (b *batchRecorder) Type() string { return "order" }
func (b *batchRecorder) Send(ctx context.Context, m relay.Message) error {
	return b.SendBatch(ctx, []relay.Message{m})[0]
}
func (b *batchRecorder) SendBatch(_ context.Context, ms []relay.Message) []error {
	if b.panic {
		panic("the broker client broke")
	}
	b.got = append(b.got, ms...)
	return make([]error, len(ms))
}

// TestBatchSenderStaysOne: a wrapped BatchSender is still one, with one span
// per message, each message carrying its own span's context; the wrapped
// sender's panic reaches the relay as without the wrapper, and ends the spans
// with the error.
func TestBatchSenderStaysOne(t *testing.T) {
	t.Parallel()
	w := setup(t)
	for _, k := range []string{"a", "b", "c"} {
		w.produce(t, k)
	}
	inner := &batchRecorder{}
	wrapped := otelrelay.WrapSender(inner, otelrelay.WithTracerProvider(w.tp), otelrelay.WithPropagator(w.prop))
	_, ok := wrapped.(relay.BatchSender)
	require.True(t, ok)
	r, err := relay.New(w.pool, w.cfg, wrapped)
	require.NoError(t, err)
	n, err := r.Run(context.Background())
	require.NoError(t, err)
	require.Equal(t, 3, n)
	require.Len(t, inner.got, 3)
	ids := map[trace.SpanID]bool{}
	for _, m := range inner.got {
		sc := trace.SpanContextFromContext(w.prop.Extract(context.Background(), propagation.MapCarrier(m.Headers)))
		require.True(t, sc.IsValid())
		ids[sc.SpanID()] = true
	}
	sends := 0
	for _, s := range w.ended(t) {
		if s.Name() == "send order" {
			sends++
			require.True(t, ids[s.SpanContext().SpanID()], "each message carries its own send span")
		}
	}
	require.Equal(t, 3, sends)

	// The panic.
	w.produce(t, "d")
	inner.panic = true
	_, err = r.Run(context.Background())
	require.NoError(t, err)
	var status, lastErr string
	require.NoError(t, w.pool.QueryRow(context.Background(), "SELECT status, last_error FROM "+w.table+" WHERE natural_key = 'd'").Scan(&status, &lastErr))
	require.Equal(t, "ERROR", status)
	require.Contains(t, lastErr, "the broker client broke")
	var failed int
	for _, s := range w.ended(t) {
		if s.Name() == "send order" && s.Status().Code == codes.Error {
			failed++
			require.Contains(t, s.Status().Description, "the broker client broke")
		}
	}
	require.Equal(t, 1, failed)
}

// TestJVMTableStillDelivers: a table made by the JVM's migration, without
// the headers column, delivers through the wrapped sender as before (the
// send span has no producer to link), and otelrelay.Enqueue into it fails
// naming the column.
func TestJVMTableStillDelivers(t *testing.T) {
	t.Parallel()
	w := setup(t)
	rc := w.receiver(t)
	jvm := w.table + "_jvm"
	_, err := w.pool.Exec(context.Background(), `CREATE TABLE `+jvm+` (
    id bigserial PRIMARY KEY, direction varchar(3), type varchar(100), natural_key varchar(255), payload jsonb,
    status varchar(20), attempts integer, last_error varchar(255), created_at timestamp, updated_at timestamp, sent_at timestamp)`)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = w.pool.Exec(context.Background(), "DROP TABLE "+jvm) })
	_, err = w.pool.Exec(context.Background(), `INSERT INTO `+jvm+` (direction, type, natural_key, payload, status, attempts, created_at, updated_at)
VALUES ('OUT', 'order', 'from-the-jvm', '{}', 'PENDING', 0, now(), now())`)
	require.NoError(t, err)

	ctx, span := w.tp.Tracer("producer").Start(context.Background(), "POST /orders")
	_, err = otelrelay.Enqueue(ctx, w.pool, jvm, relay.Outgoing{Type: "order", Key: "go", Payload: []byte(`{}`)},
		otelrelay.WithPropagator(w.prop))
	span.End()
	require.ErrorContains(t, err, "ADD COLUMN IF NOT EXISTS headers jsonb")

	cfg := w.cfg
	cfg.Table = jvm
	r, err := relay.New(w.pool, cfg, otelrelay.WrapSender(w.httpSender(t, rc.URL),
		otelrelay.WithTracerProvider(w.tp), otelrelay.WithPropagator(w.prop)))
	require.NoError(t, err)
	n, err := r.Run(context.Background())
	require.NoError(t, err)
	require.Equal(t, 1, n)
	send, got := w.span(t, "send order"), w.span(t, "PUT /orders")
	require.Empty(t, send.Links())
	require.Equal(t, send.SpanContext().SpanID(), got.Parent().SpanID())
	var status string
	require.NoError(t, w.pool.QueryRow(context.Background(), "SELECT status FROM "+jvm).Scan(&status))
	require.Equal(t, "SENT", status)
}

// TestSendReplacesProducerContextWhateverItsCase: the send span's trace
// context replaces the producer's in the headers the sender gets, even when
// the producer wrote the names in another case; the producer's tracestate
// goes with its trace (dropped from a linked send span's headers, inherited
// by a child's), the other headers travel (its baggage too, whatever the
// propagator), and the message the relay holds
// keeps its own. The same with propagation.TraceContext, which the wrapper
// reads and writes directly, and with a propagator it knows only by its
// interface.
func TestSendReplacesProducerContextWhateverItsCase(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  string
		prop  propagation.TextMapPropagator
		child bool
	}{
		{"TraceContext", propagation.TraceContext{}, false},
		{"TraceContextChild", propagation.TraceContext{}, true},
		{"Composite", propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}), false},
		{"CompositeChild", propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}), true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			w := setup(t)
			var got relay.Message
			opts := []otelrelay.Option{otelrelay.WithTracerProvider(w.tp), otelrelay.WithPropagator(c.prop)}
			if c.child {
				opts = append(opts, otelrelay.AsChild())
			}
			s := otelrelay.WrapSender(relay.SenderFunc("order", func(_ context.Context, m relay.Message) error {
				got = m
				return nil
			}), opts...)
			old := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
			in := relay.Message{ID: 7, Type: "order", Key: "k", Payload: []byte(`{}`),
				Headers: map[string]string{"TraceParent": old, "TraceState": "congo=t61rcWkgMzE", "X-Tenant": "acme", "baggage": "tier=gold"}}
			require.NoError(t, s.Send(context.Background(), in))

			send := w.span(t, "send order")
			want := map[string]string{"X-Tenant": "acme", "baggage": "tier=gold", "traceparent": "00-" + send.SpanContext().TraceID().String() + "-" +
				send.SpanContext().SpanID().String() + "-01"}
			if c.child {
				require.Equal(t, "4bf92f3577b34da6a3ce929d0e0e4736", send.SpanContext().TraceID().String())
				want["tracestate"] = "congo=t61rcWkgMzE"
			} else {
				require.Len(t, send.Links(), 1)
				require.Equal(t, "congo=t61rcWkgMzE", send.Links()[0].SpanContext.TraceState().String(), "the link keeps the producer's tracestate")
			}
			require.Equal(t, want, got.Headers)
			require.Equal(t, map[string]string{"TraceParent": old, "TraceState": "congo=t61rcWkgMzE", "X-Tenant": "acme", "baggage": "tier=gold"}, in.Headers,
				"the relay's copy is left alone")
		})
	}
}

// hangingExporter is a span exporter whose export does not return until
// released: a collector that stopped answering, behind a synchronous
// span processor (sdktrace.WithSyncer).
type hangingExporter struct {
	release chan struct{}
	mu      sync.Mutex
	ends    []time.Time // of the spans exported
}

func (e *hangingExporter) ExportSpans(_ context.Context, spans []sdktrace.ReadOnlySpan) error {
	<-e.release
	e.mu.Lock()
	for _, s := range spans {
		e.ends = append(e.ends, s.EndTime())
	}
	e.mu.Unlock()
	return nil
}

func (e *hangingExporter) Shutdown(context.Context) error { return nil }

// TestHangingExporterCostsSpansNotDeliveries: a tracer whose exporter hangs
// in span.End, synchronously, leaves every send as it would be without the
// wrapper: each message sent once, recorded SENT at its first attempt. The
// spans end, and are exported, once the exporter answers again, each with
// the end its Send gave it.
func TestHangingExporterCostsSpansNotDeliveries(t *testing.T) {
	w := setup(t)
	exp := &hangingExporter{release: make(chan struct{})}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	released := sync.OnceFunc(func() { close(exp.release) })
	t.Cleanup(released) // before the provider's shutdown: cleanups run last first
	var mu sync.Mutex
	got := map[string]int{}
	inner := relay.SenderFunc("order", func(context.Context, relay.Message) error { return nil })
	counting := relay.SenderFunc("order", func(ctx context.Context, m relay.Message) error {
		mu.Lock()
		got[m.Key]++
		mu.Unlock()
		return inner.Send(ctx, m)
	})
	for _, k := range []string{"a", "b", "c"} {
		w.produce(t, k)
	}
	cfg := w.cfg
	cfg.SendTimeout = 500 * time.Millisecond
	cfg.MaxAttempts = 3
	r, err := relay.New(w.pool, cfg, otelrelay.WrapSender(counting, otelrelay.WithTracerProvider(tp), otelrelay.WithPropagator(w.prop)))
	require.NoError(t, err)
	n, err := r.Run(context.Background())
	require.NoError(t, err)
	require.Equal(t, 3, n)
	rows, err := w.pool.Query(context.Background(), "SELECT natural_key, status, attempts FROM "+w.table+" ORDER BY id")
	require.NoError(t, err)
	for rows.Next() {
		var key, status string
		var attempts int
		require.NoError(t, rows.Scan(&key, &status, &attempts))
		require.Equal(t, "SENT", status, "message %s", key)
		require.Zero(t, attempts, "message %s", key)
	}
	require.NoError(t, rows.Err())
	require.Equal(t, map[string]int{"a": 1, "b": 1, "c": 1}, got)

	sent := time.Now()
	released()
	require.NoError(t, otelrelay.Flush(context.Background()))
	exp.mu.Lock()
	defer exp.mu.Unlock()
	require.Len(t, exp.ends, 3, "the send spans, exported once the exporter answered")
	for _, end := range exp.ends {
		require.True(t, end.Before(sent), "a span ends when its Send did (%v), not when the exporter answered (after %v)", end, sent)
	}
}

// TestUnsampledSendCarriesItsContext: a send the sampler leaves out records
// nothing, and still carries its span's context, so that the receiver keeps
// the decision (sampled flag 0): a trace of its own when linked, the
// producer's trace and tracestate as a child. With a tracer that makes no
// span context at all (a no-op one), the headers travel as they came.
func TestUnsampledSendCarriesItsContext(t *testing.T) {
	t.Parallel()
	producer := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	in := map[string]string{"traceparent": producer, "tracestate": "congo=t61rcWkgMzE", "X-Tenant": "acme"}
	for _, c := range []struct {
		name  string
		tp    trace.TracerProvider
		child bool
	}{
		{"Linked", nil, false},
		{"Child", nil, true},
		{"NoopTracer", noop.NewTracerProvider(), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			spans := tracetest.NewSpanRecorder()
			tp := c.tp
			if tp == nil {
				sdk := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample()), sdktrace.WithSpanProcessor(spans))
				t.Cleanup(func() { _ = sdk.Shutdown(context.Background()) })
				tp = sdk
			}
			opts := []otelrelay.Option{otelrelay.WithTracerProvider(tp), otelrelay.WithPropagator(propagation.TraceContext{})}
			if c.child {
				opts = append(opts, otelrelay.AsChild())
			}
			var got relay.Message
			s := otelrelay.WrapSender(relay.SenderFunc("order", func(_ context.Context, m relay.Message) error {
				got = m
				return nil
			}), opts...)
			require.NoError(t, s.Send(context.Background(), relay.Message{ID: 7, Type: "order", Key: "k", Payload: []byte(`{}`), Headers: in}))
			require.NoError(t, otelrelay.Flush(context.Background()))
			require.Empty(t, spans.Started())
			require.Empty(t, spans.Ended())
			if c.tp != nil {
				require.Equal(t, in, got.Headers)
				return
			}
			sc := propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier(got.Headers))
			send := trace.SpanContextFromContext(sc)
			require.True(t, send.IsValid())
			require.False(t, send.IsSampled(), "the receiver keeps the decision")
			require.NotEqual(t, "00f067aa0ba902b7", send.SpanID().String())
			require.Equal(t, "acme", got.Headers["X-Tenant"])
			if c.child {
				require.Equal(t, "4bf92f3577b34da6a3ce929d0e0e4736", send.TraceID().String())
				require.Equal(t, "congo=t61rcWkgMzE", got.Headers["tracestate"])
				require.Len(t, got.Headers, 3)
			} else {
				require.NotEqual(t, "4bf92f3577b34da6a3ce929d0e0e4736", send.TraceID().String())
				require.NotContains(t, got.Headers, "tracestate")
				require.Len(t, got.Headers, 2)
			}
			require.Equal(t, producer, in["traceparent"], "the relay's copy is left alone")
		})
	}
}

// TestTooManyHeadersWithTheContext: a message whose headers, with the send
// span's context, would break the relay's rules (more than HeadersMax, or
// more than HeadersBytesMax) goes as it came, and its span says why.
func TestTooManyHeadersWithTheContext(t *testing.T) {
	t.Parallel()
	many := map[string]string{}
	for i := range relay.HeadersMax {
		many[fmt.Sprintf("X-H%d", i)] = "v"
	}
	large := map[string]string{"X-Large": strings.Repeat("v", relay.HeadersBytesMax-len("X-Large")-10)}
	for name, headers := range map[string]map[string]string{"Many": many, "Large": large} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			spans := tracetest.NewSpanRecorder()
			tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
			t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
			var got relay.Message
			s := otelrelay.WrapSender(relay.SenderFunc("order", func(_ context.Context, m relay.Message) error {
				got = m
				return nil
			}), otelrelay.WithTracerProvider(tp), otelrelay.WithPropagator(propagation.TraceContext{}))
			require.NoError(t, s.Send(context.Background(), relay.Message{ID: 7, Type: "order", Key: "k", Payload: []byte(`{}`), Headers: headers}))
			require.Equal(t, headers, got.Headers)
			require.NoError(t, otelrelay.Flush(context.Background()))
			require.Len(t, spans.Ended(), 1)
			require.Contains(t, attrs(spans.Ended()[0])["relay.propagation.error"].AsString(), "more than Headers")
		})
	}
}
