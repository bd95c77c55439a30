package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/xadm/relay"
	"github.com/xadm/relay/internal/tools/diagnose"
)

// The --json shapes: snake_case, durations in seconds, times in RFC 3339.

type jsonHolder struct {
	Key             string     `json:"key"`
	Mode            string     `json:"mode"`
	Granted         bool       `json:"granted"`
	Kind            string     `json:"kind"`
	Description     string     `json:"description"`
	Since           *time.Time `json:"since,omitempty"`
	HeldSeconds     *float64   `json:"held_seconds,omitempty"`
	Replica         string     `json:"replica,omitempty"`
	PID             int        `json:"pid"`
	User            string     `json:"user"`
	ApplicationName string     `json:"application_name"`
	ClientAddr      string     `json:"client_addr"`
	BackendStart    *time.Time `json:"backend_start,omitempty"`
	State           string     `json:"state"`
	StateChange     *time.Time `json:"state_change,omitempty"`
	Hidden          bool       `json:"hidden"`
}

func holderJSON(h relay.LockHolder) jsonHolder {
	j := jsonHolder{Key: h.Key, Mode: h.Mode, Granted: h.Granted, Kind: string(h.Kind), Description: diagnose.Holder(h),
		Replica: h.Replica, PID: h.PID, User: h.User, ApplicationName: h.ApplicationName, ClientAddr: h.ClientAddr,
		State: h.State, Hidden: h.Hidden, Since: timePtr(h.Since), BackendStart: timePtr(h.BackendStart), StateChange: timePtr(h.StateChange)}
	if !h.Since.IsZero() {
		s := h.HeldFor().Seconds()
		j.HeldSeconds = &s
	}
	return j
}

func holdersJSON(hs []relay.LockHolder) []jsonHolder {
	out := make([]jsonHolder, 0, len(hs))
	for _, h := range hs {
		out = append(out, holderJSON(h))
	}
	return out
}

// jsonHead is a row: attempts is the column (a dead row's holds the
// ceiling, whatever killed it), attempts_made the attempts really made.
type jsonHead struct {
	ID           int64      `json:"id"`
	Status       string     `json:"status"`
	Attempts     int        `json:"attempts"`
	AttemptsMade int        `json:"attempts_made"`
	Permanent    bool       `json:"permanent"`
	CreatedAt    time.Time  `json:"created_at"`
	WaitingSince *time.Time `json:"waiting_since,omitempty"`
	NextAttempt  *time.Time `json:"next_attempt,omitempty"`
	LastError    string     `json:"last_error"`
}

func headJSON(h *relay.RowHead) *jsonHead {
	if h == nil {
		return nil
	}
	return &jsonHead{ID: h.ID, Status: h.Status, Attempts: h.Attempts, AttemptsMade: h.AttemptsMade, Permanent: h.Permanent,
		CreatedAt: h.CreatedAt.UTC(), WaitingSince: timePtr(h.WaitingSince), NextAttempt: timePtr(h.NextAttempt), LastError: h.LastError}
}

type jsonType struct {
	Type            string     `json:"type"`
	App             string     `json:"app,omitempty"`
	State           string     `json:"state"` // by its age: OK, WARNING or CRITICAL
	Cause           string     `json:"cause,omitempty"`
	AgeSeconds      float64    `json:"age_seconds"` // its oldest message not yet delivered
	WarningSeconds  float64    `json:"warning_seconds"`
	CriticalSeconds float64    `json:"critical_seconds"`
	Paused          bool       `json:"paused"`
	Stuck           int        `json:"stuck_sends"`
	Undelivered     *jsonHead  `json:"undelivered,omitempty"`
	Pending         int64      `json:"pending"`
	Retrying        int64      `json:"retrying"`
	Backoff         int64      `json:"backoff"` // of retrying: in their backoff, not behind
	NextRetry       *time.Time `json:"next_retry,omitempty"`
	Dead            int64      `json:"dead"`
	Sent            *int64     `json:"sent,omitempty"` // absent when estimated
	LagSeconds      float64    `json:"lag_seconds"`    // how long the relays have kept oldest waiting
	Next            *jsonHead  `json:"next,omitempty"`
	Oldest          *jsonHead  `json:"oldest,omitempty"`
	FirstDead       *jsonHead  `json:"first_dead,omitempty"`
}

