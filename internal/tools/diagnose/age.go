package diagnose

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/xadm/relay"
)

// This file is the pager's measure (issue 46): per type of the app, the age
// of its oldest message not yet delivered, whatever it waits for
// ([relay.TypeOverview.Age]), against thresholds in the Nagios plugin
// convention: beyond the warning threshold WARNING, beyond the critical one
// CRITICAL, even when the cause is the destination. The cause stays in the
// words, so that the page says whom to call.

// The default thresholds of the delivery age: a healthy relay keeps a
// message about one Interval (1s); a destination whose failures pause its
// type is probed every 5s to a minute; retries back off for 17 minutes
// before a message dies. Five minutes is then no blip, and fifteen is a
// quarter of an hour of users without their messages.
const (
	WarningDefault  = 5 * time.Minute
	CriticalDefault = 15 * time.Minute
)

// Thresholds are the delivery ages that make a type WARNING and CRITICAL.
type Thresholds struct {
	// Warning and Critical apply to every type without its own; 0 means
	// WarningDefault and CriticalDefault.
	Warning, Critical time.Duration
	// PerType are the types' own, by type.
	PerType map[string]Threshold
}

// Threshold is one type's thresholds; a zero field keeps the default's.
type Threshold struct{ Warning, Critical time.Duration }

// For returns typ's thresholds.
func (t Thresholds) For(typ string) (warning, critical time.Duration) {
	warning, critical = cmpOr(t.Warning, WarningDefault), cmpOr(t.Critical, CriticalDefault)
	if o, ok := t.PerType[typ]; ok {
		warning, critical = cmpOr(o.Warning, warning), cmpOr(o.Critical, critical)
	}
	return warning, critical
}

func cmpOr(d, def time.Duration) time.Duration {
	if d > 0 {
		return d
	}
	return def
}

// TypeState is one type of the app as the pager sees it.
type TypeState struct {
	Type              string
	State             string        // StateOK, StateWarning or StateCritical, by its age
	Age               time.Duration // of its oldest message not yet delivered
	Warning, Critical time.Duration // its thresholds
	Waiting, Dead     int64
	Paused            bool
	Stuck             int // abandoned Sends still running, on every replica
	// Cause says what its messages wait for, in a few words: "destination
	// failing since 12:03Z", "type paused", "no relay", "stuck Sends";
	// "" when nothing waits.
	Cause string
}

// typeStates are the app's types as the pager sees them, by type.
func (j *judge) typeStates() []TypeState {
	var out []TypeState
	types := slices.Clone(j.o.Types)
	// The types the app's relays deliver, with rows or not: the perfdata
	// graphs each of them from its first look.
	for _, r := range j.in.Now.Replicas {
		for _, typ := range r.Types {
			if r.Delivers(typ) && !slices.ContainsFunc(types, func(t relay.TypeOverview) bool { return t.Type == typ }) &&
				!slices.ContainsFunc(j.foreign, func(t relay.TypeOverview) bool { return t.Type == typ }) {
				types = append(types, relay.TypeOverview{Type: typ})
			}
		}
	}
	slices.SortFunc(types, func(a, b relay.TypeOverview) int { return strings.Compare(a.Type, b.Type) })
	for _, t := range types {
		w, c := j.in.Thresholds.For(t.Type)
		s := TypeState{Type: t.Type, State: StateOK, Age: t.Age, Warning: w, Critical: c, Waiting: t.Pending + t.Retrying, Dead: t.Dead}
		_, _, s.Paused = pauseOf(j.in.Now.Replicas, t.Type)
		for _, r := range j.in.Now.Replicas {
			for _, k := range r.Stuck {
				if k.Type == t.Type {
					s.Stuck += k.Sends
				}
			}
		}
		switch {
		case t.Age >= c || s.Stuck > 0 && s.Paused && strings.Contains(pauseReason(j.in.Now.Replicas, t.Type), stuckReason):
			s.State = StateCritical // late, or nothing of it is sent while its stuck Sends run (stuckVerdict)
		case t.Age >= w || s.Stuck > 0:
			s.State = StateWarning
		}
		if s.Waiting > 0 {
			s.Cause = j.causeOf(t)
		}
		out = append(out, s)
	}
	return out
}

