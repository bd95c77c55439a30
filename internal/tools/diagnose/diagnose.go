// Package diagnose answers the operator's first question, "why is nothing
// being delivered?", from what [relay.Admin] reads: the table's live rows,
// the election's holders and, when there is one, an earlier look to tell
// whether delivery moves. relayctl status and the console say the same thing
// because they both ask this package.
package diagnose

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/xadm/relay"
)

// StallAfterDefault is how long a row may wait before delivery counts as
// stalled, when nothing better tells: well above a healthy relay's lag (about
// one Interval), well below what an operator would notice.
const StallAfterDefault = time.Minute

// Look is one look at an app's table and election.
type Look struct {
	Overview relay.Overview
	Holders  []relay.LockHolder
	// Replicas are the app's live relays ([relay.Admin.Replicas]), read when
	// PresenceKnown: a caller that did not read them leaves it false, and the
	// diagnosis then goes without.
	Replicas      []relay.Replica
	PresenceKnown bool
	// Others are the live relays of other apps on the table
	// ([relay.Admin.OtherReplicas]): the rows of the types they serve, and
	// the app's own relays do not, are theirs, not counted in the verdict.
	Others []relay.Replica
}

// Input is what Diagnose judges.
type Input struct {
	Now Look
	// Before is an earlier look at the same app, to tell whether the oldest
	// rows move and the lag grows; nil when there is none.
	Before *Look
	// StallAfter is how long a row may wait before delivery counts as
	// stalled. 0 means StallAfterDefault.
	StallAfter time.Duration
	// Stats is this process's relay's, when the caller runs one (the
	// console); nil otherwise.
	Stats *relay.Stats
	// Thresholds are the delivery ages that make a type WARNING and
	// CRITICAL; the zero value is WarningDefault and CriticalDefault.
	Thresholds Thresholds
}

// Verdict is Diagnose's one-word answer.
type Verdict string

// The verdicts, from the most urgent: when several hold, the first is the
// verdict (docs/operations.md, "A status to page on").
const (
	Paused  Verdict = "paused"  // an operator's pause holds the election
	Stalled Verdict = "stalled" // rows wait and nothing delivers them
	Late    Verdict = "late"    // a type's oldest message not yet delivered is older than its threshold (WARNING or CRITICAL)
	Stuck   Verdict = "stuck"   // Sends ignored their context and still run (WARNING; CRITICAL once their type paused for them)
	Overlap Verdict = "overlap" // two apps have a sender for one type on the table (WARNING)
	Dead    Verdict = "dead"    // dead rows need an operator, whatever else waits
	OK      Verdict = "ok"      // delivering, waiting out retries, or nothing waits
)

// The states of [Verdict.State]: Nagios' names, which pagers expect.
const (
	StateOK       = "OK"
	StateWarning  = "WARNING"
	StateCritical = "CRITICAL"
	StateUnknown  = "UNKNOWN" // no verdict: the look failed
)

// State is the verdict's state as pagers name it: OK, WARNING for dead
// rows (an operator must act, nothing is late) and an overlap, CRITICAL when
// nothing delivers (stalled or paused). A LATE verdict's state depends on
// the threshold crossed: use [Diagnosis.State].
func (v Verdict) State() string {
	switch v {
	case OK:
		return StateOK
	case Dead, Overlap, Stuck:
		return StateWarning
	}
	return StateCritical
}

// Causes name why, for scripts (relayctl status --json).
const (
	CauseIdle        = "idle"             // nothing waits
	CauseDelivering  = "delivering"       // rows wait, and move
	CauseDeadRows    = "dead-rows"        // nothing waits but dead rows
	CausePaused      = "paused"           // relayctl pause holds the election
	CauseReadOnly    = "read-only"        // the server refuses writes
	CauseHeldByOther = "held-by-other"    // a session that is not a Go relay holds the election and nothing moves
	CauseRelayStuck  = "relay-stuck"      // a Go relay holds the election far too long and nothing moves
	CausePassFails   = "pass-fails"       // this process's passes fail
	CauseRetrying    = "retrying"         // rows wait only for their retries' backoff: the destination fails
	CauseTypePaused  = "type-paused"      // rows wait only in types a relay paused: their destination keeps failing
	CauseTypeMissing = "type-not-drained" // some types move, these do not
	CauseNoRelay     = "no-relay-elected" // nobody takes the election (presence unknown)
	CauseLate        = "late"             // a type's oldest message not yet delivered is older than its threshold
	CauseOverlap     = "overlap"          // two apps have a sender for one type on the table
	CauseStuckSends  = "stuck-sends"      // a relay's Sends ignored their context and still run

	// With presence (Look.PresenceKnown):
	CauseUnserved       = "type-unserved"        // rows of a type no live relay of the app has a sender for
	CauseNoRelayRunning = "no-relay-running"     // rows wait, no relay of the app is running, and they do not move
	CauseNoGoRelay      = "moving-without-relay" // no relay of the app is running, and rows move: a JVM relay
	CauseNoneElected    = "none-elected"         // relays run, serve the types, and none takes the election
	CauseNotMoving      = "rows-not-moving"      // a live relay serves the type, and its rows do not move
)

