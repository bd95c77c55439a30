package e2e_test

import (
	"context"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/xadm/relay"
	"github.com/xadm/relay/internal/testkit/pgserver"
	"github.com/xadm/relay/kafka"
	"github.com/xadm/relay/natsjs"
	otelrelay "github.com/xadm/relay/otel"
)

// TestMain gets a real PostgreSQL and fails, never skips, when none can be had.
func TestMain(m *testing.M) { os.Exit(pgserver.Run(m, "RELAY_TEST_DATABASE_URL")) }

// waitLimit bounds every wait on a condition; a passing test never waits this long.
const waitLimit = 90 * time.Second

// world is one test's outbox, tracer and propagator.
type world struct {
	table string
	relay func(s relay.Sender) *relay.Relay
	spans *tracetest.SpanRecorder
	tp    *sdktrace.TracerProvider
	prop  propagation.TextMapPropagator
	// producer is the span of the request that wrote the message.
	producer trace.SpanContext
}

// setup writes one message of type typ under a producer span, with a header
// of the producer's own beside the trace context.
func setup(t *testing.T, typ string, opts ...otelrelay.Option) *world {
	t.Helper()
	name := pgserver.Name(t)
	pool := pgserver.Pool(t, pgserver.Shared().URL, name, 8)
	ctx := context.Background()
	require.NoError(t, relay.CreateTable(ctx, pool, name))
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+pgx.Identifier{name}.Sanitize())
	})
	w := &world{table: name, spans: tracetest.NewSpanRecorder(), prop: propagation.TraceContext{}}
	w.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(w.spans))
	t.Cleanup(func() { _ = w.tp.Shutdown(context.Background()) })

	pctx, span := w.tp.Tracer("producer").Start(ctx, "POST /orders", trace.WithSpanKind(trace.SpanKindServer))
	_, err := otelrelay.Enqueue(pctx, pool, name, relay.Outgoing{Type: typ, Key: "order-1", Payload: []byte(`{"total": 3}`),
		Headers: map[string]string{"X-Tenant": "acme"}}, otelrelay.WithPropagator(w.prop))
	require.NoError(t, err)
	span.End()
	w.producer = span.SpanContext()

	cfg := relay.DefaultConfig()
	cfg.AppName, cfg.Table = name, name
	cfg.SendTimeout = waitLimit
	cfg.Logger = slog.New(slog.DiscardHandler)
	opts = append([]otelrelay.Option{otelrelay.WithTracerProvider(w.tp), otelrelay.WithPropagator(w.prop)}, opts...)
	w.relay = func(s relay.Sender) *relay.Relay {
		r, err := relay.New(pool, cfg, otelrelay.WrapSender(s, opts...))
		require.NoError(t, err)
		return r
	}
	return w
}

// deliver runs one pass of r, which must deliver the one message.
func deliver(t *testing.T, r *relay.Relay) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	n, err := r.Run(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
}

// consumed continues the trace carried by a consumer's headers in a span of
// kind consumer, as the consumer's own instrumentation would, and checks the
// span tree: the consumer's span is a child of the relay's send span, which
// is linked to the producer's span (or, with child, its child).
func (w *world) consumed(t *testing.T, headers propagation.TextMapCarrier, system string, child bool) {
	t.Helper()
	ctx := w.prop.Extract(context.Background(), headers)
	_, span := w.tp.Tracer("consumer").Start(ctx, "process order", trace.WithSpanKind(trace.SpanKindConsumer))
	span.End()

	var send, got sdktrace.ReadOnlySpan
	require.NoError(t, otelrelay.Flush(context.Background())) // send spans end off the send's path
	for _, s := range w.spans.Ended() {
		switch s.Name() {
		case "send order":
			send = s
		case "process order":
			got = s
		}
	}
	require.NotNil(t, send, "the relay's send span")
	require.NotNil(t, got)
	require.Equal(t, trace.SpanKindProducer, send.SpanKind())
	require.Equal(t, send.SpanContext().TraceID(), got.SpanContext().TraceID())
	require.Equal(t, send.SpanContext().SpanID(), got.Parent().SpanID(), "the consumer continues the send span")
	if child {
		require.Equal(t, w.producer.TraceID(), send.SpanContext().TraceID(), "one trace, from the request to the consumer")
		require.Equal(t, w.producer.SpanID(), send.Parent().SpanID())
	} else {
		require.Len(t, send.Links(), 1)
		require.Equal(t, w.producer.SpanID(), send.Links()[0].SpanContext.SpanID())
	}
	var gotSystem string
	for _, kv := range send.Attributes() {
		if kv.Key == "messaging.system" {
			gotSystem = kv.Value.AsString()
		}
	}
	require.Equal(t, system, gotSystem)
	require.Equal(t, "acme", headers.Get("X-Tenant"), "the producer's own header travels too")
}