// causeOf says, in a few words, what t's oldest messages wait for.
func (j *judge) causeOf(t relay.TypeOverview) string {
	l := j.in.Now
	if p := j.holderOf(relay.HolderPause); p != nil {
		return "delivery paused by relayctl pause"
	}
	if j.o.InRecovery || j.o.DefaultReadOnly {
		return "server read-only"
	}
	var stuck time.Time
	for _, r := range l.Replicas {
		for _, k := range r.Stuck {
			if k.Type == t.Type && (stuck.IsZero() || k.Since.Before(stuck)) {
				stuck = k.Since
			}
		}
	}
	if !stuck.IsZero() {
		return "stuck Sends since " + clock(stuck)
	}
	if p, _, ok := pauseOf(l.Replicas, t.Type); ok {
		return "destination failing since " + clock(p.Since) + ", type paused"
	}
	if l.PresenceKnown {
		serves, delivers := false, false
		var to []string
		for _, r := range l.Replicas {
			serves = serves || r.Serves(t.Type) || r.UnnamedTypes > 0
			delivers = delivers || r.Delivers(t.Type) || r.UnnamedTypes > 0
			for _, y := range r.Yielded {
				if y.Type == t.Type {
					to = append(to, y.App)
				}
			}
		}
		switch {
		case len(l.Replicas) == 0 && granted(l.Holders) == nil:
			return "no relay of app " + j.o.AppName + " runs"
		case !serves:
			return "no relay has its sender"
		case !delivers && len(to) > 0:
			slices.Sort(to)
			return "yielded to app " + strings.Join(slices.Compact(to), ", ")
		}
	}
	if t.Next != nil && t.Next.Status == "ERROR" || t.Backoff > 0 {
		return "destination failing"
	}
	if t.Lag > 0 {
		return "relays behind"
	}
	return "waiting"
}

// clock writes t as the first line says a time: 12:03Z, or with its day
// when it is not today's.
func clock(t time.Time) string {
	t = t.UTC()
	if time.Since(t) > 20*time.Hour {
		return t.Format("Jan 2 15:04Z")
	}
	return t.Format("15:04Z")
}

// ageVerdict makes the verdict LATE, WARNING or CRITICAL, when a type's
// oldest message not yet delivered is older than its threshold and the
// verdict is not already CRITICAL: users do not get their messages, whatever
// the cause; the earlier verdict's words become notes.
func (j *judge) ageVerdict(states []TypeState) {
	worst := ""
	for _, s := range states {
		if rank(s.State) > rank(worst) {
			worst = s.State
		}
	}
	if worst == "" || worst == StateOK || rank(worst) <= rank(j.d.State) {
		return
	}
	var late []string
	for _, s := range states {
		if s.State == worst {
			late = append(late, fmt.Sprintf("%q's oldest message not yet delivered has waited %s (%s; %s at %s)",
				s.Type, Duration(s.Age), s.Cause, strings.ToLower(worst), Duration(threshold(s, worst))))
		}
	}
	j.notes = append([]string{j.lead}, j.notes...)
	j.set(Late, CauseLate, fmt.Sprintf("Users are waiting: %s. The cause is said in parentheses; "+
		"the age counts whatever a message waits for, its destination included.", strings.Join(late, "; ")))
	j.d.State = worst
}

func threshold(s TypeState, state string) time.Duration {
	if state == StateCritical {
		return s.Critical
	}
	return s.Warning
}

// rank orders states: OK < WARNING < CRITICAL.
func rank(state string) int {
	switch state {
	case StateWarning:
		return 1
	case StateCritical:
		return 2
	case StateUnknown:
		return 3
	}
	return 0
}

// overlapVerdict makes an OK or DEAD verdict OVERLAP (WARNING) while
// another app's live relays have a sender for one of the app's types on its
// table: one app yields the type to the other (one type, one app), and a
// deploy or a mistake is under way.
func (j *judge) overlapVerdict() {
	over := j.overlaps()
	if len(over) == 0 {
		return
	}
	var parts []string
	for _, o := range over {
		parts = append(parts, o.text)
	}
	text := fmt.Sprintf("Two apps have a sender for the same type on %s: %s. One type, one app: the app that delivered it first "+
		"keeps it and the other yields it until the first one's relays stop (a renamed app in a rolling deploy takes over so). "+
		"Finish the deploy, or remove the sender from the app that should not have it.", j.o.Table, strings.Join(parts, "; "))
	if j.d.Verdict != OK && j.d.Verdict != Dead {
		j.note("%s", text)
		return
	}
	j.notes = append([]string{j.lead}, j.notes...)
	j.set(Overlap, CauseOverlap, text)
	j.d.State = StateWarning
}

