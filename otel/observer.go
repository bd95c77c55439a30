package otelrelay

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/semconv/v1.43.0/messagingconv"

	"github.com/xadm/relay"
)

// The attributes of the Observer's measurements beside the conventions' own.
const (
	// OutcomeKey is a message's recorded outcome: "sent", "error" (to be
	// retried) or "dead".
	OutcomeKey = attribute.Key("relay.message.outcome")
	// PassKey is a pass's kind: "ran" (elected or direct) or "coalesced"
	// (another session held the election).
	PassKey = attribute.Key("relay.pass")
)

// The metrics of the Observer that the conventions do not name.
const (
	// PassDurationName is the histogram of pass durations, in seconds,
	// election included, by [PassKey], with error.type for a failed pass.
	PassDurationName = "relay.pass.duration"
	// LagName is the gauge of the age, in seconds, of the oldest deliverable
	// row the last pass found: how far behind the relay is (relay.Stats.Lag).
	LagName = "relay.lag"
	// OutcomesWaitingName is the gauge of the most outcomes that waited at
	// once, during the last pass, to be written: messages sent whose outcome
	// was not yet recorded, what a crash would re-deliver beyond the sends in
	// flight (relay.PassReport.OutcomesWaiting).
	OutcomesWaitingName = "relay.outcomes.waiting"
)

// NewObserver returns a [relay.Observer] (for [relay.Config].Observer) that
// records, through the MeterProvider of [WithMeterProvider] or the global one:
//
//   - messaging.client.sent.messages, a counter of messages whose outcome was
//     recorded, by messaging.destination.name (the type) and [OutcomeKey],
//     with error.type when it failed;
//   - messaging.client.operation.duration, a histogram of the sends' durations
//     in seconds, with the same attributes;
//   - relay.pass.duration ([PassDurationName]), relay.lag ([LagName]) and
//     relay.outcomes.waiting ([OutcomesWaitingName]).
//
// Every measurement carries messaging.system ([WithSystem]). A panic inside
// the meter costs that measurement only.
func NewObserver(opts ...Option) (relay.Observer, error) {
	c := newConfig(opts)
	mp := c.meterProvider
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	meter := mp.Meter(ScopeName)
	o := &observer{system: semconv.MessagingSystemKey.String(c.system)}
	var errs []error
	var err error
	// The count is kept here, one atomic counter per type, outcome and
	// error.type, and read by the meter when it collects: a message costs an
	// addition, not a measurement of the SDK's.
	o.sent, err = meter.Int64ObservableCounter(messagingconv.ClientSentMessages{}.Name(),
		metric.WithUnit(messagingconv.ClientSentMessages{}.Unit()),
		metric.WithDescription("Messages the relay tried to send, by outcome."))
	errs = append(errs, err)
	if err == nil {
		_, err = meter.RegisterCallback(o.observeSent, o.sent)
		errs = append(errs, err)
	}
	o.sendDuration, err = meter.Float64Histogram(messagingconv.ClientOperationDuration{}.Name(),
		metric.WithUnit("s"), metric.WithDescription("Duration of one send, by outcome."))
	errs = append(errs, err)
	o.passDuration, err = meter.Float64Histogram(PassDurationName,
		metric.WithUnit("s"), metric.WithDescription("Duration of a relay pass, election included."))
	errs = append(errs, err)
	o.lag, err = meter.Float64Gauge(LagName,
		metric.WithUnit("s"), metric.WithDescription("Age of the oldest deliverable row the last pass found."))
	errs = append(errs, err)
	o.waiting, err = meter.Int64Gauge(OutcomesWaitingName,
		metric.WithUnit("{message}"), metric.WithDescription("The most outcomes that waited at once, during the last pass, to be written."))
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("otelrelay: the Observer's instruments: %w", err)
	}
	return o, nil
}

type observer struct {
	system       attribute.KeyValue
	sent         metric.Int64ObservableCounter
	sendDuration metric.Float64Histogram
	passDuration metric.Float64Histogram
	lag          metric.Float64Gauge
	waiting      metric.Int64Gauge

	sets sync.Map                     // messageSet → *messageCount, built once per type, outcome and error.type
	last atomic.Pointer[messageCount] // the last one counted: most messages are of the last one's set
}

type messageSet struct{ typ, outcome, errType string }

// messageCount is one messageSet's attributes and count.
type messageCount struct {
	set  messageSet
	opt  metric.MeasurementOption
	opts []metric.RecordOption // opt, for Record without a slice of its own
	n    atomic.Int64
}

// observeSent reports each messageSet's count, for the meter's collection.
func (o *observer) observeSent(_ context.Context, obs metric.Observer) error {
	o.sets.Range(func(_, v any) bool {
		c := v.(*messageCount)
		obs.ObserveInt64(o.sent, c.n.Load(), c.opt)
		return true
	})
	return nil
}

// countOf returns k's messageCount, built the first time.
func (o *observer) countOf(k messageSet) *messageCount {
	if c := o.last.Load(); c != nil && c.set == k {
		return c
	}
	if v, ok := o.sets.Load(k); ok {
		c := v.(*messageCount)
		o.last.Store(c)
		return c
	}
	attrs := []attribute.KeyValue{o.system, semconv.MessagingDestinationName(k.typ),
		semconv.MessagingOperationName(operationName), semconv.MessagingOperationTypeSend, OutcomeKey.String(k.outcome)}
	if k.errType != "" {
		attrs = append(attrs, semconv.ErrorTypeKey.String(k.errType))
	}
	opt := metric.WithAttributeSet(attribute.NewSet(attrs...))
	v, _ := o.sets.LoadOrStore(k, &messageCount{set: k, opt: opt, opts: []metric.RecordOption{opt}})
	return v.(*messageCount)
}

// PassDone records p's duration and lag.
func (o *observer) PassDone(p relay.PassReport) {
	defer func() { _ = recover() }()
	ctx := context.Background()
	kind := "ran"
	if p.Coalesced {
		kind = "coalesced"
	}
	attrs := []attribute.KeyValue{o.system, PassKey.String(kind)}
	if p.Err != nil && !errors.Is(p.Err, context.Canceled) {
		attrs = append(attrs, semconv.ErrorTypeKey.String(errorType(p.Err)))
	}
	o.passDuration.Record(ctx, p.Duration.Seconds(), metric.WithAttributes(attrs...))
	if p.Ran && (p.Err == nil || p.Lag > 0) {
		o.lag.Record(ctx, p.Lag.Seconds(), metric.WithAttributes(o.system))
	}
	if p.Ran {
		o.waiting.Record(ctx, int64(p.OutcomesWaiting), metric.WithAttributes(o.system))
	}
}

// MessageDone counts m and records its send's duration.
func (o *observer) MessageDone(m relay.MessageReport) {
	defer func() { _ = recover() }()
	k := messageSet{typ: m.Type, outcome: outcomeOf(m.Outcome)}
	if m.Err != nil {
		k.errType = errorType(m.Err)
	}
	c := o.countOf(k)
	c.n.Add(1)
	o.sendDuration.Record(context.Background(), m.Duration.Seconds(), c.opts...)
}

// outcomeOf is a MessageReport.Outcome as OutcomeKey says it.
func outcomeOf(outcome relay.Outcome) string {
	switch outcome {
	case relay.OutcomeSent:
		return "sent"
	case relay.OutcomeError:
		return "error"
	case relay.OutcomeDead:
		return "dead"
	}
	return strings.ToLower(string(outcome))
}