// Diagnosis is Diagnose's answer.
type Diagnosis struct {
	Verdict Verdict
	Cause   string
	// Summary is one paragraph for a person: what is wrong, who is involved,
	// and what to do. It is Lead followed by Notes.
	Summary string
	// Lead is Summary's first part, the answer; Notes are what else a
	// person should know (dead rows, the trend, a read-only server).
	Lead  string
	Notes []string
	// Trend says how the lag moved since Before: "growing", "shrinking",
	// "steady", or "" without Before.
	Trend string
	// Waiting is how many of the app's rows wait (PENDING and retrying);
	// Lag how long the relays have kept one waiting ([relay.Overview.Lag]);
	// Age how long the oldest message not yet delivered has waited,
	// whatever for ([relay.Overview.Age]).
	Waiting int64
	Lag     time.Duration
	Age     time.Duration
	// State is the pager's state: the verdict's, or, for LATE, the
	// threshold's that was crossed.
	State string
	// Types are the app's types as the pager sees them: each one's age
	// against its thresholds, and the cause ([Diagnosis.Perfdata] is theirs).
	Types []TypeState

	firstLine string
}

// Diagnose judges in.
func Diagnose(in Input) Diagnosis {
	stallAfter := in.StallAfter
	if stallAfter <= 0 {
		stallAfter = StallAfterDefault
	}
	j := judge{stallAfter: stallAfter}
	j.in = in
	j.in.Now.Overview, j.foreign = ours(in.Now)
	if in.Before != nil {
		before := *in.Before
		before.Overview, _ = ours(before)
		before.Overview, _ = notBehind(before)
		j.in.Before = &before
	}
	j.in.Now.Overview, j.paused = notBehind(j.in.Now)
	o := j.in.Now.Overview
	d := Diagnosis{Waiting: o.Pending + o.Retrying, Lag: o.Lag, Age: o.Age}
	j.o, j.d = o, &d
	j.trend()
	j.decide()
	j.deadVerdict()
	d.State = d.Verdict.State()
	d.Types = j.typeStates()
	if d.Verdict == Stalled || d.Verdict == Paused {
		for i := range d.Types { // nothing delivers them, however young
			if d.Types[i].Waiting > 0 {
				d.Types[i].State = StateCritical
			}
		}
	}
	j.overlapVerdict()
	j.stuckVerdict()
	j.ageVerdict(d.Types)
	d.firstLine = j.firstLine(d.Types)
	d.Lead, d.Notes = j.lead, j.notes
	d.Summary = strings.Join(append([]string{j.lead}, j.notes...), " ")
	return d
}

type judge struct {
	in         Input
	o          relay.Overview // of the app's rows only (ours)
	foreign    []relay.TypeOverview
	paused     []pausedType // the waiting types a live relay paused, by name
	stallAfter time.Duration
	d          *Diagnosis

	// moved: with Before, some type's oldest waiting row changed (delivered,
	// or it died). still: with Before, rows waited then and now and no
	// type's oldest waiting row changed.
	moved, still bool
	elapsed      time.Duration

	lead  string
	notes []string
}

func (j *judge) trend() {
	b := j.in.Before
	if b == nil {
		return
	}
	j.elapsed = j.o.At.Sub(b.Overview.At)
	now := heads(j.o)
	for typ, id := range heads(b.Overview) {
		if now[typ] != id {
			j.moved = true
		}
	}
	j.still = !j.moved && len(now) > 0 && len(heads(b.Overview)) > 0
	before, after := b.Overview.Lag, j.o.Lag
	switch {
	case j.d.Waiting == 0 && b.Overview.Pending+b.Overview.Retrying == 0:
		j.d.Trend = "steady"
	case after > before+time.Second/2:
		j.d.Trend = "growing"
	case after < before-time.Second/2:
		j.d.Trend = "shrinking"
	default:
		j.d.Trend = "steady"
	}
}

// heads maps each type with waiting rows to its oldest waiting row's id.
func heads(o relay.Overview) map[string]int64 {
	m := make(map[string]int64)
	for _, t := range o.Types {
		if t.Next != nil {
			m[t.Type] = t.Next.ID
		}
	}
	return m
}

// ours is l's overview without the types that only other apps' live relays
// serve (l.Others), which it returns apart.
func ours(l Look) (relay.Overview, []relay.TypeOverview) {
	o := l.Overview
	if len(l.Others) == 0 {
		return o, o.OtherApps
	}
	var kept, foreign []relay.TypeOverview
	for _, t := range o.Types {
		other, own := false, false
		for _, r := range l.Others {
			other = other || r.Delivers(t.Type)
		}
		for _, r := range l.Replicas {
			own = own || r.Serves(t.Type)
		}
		if other && !own {
			foreign = append(foreign, t)
		} else {
			kept = append(kept, t)
		}
	}
	if len(foreign) == 0 {
		return o, o.OtherApps
	}
	o.Types = kept
	foreign = append(foreign, o.OtherApps...)
	o.Pending, o.Retrying, o.Backoff, o.Dead, o.Lag, o.Age = 0, 0, 0, 0, 0, 0
	for _, t := range kept {
		o.Pending += t.Pending
		o.Retrying += t.Retrying
		o.Backoff += t.Backoff
		o.Dead += t.Dead
		o.Lag = max(o.Lag, t.Lag)
		o.Age = max(o.Age, t.Age)
	}
	return o, foreign
}

// pausedType is a waiting type that a live relay paused.
type pausedType struct {
	relay.TypeOverview
	pause   relay.PausedType
	replica string
}

