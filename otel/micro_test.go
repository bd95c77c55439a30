package otelrelay_test

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/xadm/relay"
	otelrelay "github.com/xadm/relay/otel"
)

// BenchmarkSend is the instrumentation's own cost per message, without a
// database: one wrapped send and one Observer report. A recorded span ends on
// the module's goroutine: the sampled sends Flush every endEvery, inside the
// timer, so that their spans' ends are counted and none is dropped (read it
// with -cpu 1, where every goroutine's work is the loop's). Beside it,
// BenchmarkSpanFloor at the same sampling is the SDK's span alone.
//
//	go test -run xxx -bench 'Send$|SpanFloor' -benchmem -cpu 1 ./
func BenchmarkSend(b *testing.B) {
	b.Run("Sampled", func(b *testing.B) { benchSend(b, sdktrace.AlwaysSample()) })
	b.Run("Unsampled", func(b *testing.B) { benchSend(b, sdktrace.NeverSample()) })
}

// endEvery is how many sampled sends BenchmarkSend makes between Flushes.
const endEvery = 256

func benchSend(b *testing.B, sampler sdktrace.Sampler) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sampler), sdktrace.WithBatcher(tracetest.NewNoopExporter()))
	b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	obs, err := otelrelay.NewObserver(otelrelay.WithMeterProvider(mp))
	if err != nil {
		b.Fatal(err)
	}
	s := otelrelay.WrapSender(benchNoop{}, otelrelay.WithTracerProvider(tp), otelrelay.WithPropagator(propagation.TraceContext{}))
	m := relay.Message{ID: 42, Type: "bench", Key: "k", Payload: []byte(`{}`),
		Headers: map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}}
	b.ReportAllocs()
	n := 0
	for b.Loop() {
		_ = s.Send(context.Background(), m)
		obs.MessageDone(relay.MessageReport{ID: 42, Type: "bench", Outcome: relay.OutcomeSent})
		if n++; n%endEvery == 0 {
			_ = otelrelay.Flush(context.Background())
		}
	}
	_ = otelrelay.Flush(context.Background())
}

// BenchmarkSpanFloor is the SDK's own cost per span with the same provider as
// BenchmarkSend (batched to an exporter that drops them): Bare is a producer
// span started and ended, every span sampled, nothing else; Sampled and
// Unsampled add what a send span must carry (its six attributes and the link
// to the producer's span), built ahead, as DrainCost's floor does, so that
// only the SDK's work is measured.
func BenchmarkSpanFloor(b *testing.B) {
	producer := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(),
		propagation.MapCarrier{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}))
	opts := []trace.SpanStartOption{
		trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(semconv.MessagingSystemKey.String("relay"), semconv.MessagingDestinationName("bench"),
			semconv.MessagingOperationName("send"), semconv.MessagingOperationTypeSend,
			semconv.MessagingMessageID("42"), otelrelay.AttemptKey.Int(1)),
		trace.WithLinks(trace.Link{SpanContext: producer}),
	}
	for _, c := range []struct {
		name    string
		sampler sdktrace.Sampler
		opts    []trace.SpanStartOption
	}{
		{"Bare", sdktrace.AlwaysSample(), opts[:1]},
		{"Sampled", sdktrace.AlwaysSample(), opts},
		{"Unsampled", sdktrace.NeverSample(), opts},
	} {
		b.Run(c.name, func(b *testing.B) {
			tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(c.sampler), sdktrace.WithBatcher(tracetest.NewNoopExporter()))
			b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
			tracer := tp.Tracer("floor")
			b.ReportAllocs()
			for b.Loop() {
				_, span := tracer.Start(context.Background(), "send bench", c.opts...)
				span.End()
			}
		})
	}
}
