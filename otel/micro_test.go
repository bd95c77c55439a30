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
// database: one wrapped send and one Observer report.
func BenchmarkSend(b *testing.B) {
	b.Run("Sampled", func(b *testing.B) { benchSend(b, sdktrace.AlwaysSample()) })
	b.Run("Unsampled", func(b *testing.B) { benchSend(b, sdktrace.NeverSample()) })
}

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
	for b.Loop() {
		_ = s.Send(context.Background(), m)
		obs.MessageDone(relay.MessageReport{ID: 42, Type: "bench", Outcome: relay.OutcomeSent})
	}
}

// BenchmarkSpanFloor is the SDK's own cost per span with the same provider as
// BenchmarkSend/Sampled (every span sampled, batched to an exporter that
// drops them), beside which WrapSender's cost reads: Bare is a producer span
// started and ended, nothing else; Conventions adds what a send span must
// carry (its six attributes and the link to the producer's span), built
// ahead, so that only the SDK's work is measured.
func BenchmarkSpanFloor(b *testing.B) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()), sdktrace.WithBatcher(tracetest.NewNoopExporter()))
	b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	tracer := tp.Tracer("floor")
	b.Run("Bare", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, span := tracer.Start(context.Background(), "send bench", trace.WithSpanKind(trace.SpanKindProducer))
			span.End()
		}
	})
	b.Run("Conventions", func(b *testing.B) {
		producer := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(),
			propagation.MapCarrier{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}))
		opts := []trace.SpanStartOption{
			trace.WithSpanKind(trace.SpanKindProducer),
			trace.WithAttributes(semconv.MessagingSystemKey.String("relay"), semconv.MessagingDestinationName("bench"),
				semconv.MessagingOperationName("send"), semconv.MessagingOperationTypeSend,
				semconv.MessagingMessageID("42"), otelrelay.AttemptKey.Int(1)),
			trace.WithLinks(trace.Link{SpanContext: producer}),
		}
		b.ReportAllocs()
		for b.Loop() {
			_, span := tracer.Start(context.Background(), "send bench", opts...)
			span.End()
		}
	})
}