// notBehind is l's overview with the rows of the types a live relay of the
// app paused ([relay.Replica.Paused]) taken as waiting for their
// destination, as rows in a retry's backoff are: not behind (no Oldest, no
// Lag). It returns those types apart.
func notBehind(l Look) (relay.Overview, []pausedType) {
	o := l.Overview
	var paused []pausedType
	for i, t := range o.Types {
		if t.Next == nil {
			continue
		}
		p, replica, ok := pauseOf(l.Replicas, t.Type)
		if !ok {
			continue
		}
		paused = append(paused, pausedType{TypeOverview: t, pause: p, replica: replica})
		if len(paused) == 1 {
			o.Types = slices.Clone(o.Types)
		}
		o.Types[i].Oldest, o.Types[i].Lag = nil, 0
	}
	if len(paused) > 0 {
		o.Lag = 0
		for _, t := range o.Types {
			o.Lag = max(o.Lag, t.Lag)
		}
	}
	return o, paused
}

// pauseOf is the pause of typ by a replica of reps, and that replica's id.
func pauseOf(reps []relay.Replica, typ string) (relay.PausedType, string, bool) {
	for _, r := range reps {
		for _, p := range r.Paused {
			if p.Type == typ {
				return p, r.ID, true
			}
		}
	}
	return relay.PausedType{}, "", false
}

// pausedText says each paused type: by which replica, why, and when it is
// probed.
func (j *judge) pausedText() string {
	var parts []string
	for _, p := range j.paused {
		when := fmt.Sprintf("probed again at %s (in %s)", p.pause.Until.UTC().Format(time.RFC3339), Duration(max(p.pause.Until.Sub(j.o.At), 0)))
		if p.pause.Probing {
			when = "a message being sent as a probe now"
		}
		reason := ""
		if p.pause.Reason != "" {
			reason = ", after " + quote(Cut(p.pause.Reason, 200))
		}
		parts = append(parts, fmt.Sprintf("%q (%s row(s); paused by replica %s since %s%s; %s)", p.Type, Count(p.Pending+p.Retrying),
			p.replica, p.pause.Since.UTC().Format(time.RFC3339), reason, when))
	}
	return strings.Join(parts, ", ")
}

// pausedLead says that rows wait only in paused types (and backoffs); ""
// when no type is paused.
func (j *judge) pausedLead() string {
	if len(j.paused) == 0 {
		return ""
	}
	return fmt.Sprintf("Nothing waits for the relays: the rows that wait are of type(s) a relay paused because their "+
		"destination keeps failing: %s. The destination fails, not the relays: the other types go on, these rows keep their "+
		"status, attempts and order, and a successful probe resumes the type (docs/operations.md, \"A type paused\").",
		j.pausedText())
}

// pausedNote says, beside another cause, which types are paused.
func (j *judge) pausedNote() {
	if len(j.paused) == 0 || j.d.Cause == CauseTypePaused {
		return
	}
	j.note("Paused by the relays because their destination keeps failing (not counted as behind): %s.", j.pausedText())
}

func (j *judge) set(v Verdict, cause, lead string) {
	j.d.Verdict, j.d.Cause, j.lead = v, cause, lead
}

func (j *judge) note(format string, args ...any) {
	j.notes = append(j.notes, fmt.Sprintf(format, args...))
}

