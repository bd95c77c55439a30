package main

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/xadm/relay"
	"github.com/xadm/relay/internal/diagnose"
)

// sampleDefault is how long status waits between its two looks: long enough
// for a relay with the default Interval (1s) to run a pass.
const sampleDefault = 2 * time.Second

func statusFlags(fs *flag.FlagSet, o *opts) {
	fs.DurationVar(&o.sample, "sample", sampleDefault,
		"look twice, this far apart, to tell whether rows move and the lag grows; 0 looks once")
	fs.DurationVar(&o.stallAfter, "stall-after", diagnose.StallAfterDefault,
		"a row waiting longer than this, without moving, means delivery is stalled")
}

// look reads the table and the election once.
func look(ctx context.Context, a *relay.Admin) (diagnose.Look, error) {
	o, err := a.Overview(ctx)
	if err != nil {
		return diagnose.Look{}, err
	}
	h, err := a.Election(ctx)
	if err != nil {
		return diagnose.Look{}, err
	}
	reps, err := a.Replicas(ctx)
	if err != nil {
		return diagnose.Look{}, err
	}
	var types []string
	for _, t := range o.Types {
		types = append(types, t.Type)
	}
	others, err := a.OtherReplicas(ctx, types...)
	if err != nil {
		return diagnose.Look{}, err
	}
	return diagnose.Look{Overview: o, Holders: h, Replicas: reps, PresenceKnown: true, Others: others}, nil
}

func runStatus(ctx context.Context, e *env) int {
	if e.o.sample < 0 || e.o.sample > time.Minute {
		return e.usageErr("--sample must be between 0 and 1m, got %s", e.o.sample)
	}
	if e.o.stallAfter <= 0 {
		return e.usageErr("--stall-after must be positive, got %s", e.o.stallAfter)
	}
	in := diagnose.Input{StallAfter: e.o.stallAfter}
	first, err := look(ctx, e.admin)
	if err != nil {
		return e.fail(err)
	}
	in.Now = first
	if e.o.sample > 0 {
		select {
		case <-time.After(e.o.sample):
		case <-ctx.Done():
			return e.fail(ctx.Err())
		}
		second, err := look(ctx, e.admin)
		if err != nil {
			return e.fail(err)
		}
		in.Before, in.Now = &first, second
	}
	d := diagnose.Diagnose(in)

	if e.o.json {
		if err := writeJSON(e.stdout, statusJSON(in.Now, d)); err != nil {
			return e.fail(err)
		}
	} else {
		printStatus(e, in.Now, d)
	}
	e.judged = true
	return statusCode(d.Verdict)
}

// statusCode is the exit code of a verdict: its state's, as pagers read it.
func statusCode(v diagnose.Verdict) int {
	switch v.State() {
	case diagnose.StateOK:
		return statusOK
	case diagnose.StateWarning:
		return statusWarning
	}
	return statusCritical
}

type jsonStatus struct {
	App             string        `json:"app"`
	Table           string        `json:"table"`
	MaxAttempts     int           `json:"max_attempts"`
	At              time.Time     `json:"at"`
	Verdict         string        `json:"verdict"`
	State           string        `json:"state"`
	ExitCode        int           `json:"exit_code"`
	Cause           string        `json:"cause"`
	Summary         string        `json:"summary"`
	Trend           string        `json:"trend,omitempty"`
	Waiting         int64         `json:"waiting"`
	Pending         int64         `json:"pending"`
	Retrying        int64         `json:"retrying"`
	Backoff         int64         `json:"backoff"`
	Dead            int64         `json:"dead"`
	Sent            int64         `json:"sent"`
	SentEstimated   bool          `json:"sent_estimated"`
	LagSeconds      float64       `json:"lag_seconds"`
	InRecovery      bool          `json:"in_recovery"`
	DefaultReadOnly bool          `json:"default_read_only"`
	Types           []jsonType    `json:"types"`
	Election        []jsonHolder  `json:"election"`
	Replicas        []jsonReplica `json:"replicas"`
	OtherApps       []jsonReplica `json:"other_apps"`
	MissingIndexes  []jsonIndex   `json:"missing_indexes"`
}

type jsonIndex struct {
	Name      string `json:"name"`
	Statement string `json:"statement"`
}

func statusJSON(l diagnose.Look, d diagnose.Diagnosis) jsonStatus {
	o := l.Overview
	s := jsonStatus{App: o.AppName, Table: o.Table, MaxAttempts: o.MaxAttempts, At: o.At.UTC(),
		Verdict: string(d.Verdict), State: d.Verdict.State(), ExitCode: statusCode(d.Verdict), Cause: d.Cause, Summary: d.Summary, Trend: d.Trend,
		Waiting: o.Pending + o.Retrying, Pending: o.Pending, Retrying: o.Retrying, Backoff: o.Backoff, Dead: o.Dead,
		Sent: o.Sent, SentEstimated: o.SentEstimated, LagSeconds: o.Lag.Seconds(),
		InRecovery: o.InRecovery, DefaultReadOnly: o.DefaultReadOnly,
		Types: make([]jsonType, 0, len(o.Types)), Election: holdersJSON(l.Holders),
		Replicas: replicasJSON(l.Replicas), OtherApps: replicasJSON(l.Others), MissingIndexes: []jsonIndex{}}
	for _, m := range o.MissingIndexes {
		s.MissingIndexes = append(s.MissingIndexes, jsonIndex{m.Name, m.Statement})
	}
	for _, t := range o.Types {
		jt := jsonType{Type: t.Type, Pending: t.Pending, Retrying: t.Retrying, Backoff: t.Backoff, NextRetry: timePtr(t.NextRetry), Dead: t.Dead,
			LagSeconds: t.Lag.Seconds(), Next: headJSON(t.Next), Oldest: headJSON(t.Oldest), FirstDead: headJSON(t.FirstDead)}
		if !o.SentEstimated {
			sent := t.Sent
			jt.Sent = &sent
		}
		s.Types = append(s.Types, jt)
	}
	return s
}