// recordHeaders reads a Kafka record's headers as a carrier.
type recordHeaders []kgo.RecordHeader

func (h recordHeaders) Get(key string) string {
	for _, x := range h {
		if x.Key == key {
			return string(x.Value)
		}
	}
	return ""
}
func (h recordHeaders) Set(string, string) {}
func (h recordHeaders) Keys() []string {
	keys := make([]string, len(h))
	for i, x := range h {
		keys[i] = x.Key
	}
	return keys
}

// natsHeaders reads a NATS message's headers as a carrier. NATS header names
// are case-sensitive, and the relay's NATS sender keeps them as the producer
// wrote them ("traceparent"), so it looks them up as they are, not as
// propagation.HeaderCarrier does (it would ask for "Traceparent").
type natsHeaders nats.Header

func (h natsHeaders) Get(key string) string { return nats.Header(h).Get(key) }
func (h natsHeaders) Set(key, value string) { nats.Header(h).Set(key, value) }
func (h natsHeaders) Keys() []string {
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	return keys
}

// TestTraceThroughKafka: the record the relay produced carries the send
// span's trace context in its headers, and a consumer's span continues it.
func TestTraceThroughKafka(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name  string
		child bool
	}{{"Linked", false}, {"Child", true}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			cluster, err := kfake.NewCluster(kfake.SeedTopics(1, "orders"))
			require.NoError(t, err)
			t.Cleanup(cluster.Close)
			opts := []otelrelay.Option{otelrelay.WithSystem("kafka")}
			if c.child {
				opts = append(opts, otelrelay.AsChild())
			}
			w := setup(t, "order", opts...)
			s, err := kafka.NewSender(kafka.Config{Type: "order", Topic: "orders", Brokers: cluster.ListenAddrs(), Timeout: waitLimit})
			require.NoError(t, err)
			t.Cleanup(s.Close)
			deliver(t, w.relay(s))

			cl, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.ConsumeTopics("orders"),
				kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
			require.NoError(t, err)
			defer cl.Close()
			ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
			defer cancel()
			var recs []*kgo.Record
			for len(recs) == 0 {
				fs := cl.PollFetches(ctx)
				require.NoError(t, ctx.Err())
				require.NoError(t, fs.Err())
				recs = append(recs, fs.Records()...)
			}
			require.Len(t, recs, 1)
			w.consumed(t, recordHeaders(recs[0].Headers), "kafka", c.child)
		})
	}
}

// TestTraceThroughNATS: the JetStream message the relay published carries
// the send span's trace context in its headers, and a consumer's span
// continues it.
func TestTraceThroughNATS(t *testing.T) {
	t.Parallel()
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true,
		StoreDir: t.TempDir(), NoLog: true, NoSigs: true})
	require.NoError(t, err)
	go srv.Start()
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	require.True(t, srv.ReadyForConnections(waitLimit))
	nc, err := nats.Connect(srv.ClientURL())
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"relay.>"}})
	require.NoError(t, err)

	w := setup(t, "order", otelrelay.WithSystem("nats"), otelrelay.AsChild())
	s, err := natsjs.New(js, natsjs.Config{Type: "order", Stream: "ORDERS"})
	require.NoError(t, err)
	deliver(t, w.relay(s))

	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	require.NoError(t, err)
	msg, err := cons.Next(jetstream.FetchMaxWait(waitLimit))
	require.NoError(t, err)
	w.consumed(t, natsHeaders(msg.Headers()), "nats", true)
	require.NotEmpty(t, msg.Headers().Get(jetstream.MsgIDHeader), "the sender's own headers are there too")
}
