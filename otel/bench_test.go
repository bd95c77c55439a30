package otelrelay_test

// The cost of the instrumentation: a drain of benchRows rows with
// relay.DefaultConfig() (Default) and with GroupOutcomes 100 (G100, as
// relaybench's g100), and a sender that does nothing, bare and with
// WrapSender (the SDK's tracer, every span sampled, or one trace in a
// hundred in the -1pct runs, batched to an exporter that drops them) and
// NewObserver (the SDK's meter), in the same run and interleaved, iteration
// by iteration, so that the machine's load weighs on both alike; a third drain, interleaved too, makes only the SDK's span around
// each send (floorSender), whose floor-ratio is the best an instrumented
// drain can reach with that provider:
//
//	go test -run xxx -bench DrainCost -benchtime 40x ./

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/xadm/relay"
	"github.com/xadm/relay/internal/testkit/pgserver"
	otelrelay "github.com/xadm/relay/otel"
)

const benchRows = 2000

// benchNoop is a sender that does nothing.
type benchNoop struct{}

func (benchNoop) Type() string                              { return "bench" }
func (benchNoop) Send(context.Context, relay.Message) error { return nil }

// benchDrain is one side of the comparison: its table and relay.
type benchDrain struct {
	pool  *pgxpool.Pool
	table string
	r     *relay.Relay
}

func newBenchDrain(b *testing.B, pool *pgxpool.Pool, name string, groupOutcomes int, wrap func(relay.Sender) relay.Sender, obs relay.Observer) *benchDrain {
	b.Helper()
	if err := relay.CreateTable(context.Background(), pool, name); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+pgx.Identifier{name}.Sanitize())
	})
	cfg := relay.DefaultConfig()
	cfg.AppName, cfg.Table = name, name
	cfg.Logger = slog.New(slog.DiscardHandler)
	cfg.Observer = obs
	cfg.GroupOutcomes = groupOutcomes
	r, err := relay.New(pool, cfg, wrap(benchNoop{}))
	if err != nil {
		b.Fatal(err)
	}
	return &benchDrain{pool: pool, table: name, r: r}
}

// load empties the table and writes benchRows PENDING rows of distinct keys,
// each with a producer's traceparent, as otelrelay.Enqueue leaves them. The
// table starts empty each time, so that every drain of a run reads a table in
// the same state: kept, the three tables' histories grow apart (their dead
// index entries, and when autovacuum reaches each), and that moved the ratio
// by more than the instrumentation did (G100 at one in a hundred read 0.86,
// 1.05 and 1.41 in three runs of one afternoon).
func (d *benchDrain) load(b *testing.B) {
	b.Helper()
	table := pgx.Identifier{d.table}.Sanitize()
	if _, err := d.pool.Exec(context.Background(), `TRUNCATE `+table); err != nil {
		b.Fatal(err)
	}
	_, err := d.pool.Exec(context.Background(), `INSERT INTO `+table+`
		(type, natural_key, payload, headers) SELECT 'bench', 'key-' || i || '-' || clock_timestamp(), jsonb_build_object('n', i),
		jsonb_build_object('traceparent', '00-' || md5(i::text || clock_timestamp()) || '-' || substr(md5(i::text), 1, 16) || '-01')
		FROM generate_series(1, $1) i`, benchRows)
	if err != nil {
		b.Fatal(err)
	}
}

// drain runs passes until every row loaded is processed, and returns how long it took.
func (d *benchDrain) drain(b *testing.B) time.Duration {
	b.Helper()
	start := time.Now()
	for done := 0; done < benchRows; {
		n, err := d.r.Run(context.Background())
		if err != nil || n == 0 {
			b.Fatalf("pass: %d rows, %v, after %d of %d", n, err, done, benchRows)
		}
		done += n
	}
	return time.Since(start)
}

func BenchmarkDrainCost(b *testing.B) {
	all, onePct := sdktrace.AlwaysSample(), sdktrace.TraceIDRatioBased(0.01)
	b.Run("Default", func(b *testing.B) { benchDrainCost(b, 0, all) })
	b.Run("G100", func(b *testing.B) { benchDrainCost(b, 100, all) })
	b.Run("Default-1pct", func(b *testing.B) { benchDrainCost(b, 0, onePct) })
	b.Run("G100-1pct", func(b *testing.B) { benchDrainCost(b, 100, onePct) })
}

func benchDrainCost(b *testing.B, groupOutcomes int, sampler sdktrace.Sampler) {
	name := pgserver.Name(b)
	pool := pgserver.Pool(b, pgserver.Shared().URL, name, 8)

	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sampler),
		sdktrace.WithBatcher(tracetest.NewNoopExporter()))
	b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	b.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	obs, err := otelrelay.NewObserver(otelrelay.WithMeterProvider(mp))
	if err != nil {
		b.Fatal(err)
	}
	bare := newBenchDrain(b, pool, name+"_bare", groupOutcomes, func(s relay.Sender) relay.Sender { return s }, nil)
	traced := newBenchDrain(b, pool, name+"_otel", groupOutcomes, func(s relay.Sender) relay.Sender {
		return otelrelay.WrapSender(s, otelrelay.WithTracerProvider(tp), otelrelay.WithPropagator(propagation.TraceContext{}))
	}, obs)
	floor := newBenchDrain(b, pool, name+"_floor", groupOutcomes, func(s relay.Sender) relay.Sender {
		return newFloorSender(s, tp)
	}, nil)

	drains := []*benchDrain{bare, traced, floor}
	for _, d := range drains { // warm up: connections open, statements prepared
		d.load(b)
		d.drain(b)
	}
	took := make([]time.Duration, len(drains))
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		for _, d := range drains {
			d.load(b)
		}
		b.StartTimer()
		for j := range drains { // each goes first, second and last in turn
			k := (i + j) % len(drains)
			took[k] += drains[k].drain(b)
		}
	}
	b.StopTimer()
	msgs := float64(b.N * benchRows)
	b.ReportMetric(msgs/took[0].Seconds(), "bare-msgs/s")
	b.ReportMetric(msgs/took[1].Seconds(), "otel-msgs/s")
	b.ReportMetric(took[0].Seconds()/took[1].Seconds(), "ratio")
	b.ReportMetric(took[0].Seconds()/took[2].Seconds(), "floor-ratio")
}

// floorSender is the floor under the instrumentation's cost: around each
// send, only the span the SDK must make for it — the same provider, its kind,
// its six attributes and its link, all built ahead — with no propagation and
// no Observer. The drain with it is as fast as an instrumented one can be.
type floorSender struct {
	next   relay.Sender
	tracer trace.Tracer
	opts   []trace.SpanStartOption
}

func newFloorSender(next relay.Sender, tp trace.TracerProvider) *floorSender {
	producer := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(),
		propagation.MapCarrier{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}))
	return &floorSender{next: next, tracer: tp.Tracer("floor"), opts: []trace.SpanStartOption{
		trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(semconv.MessagingSystemKey.String("relay"), semconv.MessagingDestinationName("bench"),
			semconv.MessagingOperationName("send"), semconv.MessagingOperationTypeSend,
			semconv.MessagingMessageID("42"), otelrelay.AttemptKey.Int(1)),
		trace.WithLinks(trace.Link{SpanContext: producer}),
	}}
}

func (f *floorSender) Type() string { return f.next.Type() }

func (f *floorSender) Send(ctx context.Context, m relay.Message) error {
	ctx, span := f.tracer.Start(ctx, "send bench", f.opts...)
	defer span.End()
	return f.next.Send(ctx, m)
}
