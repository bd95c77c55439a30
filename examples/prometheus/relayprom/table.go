package relayprom

import (
	"context"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/xadm/relay"
)

// TableCollector exports what an alert needs of one app's outbox table, per
// type, read from the table itself ([relay.Admin.Health]) rather than from
// one relay's passes: it says the truth while the relays are stuck, paused
// or all stopped. Register it in the relays' processes (each exports the same
// values; the rules take the max across them) and, so that an outage of every
// relay still pages, in one process that runs no relay (a collector: see
// examples/prometheus's -collector-only). Build it with [NewTableCollector].
//
// It reads the table at most once per [TableOptions.Every], however often it
// is scraped, under [TableOptions.Timeout]; a scrape in between gets the last
// values. It exports, under the namespace "relay", each with the labels app
// and table:
//
//	relay_undelivered_age_seconds{type}   age of the type's oldest message not yet delivered, whatever it waits for
//	relay_undelivered_messages{type}      its messages not yet delivered (pending and retrying)
//	relay_dead_messages{type}             its dead messages, waiting for an operator
//	relay_type_paused{type}               1 while a relay of the app has paused it (its destination keeps failing)
//	relay_stuck_sends{type}               abandoned Sends of it still running on the app's relays
//	relay_type_relays{type}               live relays of the app that deliver it
//	relay_type_other_apps{type}           live relays of other apps with a sender for it (two apps overlap)
//	relay_relays                          live relays of the app
//	relay_retention_last_run_timestamp_seconds  when a relay of the app last ran the retention job (absent: none)
//	relay_retention_last_deleted_rows     SENT rows that run deleted
//	relay_retention_last_failed           1 when that run failed
//	relay_table_up                        1 when the last read of the table succeeded
//	relay_table_read_duration_seconds     how long it took
//
// The alerting rules beside this file (alerts.yml) page on them; promtool
// tests them (alerts_test.yml).
type TableCollector struct {
	admin *relay.Admin
	opts  TableOptions

	mu   sync.Mutex
	last time.Time // when the table was last read
	h    relay.Health
	err  error
	took time.Duration

	descs map[string]*prometheus.Desc
}

// TableOptions tune a [TableCollector].
type TableOptions struct {
	// Every is the least time between two reads of the table: a scrape
	// within it gets the last values. Give it the relays' Interval or more.
	// Defaults to 1s.
	Every time.Duration
	// Timeout bounds one read of the table. Defaults to 5s.
	Timeout time.Duration
	// ConstLabels are added to every metric, beside app and table.
	ConstLabels prometheus.Labels
}

var _ prometheus.Collector = (*TableCollector)(nil)

// NewTableCollector returns a collector of admin's table, for admin's app.
func NewTableCollector(admin *relay.Admin, opts TableOptions) *TableCollector {
	if opts.Every <= 0 {
		opts.Every = time.Second
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 5 * time.Second
	}
	labels := prometheus.Labels{}
	for k, v := range opts.ConstLabels {
		labels[k] = v
	}
	labels["app"], labels["table"] = admin.AppName(), admin.Table()
	c := &TableCollector{admin: admin, opts: opts, descs: map[string]*prometheus.Desc{}}
	perType := []string{"type"}
	for name, d := range map[string]struct {
		help   string
		labels []string
	}{
		"undelivered_age_seconds":              {"Age of the type's oldest message not yet delivered, whatever it waits for (the relays, a retry's backoff, a paused type, no relay), on the database's clock; 0 when none waits.", perType},
		"undelivered_messages":                 {"The type's messages not yet delivered: pending and retrying (dead ones aside).", perType},
		"dead_messages":                        {"The type's dead messages (at MaxAttempts, or a permanent failure): never retried until an operator re-queues them.", perType},
		"type_paused":                          {"1 while a live relay of the app has paused the type, because its destination keeps failing.", perType},
		"stuck_sends":                          {"Abandoned Sends of the type still running on the app's live relays: Sends that ignored their context.", perType},
		"type_relays":                          {"Live relays of the app that deliver the type: 0 with messages waiting means nothing delivers them.", perType},
		"type_other_apps":                      {"Live relays of other apps on the table with a sender for the type: two apps overlap on it.", perType},
		"relays":                               {"Live relays of the app (started, with presence).", nil},
		"retention_last_run_timestamp_seconds": {"When a live relay of the app last ran the retention job (Config.Retention), as seconds since the epoch.", nil},
		"retention_last_deleted_rows":          {"SENT rows the last run of the retention job deleted.", nil},
		"retention_last_failed":                {"1 when the last run of the retention job failed.", nil},
		"table_up":                             {"1 when the collector's last read of the table succeeded.", nil},
		"table_read_duration_seconds":          {"How long the collector's last read of the table took.", nil},
	} {
		c.descs[name] = prometheus.NewDesc(prometheus.BuildFQName("relay", "", name), d.help, d.labels, labels)
	}
	return c
}

// Describe implements [prometheus.Collector].
func (c *TableCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

// read reads the table when its last read is Every old.
func (c *TableCollector) read() (relay.Health, time.Duration, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.last.IsZero() && time.Since(c.last) < c.opts.Every {
		return c.h, c.took, c.err
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.opts.Timeout)
	defer cancel()
	start := time.Now()
	c.h, c.err = c.admin.Health(ctx)
	c.took, c.last = time.Since(start), time.Now()
	return c.h, c.took, c.err
}

// Collect implements [prometheus.Collector].
func (c *TableCollector) Collect(ch chan<- prometheus.Metric) {
	h, took, err := c.read()
	gauge := func(name string, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(c.descs[name], prometheus.GaugeValue, v, labels...)
	}
	gauge("table_read_duration_seconds", took.Seconds())
	if err != nil {
		gauge("table_up", 0)
		return
	}
	gauge("table_up", 1)
	gauge("relays", float64(h.Relays))
	for _, t := range h.Types {
		paused := 0.0
		if t.Paused {
			paused = 1
		}
		gauge("undelivered_age_seconds", t.Age.Seconds(), t.Type)
		gauge("undelivered_messages", float64(t.Waiting), t.Type)
		gauge("dead_messages", float64(t.Dead), t.Type)
		gauge("type_paused", paused, t.Type)
		gauge("stuck_sends", float64(t.StuckSends), t.Type)
		gauge("type_relays", float64(t.Relays), t.Type)
		gauge("type_other_apps", float64(t.OtherApps), t.Type)
	}
	if r := h.Retention; r != nil {
		failed := 0.0
		if r.Err != "" {
			failed = 1
		}
		gauge("retention_last_run_timestamp_seconds", float64(r.At.UnixNano())/1e9)
		gauge("retention_last_deleted_rows", float64(r.Deleted))
		gauge("retention_last_failed", failed)
	}
}