func (j *judge) decide() {
	o := j.o
	app := o.AppName
	late := o.Lag > j.stallAfter
	// Nothing moves: the row kept waiting longest waited too long and no
	// type's oldest row moved since the earlier look, if any. Between passes
	// nobody holds the election, so a look without a holder needs the lag
	// to say more.
	stuck := late && !j.moved
	holder := granted(j.in.Now.Holders)
	pause := j.holderOf(relay.HolderPause)
	// The same session held the election at both looks and no row moved.
	heldThrough := holder != nil && j.still && j.heldBefore(holder.PID)

	defer j.foreignNote()
	defer j.pausedNote()
	defer j.deadNote()
	defer j.trendNote()
	defer j.retryNote()
	defer j.readOnlyNote()
	defer j.ceilingNote()
	defer j.indexNote()

	switch {
	case pause != nil:
		what := fmt.Sprintf("%s row(s) wait, the oldest for %s", Count(j.d.Waiting), Duration(o.Lag))
		if j.d.Waiting == 0 {
			what = "nothing waits right now, but new rows will"
		}
		j.set(Paused, CausePaused, fmt.Sprintf(
			"Nothing is delivered because delivery of app %q is paused: %s holds its election. %s. "+
				"End the pause with `relayctl resume` (or Ctrl-C where relayctl pause runs).",
			app, Holder(*pause), what))
		return
	case j.d.Waiting == 0 && o.Dead > 0:
		j.set(Dead, CauseDeadRows, j.deadLead("Nothing waits to be delivered, but"))
		return
	case j.d.Waiting == 0 && o.Sent == 0:
		j.set(OK, CauseIdle, fmt.Sprintf("Nothing waits to be delivered: %s has no outbound rows.", o.Table))
		return
	case j.d.Waiting == 0 && len(j.foreign) > 0:
		j.set(OK, CauseIdle, fmt.Sprintf("Nothing of app %q waits to be delivered: every outbound row of its types in %s is SENT.", app, o.Table))
		return
	case j.d.Waiting == 0:
		j.set(OK, CauseIdle, fmt.Sprintf("Nothing waits to be delivered: every outbound row of %s is SENT.", o.Table))
		return
	}

	waiting := j.waiting()
	readOnly := o.InRecovery || o.DefaultReadOnly
	if j.in.Now.PresenceKnown && len(j.in.Now.Replicas) == 0 && holder == nil {
		// No relay of the app runs: nothing will deliver these rows, unless a
		// relay without presence (a JVM relay) does, which moves them. Rows
		// that moved while a relay still ran at the earlier look say nothing.
		if j.moved && len(j.in.Before.Replicas) == 0 {
			j.set(OK, CauseNoGoRelay, fmt.Sprintf(
				"Rows move although no relay of this library runs for app %q: a JVM relay of the app (which has no presence) delivers them; %s.",
				app, waiting))
			return
		}
		j.presenceCause(waiting)
		return
	}
	if unserved := j.unserved(); len(unserved) > 0 {
		// Named at once: no relay that runs will ever select these rows.
		reps := j.in.Now.Replicas
		var rows []string
		for _, t := range unserved {
			rows = append(rows, fmt.Sprintf("%q: %s row(s), the oldest (id %d) waiting for %s", t.Type, Count(t.Pending+t.Retrying), t.Next.ID, Duration(j.waited(t))))
		}
		j.set(Stalled, CauseUnserved, fmt.Sprintf(
			"Rows of type %s wait and no running relay of app %q has a sender for them: %s. The %d live replica(s) serve %s. "+
				"Register a Sender for it in the relay of the app that owns these rows (and deploy it), or, if they belong to another app, "+
				"run that app's relay; rows written with a mistaken type can be fixed in SQL.",
			quoteList(typesOf(unserved)), app, strings.Join(rows, "; "), len(reps), quoteList(servedTypes(reps))))
		return
	}
	switch {
	case readOnly && (stuck || j.still):
		why := "the server is a standby in recovery"
		if !o.InRecovery {
			why = "default_transaction_read_only is on for this role and database"
		}
		j.set(Stalled, CauseReadOnly, fmt.Sprintf(
			"Nothing is delivered because the server is read-only (%s): a relay connected to it can read its rows but not record an outcome. %s. "+
				"Point the relays' database URL at the primary.", why, waiting))
		return
	case j.oldestType() == nil:
		// No row waits for the relays (each waits out a backoff, or its type
		// is paused): whoever holds the election, a pass in flight or a
		// partitioned member, is not why they wait.
		if lead := j.pausedLead(); lead != "" {
			j.set(OK, CauseTypePaused, lead)
			return
		}
		j.set(OK, CauseRetrying, j.retryLead())
		return
	case holder != nil && holder.Kind == relay.HolderRelay && holder.Mode == relay.LockShared:
		// Partitioned replicas hold the key for as long as they run.
		members, held, of := partitionsHeld(j.in.Now.Holders)
		share := fmt.Sprintf("%d partitioned replica(s) share the election, holding %d of its %d partitions", members, held, of)
		if stuck {
			j.set(Stalled, CauseRelayStuck, fmt.Sprintf(
				"Nothing is delivered although %s: %s. Look at the replicas' logs (relay: pass failed, or a sender that does not return).",
				share, waiting))
			return
		}
		j.set(OK, CauseDelivering, fmt.Sprintf("Delivering: %s; %s.", share, waiting))
		if held < of {
			j.note("%d partition(s) are held by no replica right now: their rows wait until a replica takes them at its next pass.", of-held)
		}
		return
	case holder != nil && holder.Kind == relay.HolderRelay:
		if (stuck || heldThrough) && holder.HeldFor() > j.stallAfter {
			j.set(Stalled, CauseRelayStuck, fmt.Sprintf(
				"Nothing is delivered because %s and delivers nothing: %s. A pass that long is stuck: a sender that does not return, "+
					"or a statement waiting on a lock. Look at that replica's log; ending its session "+
					"(SELECT pg_terminate_backend(%d)) cancels its pass and lets another replica take the election.",
				Holder(*holder), waiting, holder.PID))
			return
		}
		j.set(OK, CauseDelivering, fmt.Sprintf("Delivering: %s holds the election; %s.", Holder(*holder), waiting))
		if late {
			j.note("A row has waited for the relays longer than %s: they are behind.", Duration(j.stallAfter))
		}
		return
	case holder != nil:
		if stuck || heldThrough {
			j.set(Stalled, CauseHeldByOther, fmt.Sprintf(
				"Nothing is delivered because %s holds the election of app %q and nothing moves: %s. "+
					"It is not a Go relay of this library. If it is a JVM relay of the same app, its log says what its pass does; "+
					"if it is a SQL session that took hashtext('%s_relay_m2m'), end it: SELECT pg_terminate_backend(%d).",
				Holder(*holder), app, waiting, app, holder.PID))
			return
		}
		j.set(OK, CauseDelivering, fmt.Sprintf(
			"Probably delivering: %s holds the election (a JVM relay of app %q, or SQL); %s.", Holder(*holder), app, waiting))
		if j.in.Before == nil {
			j.note("If the same session still holds it at the next look and the oldest row has not moved, it is stuck " +
				"(relayctl status samples twice; the console compares with its previous look).")
		}
		return
	}

	// Nobody holds the election right now: normal between passes.
	if st := j.in.Stats; st != nil && st.LastPassErr != nil && stuck {
		j.set(Stalled, CausePassFails, fmt.Sprintf(
			"Nothing is delivered because this process's relay fails its passes: %v. %s.", st.LastPassErr, waiting))
		return
	}
	if !stuck {
		j.set(OK, CauseDelivering, fmt.Sprintf("Delivering: %s; nobody holds the election right now, which is normal between passes.", waiting))
		if late {
			j.note("A row has waited for the relays longer than %s: they are behind, but rows move.", Duration(j.stallAfter))
		}
		return
	}
	if late, fine := j.splitTypes(); len(late) > 0 && len(fine) > 0 {
		j.set(Stalled, CauseTypeMissing, fmt.Sprintf(
			"Rows of type %s are not delivered while %s are: no running relay of app %q has a sender for %s "+
				"(each app drains only the types it registered), or those rows belong to another app. %s.",
			quoteList(late), quoteList(fine), app, quoteList(late), waiting))
		return
	}
	if j.in.Now.PresenceKnown {
		j.presenceCause(waiting)
		return
	}
	j.set(Stalled, CauseNoRelay, fmt.Sprintf(
		"Nothing is delivered because no relay of app %q takes the election: nobody holds it and %s. "+
			"Is a replica running with RELAY_APP_NAME=%s, RELAY_TABLE=%s and RELAY_ENABLED=true, "+
			"with a sender for each waiting type, and does its log show passes (relay: pass) or errors (relay: pass failed)?",
		app, waiting, app, o.Table))
}

