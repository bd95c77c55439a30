package otelrelay_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/xadm/relay"
	"github.com/xadm/relay/internal/testkit/pgserver"
	otelrelay "github.com/xadm/relay/otel"
)

// TestMain gets a real PostgreSQL (RELAY_TEST_DATABASE_URL, or the local
// binaries) and fails, never skips, when none can be had.
func TestMain(m *testing.M) { os.Exit(pgserver.Run(m, "RELAY_TEST_DATABASE_URL")) }

// world is one test's outbox, tracer and propagator.
type world struct {
	pool  *pgxpool.Pool
	table string
	cfg   relay.Config
	spans *tracetest.SpanRecorder
	tp    *sdktrace.TracerProvider
	prop  propagation.TextMapPropagator
}

func setup(t *testing.T) *world {
	t.Helper()
	name := pgserver.Name(t)
	w := &world{pool: pgserver.Pool(t, pgserver.Shared().URL, name, 8), table: name,
		spans: tracetest.NewSpanRecorder(), prop: propagation.TraceContext{}}
	require.NoError(t, relay.CreateTable(context.Background(), w.pool, name))
	t.Cleanup(func() {
		_, _ = w.pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+pgx.Identifier{name}.Sanitize())
	})
	w.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(w.spans))
	t.Cleanup(func() { _ = w.tp.Shutdown(context.Background()) })
	w.cfg = relay.DefaultConfig()
	w.cfg.AppName, w.cfg.Table = name, name
	w.cfg.RetryBackoff = 0
	w.cfg.Logger = slog.New(slog.DiscardHandler)
	return w
}

// receiver is an HTTP receiver that continues the trace of each request it
// gets, in a server span of its own, and answers status.
type receiver struct {
	*httptest.Server
	mu      sync.Mutex
	headers []http.Header
	status  int
}

func (w *world) receiver(t *testing.T) *receiver {
	t.Helper()
	rc := &receiver{status: http.StatusOK}
	tracer := w.tp.Tracer("receiver")
	rc.Server = httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		ctx := w.prop.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
		_, span := tracer.Start(ctx, "PUT /orders", trace.WithSpanKind(trace.SpanKindServer))
		rc.mu.Lock()
		rc.headers = append(rc.headers, r.Header.Clone())
		status := rc.status
		rc.mu.Unlock()
		span.End() // before the answer: the relay's pass ends after it
		rw.WriteHeader(status)
	}))
	t.Cleanup(rc.Close)
	return rc
}

// got returns the headers of the requests received so far.
func (rc *receiver) got() []http.Header {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.headers
}

// answer makes the receiver answer status from now on.
func (rc *receiver) answer(status int) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.status = status
}

// ended returns the spans ended so far, once the send spans of the sends
// that returned have ended (they end off the send's path).
func (w *world) ended(t *testing.T) []sdktrace.ReadOnlySpan {
	t.Helper()
	require.NoError(t, otelrelay.Flush(context.Background()))
	return w.spans.Ended()
}

// span returns the one recorded span named name.
func (w *world) span(t *testing.T, name string) sdktrace.ReadOnlySpan {
	t.Helper()
	var found []sdktrace.ReadOnlySpan
	for _, s := range w.ended(t) {
		if s.Name() == name {
			found = append(found, s)
		}
	}
	require.Len(t, found, 1, "spans named %q", name)
	return found[0]
}

// attrs is a span's attributes by key.
func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}