// stuckVerdict makes an OK, DEAD or OVERLAP verdict STUCK while a relay has
// Sends that ignored their context and still run: WARNING, CRITICAL when
// their type is paused for them (StuckSendsMax reached: nothing of it is
// sent). A Sender that does not return is a defect an operator must see
// before the bound stops the type; each stuck Send holds its key.
func (j *judge) stuckVerdict() {
	var parts []string
	critical := false
	for _, r := range j.in.Now.Replicas {
		for _, k := range r.Stuck {
			bound := ""
			if strings.Contains(pauseReason([]relay.Replica{r}, k.Type), stuckReason) {
				critical = true
				bound = ", the relay's bound (StuckSendsMax): the type is paused until fewer run"
			}
			parts = append(parts, fmt.Sprintf("%d Send(s) of %q on replica %s, the oldest since %s%s",
				k.Sends, k.Type, r.ID, clock(k.Since), bound))
		}
	}
	if len(parts) == 0 {
		return
	}
	text := fmt.Sprintf("Sends ignored their context past SendTimeout and still run: %s. Each holds its key's later "+
		"messages (per-key order) while the type's other keys go on. The Sender must return when its context ends: fix it "+
		"(docs/operations.md, \"Stuck Sends\"); restarting the replica ends them, and their messages are sent again.",
		strings.Join(parts, "; "))
	state := StateWarning
	if critical {
		state = StateCritical
	}
	if j.d.Verdict != OK && j.d.Verdict != Dead && j.d.Verdict != Overlap {
		j.note("%s", text) // stalled or paused: CRITICAL already
		return
	}
	j.notes = append([]string{j.lead}, j.notes...)
	j.set(Stuck, CauseStuckSends, text)
	j.d.State = state
}

// stuckReason is in the reason of a type paused because its stuck Sends
// reached StuckSendsMax (internal/pass/stuck.go), within presence's 80 bytes.
const stuckReason = "ignored their context and still run"

// pauseReason is why a replica of reps paused typ; "" when none did.
func pauseReason(reps []relay.Replica, typ string) string {
	p, _, _ := pauseOf(reps, typ)
	return p.Reason
}

type overlap struct {
	typ, text string
}

// overlaps are the types of the app (or yielded by it) that relays of
// another app on the table also have a sender for.
func (j *judge) overlaps() []overlap {
	l := j.in.Now
	var out []overlap
	types := map[string]bool{}
	for _, r := range l.Replicas {
		for _, t := range r.Types {
			types[t] = true
		}
	}
	names := make([]string, 0, len(types))
	for t := range types {
		names = append(names, t)
	}
	slices.Sort(names)
	for _, t := range names {
		var who []string
		ours, oursYield := false, false
		for _, r := range l.Replicas {
			if r.Serves(t) {
				ours = true
				oursYield = oursYield || r.Yields(t)
			}
		}
		for _, r := range l.Others {
			if !r.Serves(t) {
				continue
			}
			name := strconv.Quote(r.App)
			if r.App == "" {
				name = "an app this role cannot name"
			}
			if r.Yields(t) {
				name += " (yields it)"
			} else {
				name += " (delivers it)"
			}
			who = append(who, name)
		}
		if !ours || len(who) == 0 {
			continue
		}
		slices.Sort(who)
		who = slices.Compact(who)
		mine := strconv.Quote(j.o.AppName) + " (delivers it)"
		if oursYield {
			mine = strconv.Quote(j.o.AppName) + " (yields it)"
		}
		out = append(out, overlap{typ: t, text: fmt.Sprintf("type %q by apps %s and %s", t, mine, strings.Join(who, ", "))})
	}
	return out
}

// FirstLine is the plugin's first line: the state and the verdict alone, at
// most FirstLineMax characters, for a pager's SMS.
func (d Diagnosis) FirstLine() string { return d.firstLine }

// FirstLineMax bounds [Diagnosis.FirstLine].
const FirstLineMax = 120