// deadVerdict makes a verdict of OK into Dead when dead rows wait: they need
// an operator whatever else waits, and say so at every look.
func (j *judge) deadVerdict() {
	if j.d.Verdict != OK || j.o.Dead == 0 {
		return
	}
	j.notes = append([]string{j.lead}, j.notes...)
	j.set(Dead, CauseDeadRows, j.deadLead("Delivery works, but"))
}

// deadLead says that dead rows wait, after lead.
func (j *judge) deadLead(lead string) string {
	return fmt.Sprintf("%s %s row(s) are dead: they reached MaxAttempts (%d) or died of a permanent failure, "+
		"and are never retried until re-queued.", lead, Count(j.o.Dead), j.o.MaxAttempts)
}

// waiting says how many rows wait and which the relays kept waiting longest.
func (j *judge) waiting() string {
	t := j.oldestType()
	if t == nil {
		return fmt.Sprintf("%s row(s) wait, none of them for the relays (they wait out a retry's backoff, or behind a row that does)", Count(j.d.Waiting))
	}
	return fmt.Sprintf("%s row(s) wait, the oldest (id %d, type %q) for %s", Count(j.d.Waiting), t.Oldest.ID, t.Type, Duration(t.Lag))
}

// retryLead says that rows wait only for their retries.
func (j *judge) retryLead() string {
	lead := fmt.Sprintf("Nothing waits for the relays: %s row(s) wait out the backoff of a retry after a failure (or behind such a row of their key)",
		Count(j.d.Waiting))
	if at := j.nextRetry(); !at.IsZero() {
		lead += fmt.Sprintf("; the next attempt at %s (in %s)", at.UTC().Format(time.RFC3339), Duration(at.Sub(j.o.At)))
	}
	if h := j.failingExample(); h != nil {
		lead += fmt.Sprintf("; row id %d failed %s, last with %s", h.ID, times(h.Attempts), quote(Cut(h.LastError, 200)))
	}
	return lead + ". The destination fails, not the relays: they retry by themselves; rows die at MaxAttempts (" + strconv.Itoa(j.o.MaxAttempts) + ")."
}

// retryNote says, beside another cause, that rows wait out retries.
func (j *judge) retryNote() {
	if j.o.Backoff == 0 || j.d.Cause == CauseRetrying {
		return
	}
	note := fmt.Sprintf("%s row(s) retry after a failure and wait out their backoff", Count(j.o.Backoff))
	if at := j.nextRetry(); !at.IsZero() {
		note += ", the next attempt at " + at.UTC().Format(time.RFC3339)
	}
	if h := j.failingExample(); h != nil {
		note += fmt.Sprintf(" (row id %d failed %s, last with %s)", h.ID, times(h.Attempts), quote(Cut(h.LastError, 200)))
	}
	j.note("%s: they wait for their destination, not for the relays.", note)
}

func times(n int) string {
	if n == 1 {
		return "once"
	}
	return fmt.Sprintf("%d times", n)
}

// nextRetry is the earliest next attempt of a row in its backoff.
func (j *judge) nextRetry() time.Time {
	var at time.Time
	for _, t := range j.o.Types {
		if t.Backoff > 0 && (at.IsZero() || t.NextRetry.Before(at)) {
			at = t.NextRetry
		}
	}
	return at
}

// failingExample is a type's first waiting row when it failed before.
func (j *judge) failingExample() *relay.RowHead {
	for _, t := range j.o.Types {
		if t.Next != nil && t.Next.Status == "ERROR" && t.Next.LastError != "" {
			return t.Next
		}
	}
	return nil
}

// foreignNote names the rows left out of the verdict: other apps'.
func (j *judge) foreignNote() {
	if len(j.foreign) == 0 {
		return
	}
	var parts []string
	for _, t := range j.foreign {
		var apps []string
		if t.App != "" {
			apps = append(apps, strconv.Quote(t.App))
		}
		for _, r := range j.in.Now.Others {
			if r.Serves(t.Type) && r.App != t.App {
				name := "an app this role cannot name"
				if r.App != "" {
					name = strconv.Quote(r.App)
				}
				apps = append(apps, name)
			}
		}
		slices.Sort(apps)
		parts = append(parts, fmt.Sprintf("%q (%s waiting, %s dead; app %s)", t.Type, Count(t.Pending+t.Retrying), Count(t.Dead),
			strings.Join(slices.Compact(apps), ", ")))
	}
	j.note("Not counted here: the rows of %s, another app's (its live relays deliver them, or the registry of types gives them to it).", strings.Join(parts, ", "))
}

