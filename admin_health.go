package relay

import (
	"context"
	"slices"
	"time"
)

// Health is what an alert needs of one app's table, per type, as
// [Admin.Health] reads it: the metrics adapters (examples/prometheus's
// relayprom, otel's otelrelay) export it, and their alerting rules page on
// it.
type Health struct {
	At time.Time // the database's clock when it was read
	// Types are the app's types, by type: those with rows not yet delivered
	// or dead, and those its live relays have a sender for.
	Types []TypeHealth
	// Relays is how many relays of the app are live (started, with presence).
	Relays int
	// Retention is the latest run of the retention job among the app's live
	// relays ([Config.Retention]); nil when none ran one.
	Retention *RetentionRun
}

// TypeHealth is one type's share of [Health].
type TypeHealth struct {
	Type string
	// Age is how long its oldest message not yet delivered has waited,
	// whatever it waits for ([TypeOverview.Age]); 0 when none waits.
	Age time.Duration
	// Waiting are its messages not yet delivered (pending and retrying);
	// Dead those that wait for an operator.
	Waiting, Dead int64
	// Paused says a live relay of the app paused it ([Config.PauseAfter]).
	Paused bool
	// StuckSends are the app's relays' abandoned Sends of it still running.
	StuckSends int
	// Relays is how many live relays of the app deliver it: 0 with messages
	// waiting means nothing will deliver them.
	Relays int
	// OtherApps is how many live relays of other apps on the table have a
	// sender for it: above 0 while the app's relays serve it too, two apps
	// overlap on it (one delivers, the other yields).
	OtherApps int
}

// Health reads the app's table as an alert needs it: per type, the age of
// its oldest message not yet delivered, how many wait and are dead, whether
// it is paused, its stuck Sends, and how many live relays deliver it. It is
// [Admin.Overview] (the live rows through their partial indexes) and the
// relays' presence, a few cheap statements: a collector may call it every
// Interval.
func (a *Admin) Health(ctx context.Context) (Health, error) {
	o, err := a.Overview(ctx)
	if err != nil {
		return Health{}, err
	}
	reps, err := a.replicas(ctx, nil)
	if err != nil {
		return Health{}, err
	}
	var names []string
	for _, t := range o.Types {
		names = append(names, t.Type)
	}
	for _, r := range reps {
		names = append(names, r.Types...)
	}
	others, err := a.OtherReplicas(ctx, names...)
	if err != nil {
		return Health{}, err
	}
	h := Health{At: o.At, Relays: len(reps)}
	byType := map[string]*TypeHealth{}
	get := func(typ string) *TypeHealth {
		if t, ok := byType[typ]; ok {
			return t
		}
		t := &TypeHealth{Type: typ}
		byType[typ] = t
		return t
	}
	for _, t := range o.Types {
		th := get(t.Type)
		th.Age, th.Waiting, th.Dead = t.Age, t.Pending+t.Retrying, t.Dead
	}
	for _, r := range reps {
		for _, t := range r.Types {
			th := get(t)
			if r.Delivers(t) {
				th.Relays++
			}
		}
		for _, p := range r.Paused {
			get(p.Type).Paused = true
		}
		for _, k := range r.Stuck {
			get(k.Type).StuckSends += k.Sends
		}
		if x := r.Retention; x != nil && (h.Retention == nil || x.At.After(h.Retention.At)) {
			h.Retention = x
		}
	}
	for _, r := range others {
		for _, t := range r.Types {
			if th, ok := byType[t]; ok {
				th.OtherApps++
			}
		}
	}
	for _, t := range byType {
		h.Types = append(h.Types, *t)
	}
	slices.SortFunc(h.Types, func(x, y TypeHealth) int {
		switch {
		case x.Type < y.Type:
			return -1
		case x.Type > y.Type:
			return 1
		}
		return 0
	})
	return h, nil
}