func printStatus(e *env, l diagnose.Look, d diagnose.Diagnosis) {
	o := l.Overview
	w := e.stdout
	fprintf(w, "app %s, table %s, MaxAttempts %d, database clock %s\n\n", o.AppName, o.Table, o.MaxAttempts, stamp(o.At))
	fprintf(w, "%s: %s\n\n", strings.ToUpper(string(d.Verdict)), d.Summary)

	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fprintf(tw, "type\tpending\tretrying\tin backoff\tdead\tsent\twaiting longest\tlag\t\n")
	sent := func(n int64) string {
		if o.SentEstimated {
			return "-"
		}
		return num(n)
	}
	for _, t := range o.Types {
		oldest, lag := "-", "-"
		switch {
		case t.Oldest != nil:
			oldest = fmt.Sprintf("id %d", t.Oldest.ID)
			lag = diagnose.Duration(t.Lag)
		case t.Backoff > 0:
			oldest = "retry at " + t.NextRetry.UTC().Format("15:04:05Z")
		}
		fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", t.Type, num(t.Pending), num(t.Retrying), num(t.Backoff), num(t.Dead), sent(t.Sent), oldest, lag)
	}
	total := num(o.Sent)
	if o.SentEstimated {
		total = "~" + total
	}
	lag := "-"
	if o.Pending+o.Retrying > 0 {
		lag = diagnose.Duration(o.Lag)
	}
	fprintf(tw, "all types\t%s\t%s\t%s\t%s\t%s\t\t%s\t\n", num(o.Pending), num(o.Retrying), num(o.Backoff), num(o.Dead), total, lag)
	_ = tw.Flush()
	if o.SentEstimated {
		fprintf(w, "(~: the SENT rows are the planner's estimate on a table this large; they are not counted)\n")
	}
	fprintf(w, "(lag: how long the relays have kept a row waiting, since it was written or re-queued, or its retry came due; "+
		"rows in a retry's backoff wait for their destination)\n")
	for _, t := range o.Types {
		if h := t.FirstDead; h != nil {
			fprintf(w, "dead:     %s: %s row(s), the first (id %d) %s\n", t.Type, num(t.Dead), h.ID, diagnose.Died(*h, o.MaxAttempts))
		}
	}
	fprintf(w, "\n")

	printElection(e, o.AppName, l.Holders)
	printReplicas(e, o.AppName, l.Replicas)
	for _, r := range l.Others {
		fprintf(w, "other app: %s serves %s here: %s\n", appName(r), quoted(r.Types), diagnose.Replica(r))
	}
	server := "accepts writes"
	switch {
	case o.InRecovery:
		server = "READ-ONLY: a standby in recovery"
	case o.DefaultReadOnly:
		server = "READ-ONLY for this role: default_transaction_read_only is on"
	}
	fprintf(w, "server:   %s\n", server)
	if len(o.MissingIndexes) == 0 {
		fprintf(w, "indexes:  the relay's indexes are all there\n")
	} else {
		fprintf(w, "indexes:  MISSING %d of the relay's indexes; add them with:\n", len(o.MissingIndexes))
		for _, m := range o.MissingIndexes {
			fprintf(w, "  %s\n", m.Statement)
		}
	}
	if d.Trend != "" {
		fprintf(w, "lag:      %s\n", d.Trend)
	}
}

// printElection writes who holds the election, one line each.
func printElection(e *env, app string, hs []relay.LockHolder) {
	key := app + relay.LockKeySuffix
	if len(hs) == 0 {
		fprintf(e.stdout, "election: %s is free: nobody holds it right now (normal between passes)\n", key)
		return
	}
	for _, h := range hs {
		verb := "held by"
		if !h.Granted {
			verb = "waited for by"
		}
		fprintf(e.stdout, "election: %s %s %s %s\n", h.Key, h.Mode, verb, diagnose.Holder(h))
	}
}

// printReplicas writes the app's live relays, one line each.
func printReplicas(e *env, app string, reps []relay.Replica) {
	if len(reps) == 0 {
		fprintf(e.stdout, "replicas: no relay of app %q is running (none holds its presence)\n", app)
		return
	}
	fprintf(e.stdout, "replicas: %d relay(s) of app %q running:\n", len(reps), app)
	for _, r := range reps {
		fprintf(e.stdout, "  %s\n", diagnose.Replica(r))
	}
}

// appName names a relay's app, "app ?" when its session cannot be read.
func appName(r relay.Replica) string {
	if r.App == "" {
		return "app ? (grant pg_read_all_stats to read it)"
	}
	return fmt.Sprintf("app %q", r.App)
}

func quoted(ss []string) string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = fmt.Sprintf("%q", s)
	}
	if len(q) == 0 {
		return "types it does not name"
	}
	return strings.Join(q, ", ")
}