// presenceCause tells, with presence, why rows that wait too long do not
// move while nobody holds the election.
func (j *judge) presenceCause(waiting string) {
	o, app := j.o, j.o.AppName
	reps := j.in.Now.Replicas
	switch {
	case len(reps) == 0:
		j.set(Stalled, CauseNoRelayRunning, fmt.Sprintf(
			"Nothing is delivered because no relay of app %q is running: no live replica holds its presence, and %s. "+
				"Start the service that runs the relay (RELAY_APP_NAME=%s, RELAY_TABLE=%s, RELAY_ENABLED=true); "+
				"a JVM relay of the app, which has no presence, would show as the election's holder while it passes, and its rows would move.",
			app, waiting, app, o.Table))
	case !anyElected(reps):
		j.set(Stalled, CauseNoneElected, fmt.Sprintf(
			"Nothing is delivered although %d relay(s) of app %q run and serve the waiting types: none has taken the election for %s, and %s. "+
				"Their logs say why (relay: pass failed: the database, a pool too small; an exclusive holder would show here). "+
				"Check that they run with RELAY_ENABLED=true against the same database.",
			len(reps), app, Duration(o.Lag), waiting))
	default:
		late, _ := j.splitTypes()
		if len(late) == 0 {
			late = typesOf(j.waitingTypes())
		}
		j.set(Stalled, CauseNotMoving, fmt.Sprintf(
			"Rows of type %s do not move although a live relay of app %q has a sender for them: %s. "+
				"Look at that replica's log for its passes (relay: pass failed, send failed) or a sender that does not return.",
			quoteList(late), app, waiting))
	}
}

// unserved are the waiting types that no live replica serves, when presence
// is known and at least one replica runs (with none, presenceCause says so).
func (j *judge) unserved() []relay.TypeOverview {
	reps := j.in.Now.Replicas
	if !j.in.Now.PresenceKnown || len(reps) == 0 {
		return nil
	}
	var out []relay.TypeOverview
	for _, t := range j.waitingTypes() {
		served := false
		for _, r := range reps {
			// A replica whose type names are hidden gets the benefit of the doubt.
			served = served || r.Serves(t.Type) || r.UnnamedTypes > 0
		}
		if !served {
			out = append(out, t)
		}
	}
	return out
}

func (j *judge) waitingTypes() []relay.TypeOverview {
	var out []relay.TypeOverview
	for _, t := range j.o.Types {
		if t.Next != nil {
			out = append(out, t)
		}
	}
	return out
}

func typesOf(ts []relay.TypeOverview) []string {
	var out []string
	for _, t := range ts {
		out = append(out, t.Type)
	}
	return out
}

