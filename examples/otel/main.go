// Command otel follows one message from the request that wrote it to the
// receiver that handled it, with OpenTelemetry, and nothing to set up:
//
//	go run ./examples/otel                      # the spans, as JSON, to stdout
//	go run ./examples/otel -out spans.json      # to a file
//	go run ./examples/otel -svg trace.svg       # and a picture of the trace
//	go run ./examples/otel -link                # the send span linked, not a child
//
// It gets a throwaway PostgreSQL by itself (DATABASE_URL if set, else a
// container where a Docker engine answers, else the local PostgreSQL
// binaries) and plays the three parties of a service with an outbox, in this
// process:
//
//   - the orders service: its POST /orders handler, in a server span, writes
//     the order and its message in one transaction, with otelrelay.Enqueue,
//     which stores the span's W3C trace context in the message's headers;
//   - the relay, whose HTTPSender is wrapped by otelrelay.WrapSender: each
//     send runs in a producer span, a child of the request's span (or, with
//     -link, linked to it), and the request it makes carries the send span's
//     traceparent;
//   - the receiver, an HTTP server that continues the trace in a span of its
//     own.
//
// The tracer provider exports with the SDK's stdout exporter (no collector
// needed); point an OTLP exporter at yours instead in a real service. The
// relay's metrics go through otelrelay.NewObserver; it prints their names and
// values at the end.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/xadm/relay"
	"github.com/xadm/relay/internal/testkit/pgserver"
	otelrelay "github.com/xadm/relay/otel"
)

func main() {
	out := flag.String("out", "", "write the spans (JSON) to this file instead of stdout")
	svg := flag.String("svg", "", "also draw the message's trace into this SVG file")
	link := flag.Bool("link", false, "link the send span to the request's span instead of making it a child")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, options{out: *out, svg: *svg, link: *link}, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "otel example:", err)
		os.Exit(1)
	}
}

type options struct {
	out, svg string
	link     bool
}