// firstLine writes the verdict in one short line.
func (j *judge) firstLine(states []TypeState) string {
	state := j.d.State
	var what string
	switch j.d.Verdict {
	case Late:
		var worst []TypeState
		for _, s := range states {
			if s.State == state {
				worst = append(worst, s)
			}
		}
		slices.SortFunc(worst, func(a, b TypeState) int { return int(b.Age - a.Age) })
		w := worst[0]
		what = fmt.Sprintf("%s: oldest undelivered %s (%s)", w.Type, Duration(w.Age), w.Cause)
		if len(worst) > 1 {
			what += fmt.Sprintf("; %d more type(s)", len(worst)-1)
		}
	case Paused:
		what = fmt.Sprintf("delivery of app %s paused by relayctl pause; %s waiting", j.o.AppName, Count(j.d.Waiting))
	case Stalled:
		what = j.stalledLine(states)
	case Overlap:
		o := j.overlaps()
		what = fmt.Sprintf("type %s served by two apps on %s", o[0].typ, j.o.Table)
		if len(o) > 1 {
			what += fmt.Sprintf("; %d more type(s)", len(o)-1)
		}
	case Stuck:
		n, types := 0, []string{}
		for _, s := range states {
			if s.Stuck > 0 {
				n += s.Stuck
				types = append(types, s.Type)
			}
		}
		what = fmt.Sprintf("%d stuck Send(s) of %s: a Sender ignores its context", n, strings.Join(types, ", "))
	case Dead:
		what = fmt.Sprintf("%s dead message(s) wait for an operator", Count(j.o.Dead))
		var parts []string
		for _, t := range j.o.Types {
			if t.Dead > 0 {
				parts = append(parts, fmt.Sprintf("%s %s", t.Type, Count(t.Dead)))
			}
		}
		what += " (" + strings.Join(parts, ", ") + ")"
	default:
		if j.d.Waiting == 0 {
			what = "nothing waits to be delivered"
		} else {
			what = fmt.Sprintf("%s waiting, oldest undelivered %s", Count(j.d.Waiting), Duration(j.o.Age))
		}
	}
	line := strings.ReplaceAll(state+": "+what, "|", "/")
	return Cut(line, FirstLineMax-1)
}

// stalledLine says a STALLED verdict in a few words.
func (j *judge) stalledLine(states []TypeState) string {
	var worst *TypeState
	for i := range states {
		if states[i].Waiting > 0 && (worst == nil || states[i].Age > worst.Age) {
			worst = &states[i]
		}
	}
	if worst == nil {
		return "nothing is delivered (" + j.d.Cause + ")"
	}
	cause := worst.Cause
	switch j.d.Cause {
	case CauseReadOnly:
		cause = "server read-only"
	case CauseHeldByOther:
		cause = "election held by another client"
	case CauseRelayStuck:
		cause = "relay stuck in a pass"
	case CauseNoneElected:
		cause = "no relay takes the election"
	case CauseNotMoving, CauseTypeMissing:
		if cause == "waiting" || cause == "relays behind" {
			cause = "rows not moving"
		}
	}
	return fmt.Sprintf("%s: nothing delivered, oldest undelivered %s (%s)", worst.Type, Duration(worst.Age), cause)
}

// Perfdata is the plugin's performance data, Nagios' syntax
// ('label'=value[unit];warn;crit;min;max), per type of the app: the age of
// its oldest message not yet delivered (with its thresholds), the messages
// waiting, dead and its stuck Sends, and whether a relay paused it.
func (d Diagnosis) Perfdata() []string {
	var out []string
	for _, s := range d.Types {
		label := perfLabel(s.Type)
		paused := 0
		if s.Paused {
			paused = 1
		}
		out = append(out,
			fmt.Sprintf("'%s age'=%.0fs;%.0f;%.0f;0", label, s.Age.Seconds(), s.Warning.Seconds(), s.Critical.Seconds()),
			fmt.Sprintf("'%s waiting'=%d;;;0", label, s.Waiting),
			fmt.Sprintf("'%s dead'=%d;;;0", label, s.Dead),
			fmt.Sprintf("'%s paused'=%d;;;0;1", label, paused),
			fmt.Sprintf("'%s stuck'=%d;;;0", label, s.Stuck))
	}
	return out
}

// perfLabel is typ as a perfdata label may hold it: no quote, no equals
// sign, no pipe.
func perfLabel(typ string) string {
	return strings.Map(func(r rune) rune {
		switch r {
		case '\'', '=', '|', '\n', '\r':
			return '_'
		}
		return r
	}, typ)
}