func servedTypes(reps []relay.Replica) []string {
	var out []string
	for _, r := range reps {
		out = append(out, r.Types...)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

func anyElected(reps []relay.Replica) bool {
	for _, r := range reps {
		if r.Elected {
			return true
		}
	}
	return false
}

// indexNote says which of the relay's indexes the table lacks, and how to add them.
func (j *judge) indexNote() {
	m := j.o.MissingIndexes
	if len(m) == 0 {
		return
	}
	var names, stmts []string
	for _, x := range m {
		names = append(names, x.Name)
		stmts = append(stmts, x.Statement)
	}
	j.note("The table lacks %d of the relay's indexes (%s): each pass reads past the SENT, dead and other apps' rows, "+
		"which costs more as they accumulate. Add them (CONCURRENTLY on a busy table): %s",
		len(m), strings.Join(names, ", "), strings.Join(stmts, " "))
}

// ceilingNote says when the live relays count dead rows at another ceiling.
func (j *judge) ceilingNote() {
	var other []string
	for _, r := range j.in.Now.Replicas {
		if r.MaxAttempts != j.o.MaxAttempts {
			other = append(other, fmt.Sprintf("replica %s (pid %d) runs with MaxAttempts %d", r.ID, r.PID, r.MaxAttempts))
		}
	}
	if len(other) > 0 {
		j.note("This look counts a row dead at %d attempts, but %s: pass --max-attempts (RELAY_MAX_ATTEMPTS) as the relays run; re-queues are refused until then.",
			j.o.MaxAttempts, strings.Join(other, ", "))
	}
}

// Replica describes a live replica in one phrase.
func Replica(r relay.Replica) string {
	var d []string
	d = append(d, "pid "+strconv.Itoa(r.PID))
	switch {
	case r.Hidden:
		d = append(d, "details hidden: grant pg_read_all_stats to this role")
	case r.ClientAddr == "":
		d = append(d, "over a local socket")
	default:
		d = append(d, "from "+r.ClientAddr)
	}
	if r.ApplicationName != "" {
		d = append(d, fmt.Sprintf("application_name %q", r.ApplicationName))
	}
	if r.Host != "" {
		d = append(d, fmt.Sprintf("host %s process %d", r.Host, r.Process))
	}
	if !r.BackendStart.IsZero() {
		d = append(d, "since "+r.BackendStart.UTC().Format(time.RFC3339))
	}
	types := quoteList(r.Types)
	if r.UnnamedTypes > 0 {
		types += fmt.Sprintf(" and %d type(s) whose names are hidden", r.UnnamedTypes)
	}
	d = append(d, "types "+types, fmt.Sprintf("MaxAttempts %d", r.MaxAttempts))
	for _, y := range r.Yielded {
		d = append(d, fmt.Sprintf("yields %q to app %q", y.Type, y.App))
	}
	for _, k := range r.Stuck {
		d = append(d, fmt.Sprintf("%d stuck Send(s) of %q since %s", k.Sends, k.Type, k.Since.UTC().Format(time.RFC3339)))
	}
	for _, p := range r.Paused {
		if p.Probing {
			d = append(d, fmt.Sprintf("paused %q, probing now", p.Type))
		} else {
			d = append(d, fmt.Sprintf("paused %q until %s", p.Type, p.Until.UTC().Format(time.RFC3339)))
		}
	}
	switch {
	case r.Partitions > 1 && r.Elected:
		d = append(d, "member of the partitioned election, "+PartitionsText(r.Held, r.Partitions))
	case r.Partitions > 1:
		d = append(d, fmt.Sprintf("Partitions %d, not a member right now", r.Partitions))
	case r.Elected:
		d = append(d, "in a pass (holds the election)")
	default:
		d = append(d, "between passes")
	}
	return "replica " + r.ID + " [" + strings.Join(d, ", ") + "]"
}

// oldestType is the type whose row the relays kept waiting longest; nil
// when no row waits for them.
func (j *judge) oldestType() *relay.TypeOverview {
	var best *relay.TypeOverview
	for i := range j.o.Types {
		t := &j.o.Types[i]
		if t.Oldest != nil && (best == nil || t.Lag > best.Lag) {
			best = t
		}
	}
	return best
}

// waited is how long t's rows have waited: for the relays, or else (in
// backoff) since its first waiting row was written or re-queued.
func (j *judge) waited(t relay.TypeOverview) time.Duration {
	if t.Oldest != nil || t.Next == nil {
		return t.Lag
	}
	return max(j.o.At.Sub(t.Next.WaitingSince), 0)
}

// splitTypes sorts the types with waiting rows into late and fine.
func (j *judge) splitTypes() (late, fine []string) {
	var before map[string]int64
	if j.in.Before != nil {
		before = heads(j.in.Before.Overview)
	}
	for _, t := range j.o.Types {
		if t.Next == nil || slices.ContainsFunc(j.paused, func(p pausedType) bool { return p.Type == t.Type }) {
			continue
		}
		moved := before != nil && before[t.Type] != 0 && before[t.Type] != t.Next.ID
		if t.Lag > j.stallAfter && !moved {
			late = append(late, t.Type)
		} else {
			fine = append(fine, t.Type)
		}
	}
	return late, fine
}

func (j *judge) holderOf(kind relay.HolderKind) *relay.LockHolder {
	for i, h := range j.in.Now.Holders {
		if h.Granted && h.Kind == kind {
			return &j.in.Now.Holders[i]
		}
	}
	return nil
}

// partitionsHeld counts the members of a partitioned election among hs,
// the partitions they hold, and of how many.
func partitionsHeld(hs []relay.LockHolder) (members, held, of int) {
	for _, h := range hs {
		if h.Granted && h.Mode == relay.LockShared {
			members++
			held += len(h.Partitions)
			of = max(of, h.PartitionsOf)
		}
	}
	return members, held, of
}

func granted(hs []relay.LockHolder) *relay.LockHolder {
	for i := range hs {
		if hs[i].Granted {
			return &hs[i]
		}
	}
	return nil
}

func (j *judge) trendNote() {
	if j.in.Before == nil || j.elapsed <= 0 {
		return
	}
	switch {
	case j.d.Waiting == 0:
	case j.still:
		j.note("In the last %s no waiting row was delivered: the oldest undelivered went from %s to %s.",
			Duration(j.elapsed), Duration(j.in.Before.Overview.Age), Duration(j.o.Age))
	case j.moved:
		j.note("In the last %s the oldest rows moved: the oldest undelivered went from %s to %s.",
			Duration(j.elapsed), Duration(j.in.Before.Overview.Age), Duration(j.o.Age))
	}
}

// heldBefore says the session pid held the election at the earlier look.
func (j *judge) heldBefore(pid int) bool {
	for _, h := range j.in.Before.Holders {
		if h.Granted && h.PID == pid {
			return true
		}
	}
	return false
}

func (j *judge) readOnlyNote() {
	o := j.o
	if j.d.Cause == CauseReadOnly {
		return
	}
	if o.InRecovery {
		j.note("This server is a standby: the election is not visible here (locks are not replicated), and a relay connected to it cannot deliver.")
	} else if o.DefaultReadOnly {
		j.note("default_transaction_read_only is on for this role and database: a relay connecting the same way cannot record outcomes.")
	}
}

func (j *judge) deadNote() {
	o := j.o
	if o.Dead == 0 {
		return
	}
	var parts []string
	var example string
	for _, t := range o.Types {
		if t.Dead > 0 {
			parts = append(parts, fmt.Sprintf("%s %s", t.Type, Count(t.Dead)))
			if example == "" && t.FirstDead != nil {
				example = fmt.Sprintf(" The oldest dead row of %s (id %d) %s", t.Type, t.FirstDead.ID, Died(*t.FirstDead, o.MaxAttempts))
				if t.FirstDead.LastError != "" {
					example += ": " + quote(Cut(Reason(t.FirstDead.LastError), 200))
				}
				example += "."
			}
		}
	}
	lead := ""
	if j.d.Cause != CauseDeadRows {
		lead = fmt.Sprintf("Besides, %s row(s) are dead and never retried until re-queued: ", Count(o.Dead))
	} else {
		lead = "By type: "
	}
	j.note("%s%s.%s Re-queue them once the cause is fixed: `relayctl requeue --type T` or `--all`, or the console's buttons.",
		lead, strings.Join(parts, ", "), example)
}

// Reason is a last error without the mark of a permanent failure
// ("permanent after 1 attempt(s): "), which [Died] says in words.
func Reason(lastError string) string {
	if _, ok := relay.ParsePermanent(lastError); ok {
		if _, rest, ok := strings.Cut(lastError, " attempt(s): "); ok {
			return rest
		}
	}
	return lastError
}

// Died says how a dead row died: "died of a permanent failure after 1
// attempt", or "reached MaxAttempts (10) after 10 attempts".
func Died(h relay.RowHead, ceiling int) string {
	if h.Permanent {
		return "died of a permanent failure after " + attemptsText(h.AttemptsMade)
	}
	return fmt.Sprintf("reached MaxAttempts (%d) after %s", ceiling, attemptsText(h.AttemptsMade))
}

func attemptsText(n int) string {
	if n == 1 {
		return "1 attempt"
	}
	return fmt.Sprintf("%d attempts", n)
}

// Attempts writes a dead row's attempts: "permanent, 1 attempt" for a row
// that died of a permanent failure, else the count ("10").
func Attempts(permanent bool, made, attempts int) string {
	if !permanent {
		return strconv.Itoa(attempts)
	}
	if made == 1 {
		return "permanent, 1 attempt"
	}
	return fmt.Sprintf("permanent, %d attempts", made)
}

// Holder describes a holder of the election in one phrase.
func Holder(h relay.LockHolder) string {
	var who string
	switch h.Kind {
	case relay.HolderRelay:
		who = "a Go relay"
		switch {
		case h.ReplicaID != "" && h.Replica != "":
			who += fmt.Sprintf(" (replica %s, application_name %q)", h.ReplicaID, h.Replica)
		case h.ReplicaID != "":
			who += " (replica " + h.ReplicaID + ")"
		case h.Replica != "":
			who += fmt.Sprintf(" (application_name %q)", h.Replica)
		}
	case relay.HolderPause:
		who = "relayctl pause"
	default:
		who = fmt.Sprintf("another client (a JVM relay or SQL; application_name %q)", h.ApplicationName)
	}
	var d []string
	if h.ReplicaID != "" {
		// Not the pid Replicas lists: a relay's election runs on a session of its own.
		d = append(d, fmt.Sprintf("pid %d, its election's session", h.PID))
	} else {
		d = append(d, fmt.Sprintf("pid %d", h.PID))
	}
	if h.Mode == relay.LockShared && h.Kind == relay.HolderRelay {
		d = append(d, PartitionsText(h.Partitions, h.PartitionsOf))
	}
	if h.User != "" {
		d = append(d, "user "+h.User)
	}
	switch {
	case h.Hidden:
		d = append(d, "details hidden: grant pg_read_all_stats to this role")
	case h.ClientAddr == "":
		d = append(d, "over a local socket")
	default:
		d = append(d, "from "+h.ClientAddr)
	}
	if !h.Since.IsZero() {
		d = append(d, fmt.Sprintf("since %s (%s)", h.Since.UTC().Format(time.RFC3339), Duration(h.HeldFor())))
	} else if !h.BackendStart.IsZero() {
		d = append(d, fmt.Sprintf("connected %s ago", Duration(h.At.Sub(h.BackendStart))))
	}
	if h.State != "" {
		s := h.State
		if !h.StateChange.IsZero() {
			s += " for " + Duration(h.At.Sub(h.StateChange))
		}
		d = append(d, s)
	}
	if !h.Granted {
		d = append(d, "waiting for the lock")
	}
	return who + " [" + strings.Join(d, ", ") + "]"
}

// PartitionsText writes a partitioned member's partitions: "partitions
// 0-3, 8 of 16", or "no partition" when it holds none.
func PartitionsText(parts []int, of int) string {
	if len(parts) == 0 {
		return "no partition"
	}
	var runs []string
	for i := 0; i < len(parts); {
		j := i
		for j+1 < len(parts) && parts[j+1] == parts[j]+1 {
			j++
		}
		if j > i {
			runs = append(runs, fmt.Sprintf("%d-%d", parts[i], parts[j]))
		} else {
			runs = append(runs, fmt.Sprint(parts[i]))
		}
		i = j + 1
	}
	return fmt.Sprintf("partitions %s of %d", strings.Join(runs, ", "), of)
}

// Duration writes d for a person: 850ms, 12s, 4m12s, 3h04m, 2d03h.
func Duration(d time.Duration) string {
	switch {
	case d < 0:
		d = 0
		fallthrough
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(time.Second).String()
	case d < time.Hour:
		d = d.Round(time.Second)
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 48*time.Hour:
		d = d.Round(time.Minute)
		return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
	default:
		d = d.Round(time.Hour)
		return fmt.Sprintf("%dd%02dh", int(d.Hours())/24, int(d.Hours())%24)
	}
}

// Count writes n with thousands separators: 1,000,000.
func Count(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	if neg {
		b.WriteByte('-')
	}
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// Cut returns s cut to n runes, with an ellipsis when cut.
func Cut(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n]) + "…"
}

// quote puts an error text between quotes as it is, one line.
func quote(s string) string { return "\u201c" + strings.Join(strings.Fields(s), " ") + "\u201d" }

func quoteList(ss []string) string {
	ss = slices.Clone(ss)
	for i, s := range ss {
		ss[i] = fmt.Sprintf("%q", s)
	}
	return strings.Join(ss, ", ")
}