// run plays one order through the three parties and exports its spans.
func run(ctx context.Context, o options, stdout, report io.Writer) (err error) {
	spansOut := stdout
	if o.out != "" {
		f, err := os.Create(o.out)
		if err != nil {
			return err
		}
		defer func() { err = errors.Join(err, f.Close()) }()
		spansOut = f
	}

	// The tracing and metrics a service sets up once, at start.
	exporter, err := stdouttrace.New(stdouttrace.WithWriter(spansOut), stdouttrace.WithPrettyPrint())
	if err != nil {
		return err
	}
	recorder := tracetest.NewSpanRecorder() // for the picture only
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithResource(resource.NewSchemaless(semconv.ServiceName("orders"))),
		sdktrace.WithBatcher(exporter), sdktrace.WithSpanProcessor(recorder))
	defer func() { err = errors.Join(err, tp.Shutdown(context.WithoutCancel(ctx))) }()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { err = errors.Join(err, mp.Shutdown(context.WithoutCancel(ctx))) }()
	prop := propagation.TraceContext{} // or otel.SetTextMapPropagator(...) once, and no option
	tracing := []otelrelay.Option{otelrelay.WithTracerProvider(tp), otelrelay.WithPropagator(prop)}
	if !o.link {
		tracing = append(tracing, otelrelay.AsChild())
	}

	srv, err := pgserver.Start(ctx, "DATABASE_URL")
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, srv.Stop()) }()
	pool, err := pgxpool.New(ctx, srv.URL)
	if err != nil {
		return err
	}
	defer pool.Close()
	const table = "otel_example_outbox"
	if _, err := pool.Exec(ctx, "DROP TABLE IF EXISTS "+table+"; DROP TABLE IF EXISTS otel_example_orders"); err != nil {
		return err
	}
	if err := relay.CreateTable(ctx, pool, table); err != nil {
		return err
	}
	if _, err := pool.Exec(ctx, "CREATE TABLE otel_example_orders (id text PRIMARY KEY, total int NOT NULL)"); err != nil {
		return err
	}

	// The receiver: another service, which continues the trace.
	received := make(chan string, 1)
	receiver, err := serve(ctx, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rctx := prop.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
		_, span := tp.Tracer("billing").Start(rctx, r.Method+" /orders/{key}", trace.WithSpanKind(trace.SpanKindServer),
			trace.WithAttributes(attribute.String("http.route", "/orders/{key}")))
		_, _ = io.Copy(io.Discard, r.Body)
		span.End()
		select {
		case received <- r.Header.Get("Traceparent"):
		default: // a second delivery (at-least-once) tells nothing new
		}
	}))
	if err != nil {
		return err
	}

	// The relay, in the orders service, its sender wrapped.
	httpSender, err := relay.NewHTTPSender(relay.HTTPSenderConfig{Type: "order", URL: relay.URLWithKey(receiver + "/orders")})
	if err != nil {
		return err
	}
	observer, err := otelrelay.NewObserver(otelrelay.WithMeterProvider(mp))
	if err != nil {
		return err
	}
	cfg := relay.DefaultConfig()
	cfg.AppName, cfg.Table, cfg.Observer = "orders", table, observer
	r, err := relay.New(pool, cfg, otelrelay.WrapSender(httpSender, tracing...))
	if err != nil {
		return err
	}
	if err := r.Start(ctx); err != nil {
		return err
	}
	defer func() { err = errors.Join(err, r.Stop(context.WithoutCancel(ctx))) }()

	// The orders service's request: the order and its message in one transaction.
	rctx, span := tp.Tracer("orders").Start(ctx, "POST /orders", trace.WithSpanKind(trace.SpanKindServer))
	err = pgx.BeginFunc(rctx, pool, func(tx pgx.Tx) error {
		_, span := tp.Tracer("orders").Start(rctx, "INSERT otel_example_orders", trace.WithSpanKind(trace.SpanKindClient))
		defer span.End()
		if _, err := tx.Exec(rctx, "INSERT INTO otel_example_orders VALUES ('order-42', 3)"); err != nil {
			return err
		}
		_, err := otelrelay.Enqueue(rctx, tx, table,
			relay.Outgoing{Type: "order", Key: "order-42", Payload: []byte(`{"order": "order-42", "total": 3}`)}, tracing...)
		return err
	})
	span.End()
	if err != nil {
		return err
	}

	select {
	case tp := <-received:
		fmt.Fprintf(report, "the receiver got order-42 with traceparent %s\n", tp)
	case <-time.After(time.Minute):
		return errors.New("the receiver got nothing within a minute")
	case <-ctx.Done():
		return ctx.Err()
	}
	if err := r.Stop(ctx); err != nil { // the outcome recorded, the observer told
		return err
	}
	if err := otelrelay.Flush(ctx); err != nil { // the send spans end off the sends' path
		return err
	}
	if err := tp.ForceFlush(ctx); err != nil {
		return err
	}
	if err := printMetrics(ctx, reader, report); err != nil {
		return err
	}
	if o.svg != "" {
		f, err := os.Create(o.svg)
		if err != nil {
			return err
		}
		err = errors.Join(drawTrace(f, recorder.Ended()), f.Close())
		if err != nil {
			return err
		}
		fmt.Fprintf(report, "the trace is drawn in %s\n", o.svg)
	}
	return nil
}

// serve serves h on a free port of 127.0.0.1 until ctx ends and returns its URL.
func serve(ctx context.Context, h http.Handler) (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	s := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = s.Serve(l) }()
	context.AfterFunc(ctx, func() { _ = s.Close() })
	return "http://" + l.Addr().String(), nil
}

// printMetrics prints what the Observer recorded.
func printMetrics(ctx context.Context, reader *sdkmetric.ManualReader, w io.Writer) error {
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		return err
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, dp := range d.DataPoints {
					fmt.Fprintf(w, "metric %s %v = %d\n", m.Name, dp.Attributes.ToSlice(), dp.Value)
				}
			case metricdata.Histogram[float64]:
				for _, dp := range d.DataPoints {
					fmt.Fprintf(w, "metric %s (%s) count %d, sum %.6f\n", m.Name, m.Unit, dp.Count, dp.Sum)
				}
			case metricdata.Gauge[float64]:
				for _, dp := range d.DataPoints {
					fmt.Fprintf(w, "metric %s (%s) = %.6f\n", m.Name, m.Unit, dp.Value)
				}
			}
		}
	}
	return nil
}
