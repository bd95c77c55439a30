package otelrelay

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"

	"github.com/xadm/relay"
)

// The table's metrics ([RegisterTableMetrics]): what an alert needs of an
// app's outbox, per type, read from the table itself.
const (
	// UndeliveredAgeName is the gauge of the age, in seconds, of a type's
	// oldest message not yet delivered, whatever it waits for.
	UndeliveredAgeName = "relay.undelivered.age"
	// UndeliveredName is the gauge of a type's messages not yet delivered.
	UndeliveredName = "relay.undelivered.messages"
	// DeadName is the gauge of a type's dead messages.
	DeadName = "relay.dead.messages"
	// TypePausedName is 1 while a live relay of the app has paused the type.
	TypePausedName = "relay.type.paused"
	// StuckSendsName is the gauge of a type's abandoned Sends still running.
	StuckSendsName = "relay.stuck.sends"
	// TypeRelaysName is the gauge of the app's live relays that deliver the
	// type: 0 with messages waiting means nothing delivers them.
	TypeRelaysName = "relay.type.relays"
	// TypeOtherAppsName is the gauge of other apps' live relays with a sender
	// for the type on the table: two apps overlap on it.
	TypeOtherAppsName = "relay.type.other_apps"
)

// The attributes of the table's metrics beside messaging.destination.name
// (the type).
const (
	// AppKey is the app whose table it is: [relay.Admin.AppName].
	AppKey = attribute.Key("relay.app")
	// TableKey is the table: [relay.Admin.Table].
	TableKey = attribute.Key("relay.table")
)

// tableEvery is the least time between two reads of the table by the
// table's metrics: a collection within it reports the last values.
const tableEvery = time.Second

// RegisterTableMetrics registers, on the MeterProvider of
// [WithMeterProvider] or the global one, observable gauges of admin's table
// for admin's app ([relay.Admin.Health]), per type (messaging.destination.name,
// with [AppKey] and [TableKey]): relay.undelivered.age (s),
// relay.undelivered.messages, relay.dead.messages, relay.type.paused,
// relay.stuck.sends, relay.type.relays and relay.type.other_apps. The table
// is read when the meter collects, at most once a second, under a 5 s
// deadline; a read that fails reports nothing. Unregister the returned
// registration to stop.
func RegisterTableMetrics(admin *relay.Admin, opts ...Option) (metric.Registration, error) {
	if admin == nil {
		return nil, errors.New("otelrelay: RegisterTableMetrics: admin is nil")
	}
	c := newConfig(opts)
	mp := c.meterProvider
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	meter := mp.Meter(ScopeName)
	t := &tableMetrics{admin: admin, base: []attribute.KeyValue{AppKey.String(admin.AppName()), TableKey.String(admin.Table())}}
	var errs []error
	gauge := func(name, unit, desc string) metric.Float64ObservableGauge {
		g, err := meter.Float64ObservableGauge(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return g
	}
	t.age = gauge(UndeliveredAgeName, "s", "Age of the type's oldest message not yet delivered, whatever it waits for.")
	t.waiting = gauge(UndeliveredName, "{message}", "The type's messages not yet delivered: pending and retrying.")
	t.dead = gauge(DeadName, "{message}", "The type's dead messages, waiting for an operator.")
	t.paused = gauge(TypePausedName, "1", "1 while a live relay of the app has paused the type.")
	t.stuck = gauge(StuckSendsName, "{send}", "Abandoned Sends of the type still running on the app's relays.")
	t.relays = gauge(TypeRelaysName, "{relay}", "Live relays of the app that deliver the type.")
	t.others = gauge(TypeOtherAppsName, "{relay}", "Live relays of other apps with a sender for the type on the table.")
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("otelrelay: the table's instruments: %w", err)
	}
	reg, err := meter.RegisterCallback(t.observe, t.age, t.waiting, t.dead, t.paused, t.stuck, t.relays, t.others)
	if err != nil {
		return nil, fmt.Errorf("otelrelay: the table's instruments: %w", err)
	}
	return reg, nil
}

type tableMetrics struct {
	admin                                             *relay.Admin
	base                                              []attribute.KeyValue
	age, waiting, dead, paused, stuck, relays, others metric.Float64ObservableGauge

	mu   sync.Mutex
	last time.Time
	h    relay.Health
	err  error
}

// health reads the table when its last read is tableEvery old.
func (t *tableMetrics) health(ctx context.Context) (relay.Health, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.last.IsZero() && time.Since(t.last) < tableEvery {
		return t.h, t.err
	}
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	t.h, t.err = t.admin.Health(rctx)
	t.last = time.Now()
	return t.h, t.err
}

func (t *tableMetrics) observe(ctx context.Context, o metric.Observer) error {
	h, err := t.health(ctx)
	if err != nil {
		return fmt.Errorf("otelrelay: read the table %s: %w", t.admin.Table(), err)
	}
	for _, x := range h.Types {
		opt := metric.WithAttributes(append(t.base[:len(t.base):len(t.base)], semconv.MessagingDestinationName(x.Type))...)
		paused := 0.0
		if x.Paused {
			paused = 1
		}
		o.ObserveFloat64(t.age, x.Age.Seconds(), opt)
		o.ObserveFloat64(t.waiting, float64(x.Waiting), opt)
		o.ObserveFloat64(t.dead, float64(x.Dead), opt)
		o.ObserveFloat64(t.paused, paused, opt)
		o.ObserveFloat64(t.stuck, float64(x.StuckSends), opt)
		o.ObserveFloat64(t.relays, float64(x.Relays), opt)
		o.ObserveFloat64(t.others, float64(x.OtherApps), opt)
	}
	return nil
}
