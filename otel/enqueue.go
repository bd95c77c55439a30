package otelrelay

import (
	"context"
	"maps"

	"go.opentelemetry.io/otel/propagation"

	"github.com/xadm/relay"
)

// Enqueue is [relay.Enqueue] with the trace context of ctx's span stored in
// the message's headers ([Inject]); [WithPropagator] chooses the propagator,
// [WithEnqueueOptions] passes relay's own options ([relay.WithoutWakeUp]).
// The table must have the headers column (relay.CreateTable adds it), or
// relay.Enqueue refuses a message that carries a trace context.
func Enqueue(ctx context.Context, q relay.Querier, table string, m relay.Outgoing, opts ...Option) (int64, error) {
	c := newConfig(opts)
	Inject(ctx, &m, opts...)
	return relay.Enqueue(ctx, q, table, m, c.enqueue...)
}

// Inject stores the W3C trace context of ctx's span (traceparent, and
// tracestate when there is one) in m.Headers, through the propagator
// (otel.GetTextMapPropagator() unless [WithPropagator] gives one). It
// copies m.Headers before writing, so the caller's map is left as it was, and
// leaves m alone when ctx has no span, or when the propagator panics.
func Inject(ctx context.Context, m *relay.Outgoing, opts ...Option) {
	if m == nil {
		return
	}
	c := newConfig(opts)
	defer func() { _ = recover() }() // a propagator's panic costs the trace context only
	carrier := propagation.MapCarrier{}
	c.propagatorOf().Inject(ctx, carrier)
	if len(carrier) == 0 {
		return
	}
	h := make(map[string]string, len(m.Headers)+len(carrier))
	maps.Copy(h, m.Headers)
	maps.Copy(h, carrier)
	m.Headers = h
}
