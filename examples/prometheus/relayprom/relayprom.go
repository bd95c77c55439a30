// Package relayprom exports what a relay does as Prometheus metrics, through
// the relay's [relay.Observer] hook: the core module depends on neither
// Prometheus nor any other metrics library, and this adapter is an example to
// copy or import.
//
//	obs := relayprom.NewObserver(prometheus.Labels{"app": "billing"})
//	prometheus.MustRegister(obs)
//	cfg := relay.DefaultConfig()
//	cfg.Observer = obs
//
// It exports, under the namespace "relay":
//
//	relay_passes_total{result}                counter: "elected", "coalesced" or "failed"
//	relay_messages_total{type,outcome}        counter: "sent", "error" or "dead"
//	relay_send_duration_seconds{type}         histogram of Sender.Send's duration
//	relay_pass_duration_seconds               histogram of a pass's duration, election included
//	relay_lag_seconds                         gauge: age of the oldest deliverable row at the last pass
//
// The Observer sees what its own relay's passes did. What an alert needs —
// per type, the age of the oldest message not yet delivered, the messages
// waiting and dead, paused types, stuck Sends, the live relays — is read
// from the table by a [TableCollector], and alerts.yml beside this file
// pages on it (tested by promtool: alerts_test.yml).
package relayprom

import (
	"context"
	"errors"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/xadm/relay"
)

// Results of relay_passes_total.
const (
	ResultElected   = "elected"   // the pass ran: it won the election, or it was a direct pass
	ResultCoalesced = "coalesced" // another session held the election; nothing ran
	ResultFailed    = "failed"    // the pass ended in an error
)

// Observer is a [relay.Observer] and a [prometheus.Collector]: set it as
// [relay.Config.Observer] and register it once. It is safe for concurrent
// use, as the relay requires. Build it with [NewObserver].
type Observer struct {
	passes       *prometheus.CounterVec
	messages     *prometheus.CounterVec
	sendDuration *prometheus.HistogramVec
	passDuration prometheus.Histogram
	lag          prometheus.Gauge
}

var (
	_ relay.Observer       = (*Observer)(nil)
	_ prometheus.Collector = (*Observer)(nil)
)

// NewObserver returns an Observer whose metrics carry constLabels (typically
// the app's name, when several relays share a registry); nil means none.
func NewObserver(constLabels prometheus.Labels) *Observer {
	const ns = "relay"
	// From 5ms to about 41s: beyond the default SendTimeout of 30s.
	sendBuckets := prometheus.ExponentialBuckets(0.005, 2, 14)
	o := &Observer{
		passes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Name: "passes_total", ConstLabels: constLabels,
			Help: "Passes of the relay, by result: elected (ran), coalesced (another session held the election) or failed.",
		}, []string{"result"}),
		messages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Name: "messages_total", ConstLabels: constLabels,
			Help: "Messages whose outcome was recorded, by type and outcome: sent, error (will be retried) or dead.",
		}, []string{"type", "outcome"}),
		sendDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Name: "send_duration_seconds", ConstLabels: constLabels, Buckets: sendBuckets,
			Help: "Duration of Sender.Send, by message type.",
		}, []string{"type"}),
		passDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: ns, Name: "pass_duration_seconds", ConstLabels: constLabels, Buckets: sendBuckets,
			Help: "Duration of a pass that ran, election included.",
		}),
		lag: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Name: "lag_seconds", ConstLabels: constLabels,
			Help: "Age of the oldest deliverable row when the last pass that ran read it; 0 when there was none.",
		}),
	}
	// Start every pass result at 0, so that rate() and absence alerts work from the first scrape.
	for _, r := range []string{ResultElected, ResultCoalesced, ResultFailed} {
		o.passes.WithLabelValues(r)
	}
	return o
}

// PassDone implements [relay.Observer].
func (o *Observer) PassDone(p relay.PassReport) {
	switch {
	case p.Err != nil && !errors.Is(p.Err, context.Canceled): // a shutdown is not a failure
		o.passes.WithLabelValues(ResultFailed).Inc()
	case p.Coalesced:
		o.passes.WithLabelValues(ResultCoalesced).Inc()
		return
	default:
		o.passes.WithLabelValues(ResultElected).Inc()
	}
	if !p.Ran {
		return
	}
	o.passDuration.Observe(p.Duration.Seconds())
	// A pass that failed before reading a batch knows nothing of the lag:
	// keep the last value rather than report 0 while the relay is stuck.
	if p.Err == nil || p.Lag > 0 {
		o.lag.Set(p.Lag.Seconds())
	}
}

// MessageDone implements [relay.Observer].
func (o *Observer) MessageDone(m relay.MessageReport) {
	o.messages.WithLabelValues(m.Type, strings.ToLower(string(m.Outcome))).Inc()
	o.sendDuration.WithLabelValues(m.Type).Observe(m.Duration.Seconds())
}

// Describe implements [prometheus.Collector].
func (o *Observer) Describe(ch chan<- *prometheus.Desc) {
	o.passes.Describe(ch)
	o.messages.Describe(ch)
	o.sendDuration.Describe(ch)
	o.passDuration.Describe(ch)
	o.lag.Describe(ch)
}

// Collect implements [prometheus.Collector].
func (o *Observer) Collect(ch chan<- prometheus.Metric) {
	o.passes.Collect(ch)
	o.messages.Collect(ch)
	o.sendDuration.Collect(ch)
	o.passDuration.Collect(ch)
	o.lag.Collect(ch)
}
