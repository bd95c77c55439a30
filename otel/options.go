package otelrelay

import (
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/xadm/relay"
)

// ScopeName is the instrumentation scope of the tracer and the meter.
const ScopeName = "github.com/xadm/relay/otel"

// SystemDefault is the default messaging.system attribute: what the relay
// delivers through is the sender's business, so WithSystem names it ("kafka",
// "nats") where the destination is a broker.
const SystemDefault = "relay"

// Option configures [Enqueue], [Inject], [WrapSender] and [NewObserver]; each
// takes the options that concern it and ignores the others.
type Option func(*config)

type config struct {
	propagator     propagation.TextMapPropagator
	tracerProvider trace.TracerProvider
	meterProvider  metric.MeterProvider
	system         string
	child          bool
	enqueue        []relay.EnqueueOption
}

func newConfig(opts []Option) config {
	c := config{system: SystemDefault}
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	return c
}

// propagatorOf is c's propagator: the global one unless WithPropagator gave
// one. The global is read at each use, so a service may set it after
// building the sender.
func (c *config) propagatorOf() propagation.TextMapPropagator {
	if c.propagator != nil {
		return c.propagator
	}
	return otel.GetTextMapPropagator()
}

// WithPropagator stores and reads the trace context with p instead of
// otel.GetTextMapPropagator() (which is a no-op until the service sets one:
// set propagation.TraceContext{} there, or pass it here).
func WithPropagator(p propagation.TextMapPropagator) Option {
	return func(c *config) { c.propagator = p }
}

// WithTracerProvider makes the send spans with tp instead of
// otel.GetTracerProvider().
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(c *config) { c.tracerProvider = tp }
}

// WithMeterProvider makes the Observer's instruments with mp instead of
// otel.GetMeterProvider().
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(c *config) { c.meterProvider = mp }
}

// WithSystem sets the messaging.system attribute of spans and metrics
// ("kafka", "nats"); the default is [SystemDefault].
func WithSystem(system string) Option {
	return func(c *config) {
		if system != "" {
			c.system = system
		}
	}
}

// AsChild makes each send span a child of the producer's span, so that the
// request, the send and the receiver's handling are one trace. By default the
// send span starts a trace of its own, linked to the producer's span, as the
// messaging conventions suggest for work that runs later and may be retried:
// every attempt is then its own trace, and the request's trace does not grow
// for as long as a message waits.
func AsChild() Option {
	return func(c *config) { c.child = true }
}

// WithEnqueueOptions passes opts to relay.Enqueue from [Enqueue].
func WithEnqueueOptions(opts ...relay.EnqueueOption) Option {
	return func(c *config) { c.enqueue = append(c.enqueue, opts...) }
}
