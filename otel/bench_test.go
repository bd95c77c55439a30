package otelrelay_test

// The cost of the instrumentation: a drain of benchRows rows with
// relay.DefaultConfig() (Default) and with GroupOutcomes 100 (G100, as
// relaybench's g100), and a sender that does nothing, bare and with
// WrapSender (the SDK's tracer, every span sampled, batched to an exporter
// that drops them) and NewObserver (the SDK's meter), in the same run and
// interleaved, iteration by iteration, so that the machine's load weighs on
// both alike:
//
//	go test -run xxx -bench DrainCost -benchtime 20x ./

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

	"github.com/xadm/relay"
	"github.com/xadm/relay/internal/pgserver"
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

// load writes benchRows PENDING rows of distinct keys, each with a producer's
// traceparent, as otelrelay.Enqueue leaves them.
func (d *benchDrain) load(b *testing.B) {
	b.Helper()
	_, err := d.pool.Exec(context.Background(), `INSERT INTO `+pgx.Identifier{d.table}.Sanitize()+`
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
	b.Run("Default", func(b *testing.B) { benchDrainCost(b, 0) })
	b.Run("G100", func(b *testing.B) { benchDrainCost(b, 100) })
}

func benchDrainCost(b *testing.B, groupOutcomes int) {
	name := pgserver.Name(b)
	pool := pgserver.Pool(b, pgserver.Shared().URL, name, 8)

	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()),
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

	for _, d := range []*benchDrain{bare, traced} { // warm up: connections open, statements prepared
		d.load(b)
		d.drain(b)
	}
	var bareTime, tracedTime time.Duration
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		bare.load(b)
		traced.load(b)
		b.StartTimer()
		if i%2 == 0 {
			bareTime += bare.drain(b)
			tracedTime += traced.drain(b)
		} else {
			tracedTime += traced.drain(b)
			bareTime += bare.drain(b)
		}
	}
	b.StopTimer()
	msgs := float64(b.N * benchRows)
	b.ReportMetric(msgs/bareTime.Seconds(), "bare-msgs/s")
	b.ReportMetric(msgs/tracedTime.Seconds(), "otel-msgs/s")
	b.ReportMetric(bareTime.Seconds()/tracedTime.Seconds(), "ratio")
}