func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	u := t.UTC()
	return &u
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// num writes n with thousands separators: 1,000,000.
func num(n int64) string { return diagnose.Count(n) }

// oneLine flattens s to one line of at most n runes, for a table cell.
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	return diagnose.Cut(s, n)
}

func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339) }

func fprintf(w io.Writer, format string, args ...any) { _, _ = fmt.Fprintf(w, format, args...) }

type jsonReplica struct {
	ID              string         `json:"id"`
	App             string         `json:"app,omitempty"`
	Table           string         `json:"table,omitempty"`
	Description     string         `json:"description"`
	Types           []string       `json:"types"`
	UnnamedTypes    int            `json:"unnamed_types"`
	MaxAttempts     int            `json:"max_attempts"`
	Partitions      int            `json:"partitions"`
	Elected         bool           `json:"elected"`
	Held            []int          `json:"held"`
	Host            string         `json:"host,omitempty"`
	Process         int            `json:"process,omitempty"`
	PID             int            `json:"pid"`
	ApplicationName string         `json:"application_name"`
	ClientAddr      string         `json:"client_addr"`
	BackendStart    *time.Time     `json:"backend_start,omitempty"`
	Hidden          bool           `json:"hidden"`
	Paused          []jsonPaused   `json:"paused"`
	Yielded         []jsonYield    `json:"yielded"`
	Stuck           []jsonStuck    `json:"stuck"`
	Retention       *jsonRetention `json:"retention,omitempty"`
}

// jsonYield is a type a relay yields to another app (relay.YieldedType).
type jsonYield struct {
	Type  string    `json:"type"`
	App   string    `json:"app"`
	Since time.Time `json:"since"`
}

// jsonStuck is a type's abandoned Sends still running (relay.StuckSends).
type jsonStuck struct {
	Type  string    `json:"type"`
	Sends int       `json:"sends"`
	Since time.Time `json:"since"`
}

// jsonRetention is a relay's last retention run (relay.RetentionRun).
type jsonRetention struct {
	At          time.Time `json:"at"`
	Deleted     int64     `json:"deleted"`
	Error       string    `json:"error,omitempty"`
	AgeSeconds  float64   `json:"age_seconds"`
	TookSeconds float64   `json:"took_seconds"`
	Total       int64     `json:"total"`
}

// jsonPaused is a type a relay paused (relay.PausedType).
type jsonPaused struct {
	Type    string    `json:"type"`
	Reason  string    `json:"reason,omitempty"`
	Since   time.Time `json:"since"`
	Until   time.Time `json:"until"` // its next probe
	Probing bool      `json:"probing"`
}

func replicasJSON(reps []relay.Replica) []jsonReplica {
	out := make([]jsonReplica, 0, len(reps))
	for _, r := range reps {
		out = append(out, jsonReplica{ID: r.ID, App: r.App, Table: r.Table, Description: diagnose.Replica(r), Types: r.Types, UnnamedTypes: r.UnnamedTypes,
			MaxAttempts: r.MaxAttempts, Partitions: r.Partitions, Elected: r.Elected, Held: r.Held, Host: r.Host, Process: r.Process,
			PID: r.PID, ApplicationName: r.ApplicationName, ClientAddr: r.ClientAddr, BackendStart: timePtr(r.BackendStart), Hidden: r.Hidden,
			Paused: make([]jsonPaused, 0, len(r.Paused))})
		j := &out[len(out)-1]
		for _, p := range r.Paused {
			j.Paused = append(j.Paused, jsonPaused(p))
		}
		j.Yielded, j.Stuck = []jsonYield{}, []jsonStuck{}
		for _, y := range r.Yielded {
			j.Yielded = append(j.Yielded, jsonYield(y))
		}
		for _, k := range r.Stuck {
			j.Stuck = append(j.Stuck, jsonStuck(k))
		}
		if x := r.Retention; x != nil {
			j.Retention = &jsonRetention{At: x.At, Deleted: x.Deleted, Error: x.Err, AgeSeconds: x.Age.Seconds(), TookSeconds: x.Took.Seconds(), Total: x.Total}
		}
	}
	return out
}
