// Package otelrelay follows a message of [github.com/xadm/relay] from the
// request that wrote it to the receiver that handled it, with OpenTelemetry.
//
// The producer stores its span's W3C trace context in the message's headers
// with [Enqueue] (or [Inject] before its own relay.Enqueue):
//
//	id, err := otelrelay.Enqueue(ctx, tx, "mensagem_m2m", relay.Outgoing{Type: "order", Key: key, Payload: body})
//
// The relay runs each send in a span of its own with [WrapSender]: a span of
// kind producer, named "send <type>", with the messaging semantic
// conventions' attributes (messaging.system, messaging.destination.name,
// messaging.message.id, messaging.operation.name and .type) and
// relay.message.attempt, error.type on failure. It is linked to the
// producer's span (by default: the send runs long after the request, and may
// be retried) or, with [AsChild], its child. The send span's context goes into
// the headers the wrapped sender gets, so the HTTPSender's request, the Kafka
// record and the NATS message carry it, and the receiver's span continues the
// trace:
//
//	r, err := relay.New(pool, cfg, otelrelay.WrapSender(httpSender))
//
// [NewObserver] exports the relay's outcomes as metrics
// (messaging.client.sent.messages, messaging.client.operation.duration,
// relay.pass.duration, relay.lag, relay.outcomes.waiting), through the global
// MeterProvider unless [WithMeterProvider] gives one:
//
//	obs, err := otelrelay.NewObserver()
//	cfg.Observer = obs
//
// Tracing and metrics never change what the relay does: a panic or an error
// inside the instrumentation costs at most its span or its measurement, and
// the message is sent as it would be without it.
package otelrelay
