package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/xadm/relay"
)

// The causes of a duplicate. Every one but unexplained is the inherent
// duplication of at-least-once: the previous delivery was in flight at a
// fault on the replica that made it.
const (
	causeNotRecorded = "in flight at a fault: outcome not recorded (its session was killed)"
	causeInterrupted = "in flight at a fault: send cut short (election lost mid-send)"
	causeStale       = "in flight at a fault: sent again before its outcome was recorded"
	causeTiming      = "in flight at a fault (by timing; no log line)"
)

// report is what a soak run did, as the table, the receiver and the relays' logs tell it.
type report struct {
	o            options
	serverKind   string
	took         time.Duration // writing and faults
	drainTook    time.Duration
	drained      bool
	electionFree bool

	written     int // rows in the table
	committed   int // ids the producer committed
	writeErrors int
	notInTable  int // committed ids missing from the table
	delivered   int // rows received at least once
	requests    int // requests the receiver accepted
	strangers   int // ids received that are not in the table
	duplicates  int
	causes      map[string]int
	unexplained []string
	byType      map[string]int // rows written, per type
	shared      int            // keys written with both types
	disorders   []string       // a key's message received after a later one of the same key, across types
	lost        []int64        // rows never received
	notSent     int            // rows not SENT at the end
	dead        int

	faults   []fault
	outages  []outage
	refused  map[string]int // per type, requests the receiver answered 503
	paused   map[string]int // per type, the pauses the replicas logged
	resumed  map[string]int // per type, the resumes the replicas logged
	rolls    int
	lockLeft []string
	stats    relay.Stats // summed over every replica that ran
	levels   map[slog.Level]int
	messages map[string]int
}

// ok reports whether the run passes: nothing lost or left unsent, every
// duplicate explained, no key's order broken, no lock left, and, when the
// receiver failed on purpose, some type paused by it.
func (r *report) ok() bool {
	return len(r.lost) == 0 && r.notSent == 0 && len(r.unexplained) == 0 && len(r.lockLeft) == 0 && len(r.disorders) == 0 &&
		r.electionFree && r.notInTable == 0 && r.strangers == 0 && (len(r.outages) == 0 || sumOf(r.paused) > 0)
}

func sumOf(m map[string]int) (n int) {
	for _, v := range m {
		n += v
	}
	return n
}

func (s *soak) report(ctx context.Context) (*report, error) {
	rep := &report{o: s.o, serverKind: s.srv.Kind, causes: map[string]int{}, faults: s.faults.all(),
		outages: s.outages.all(), refused: s.rc.refusals(), byType: map[string]int{}}
	qctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	rows, err := s.admin.Query(qctx, "SELECT id, type, natural_key, status, attempts FROM "+pgx.Identifier{s.table}.Sanitize()+" ORDER BY id")
	if err != nil {
		return nil, fmt.Errorf("read the table: %w", err)
	}
	type rowState struct {
		typ, key string
		status   string
		attempts int
	}
	table := map[int64]rowState{}
	typesOf := map[string]map[string]bool{}
	var ids []int64
	var id int64
	var st rowState
	_, err = pgx.ForEachRow(rows, []any{&id, &st.typ, &st.key, &st.status, &st.attempts}, func() error {
		table[id] = st
		ids = append(ids, id)
		rep.byType[st.typ]++
		if typesOf[st.key] == nil {
			typesOf[st.key] = map[string]bool{}
		}
		typesOf[st.key][st.typ] = true
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read the table: %w", err)
	}
	for _, types := range typesOf {
		if len(types) > 1 {
			rep.shared++
		}
	}

	s.mu.Lock()
	committed := s.written
	rep.writeErrors = s.writeErr
	rep.rolls = s.rolls
	rep.lockLeft = s.lockLeft
	for _, st := range s.stopped {
		rep.stats.PassesElected += st.PassesElected
		rep.stats.PassesCoalesced += st.PassesCoalesced
		rep.stats.Sent += st.Sent
		rep.stats.Failed += st.Failed
		rep.stats.Dead += st.Dead
	}
	s.mu.Unlock()
	rep.committed = len(committed)
	for _, id := range committed {
		if _, ok := table[id]; !ok {
			rep.notInTable++
		}
	}

	got := s.rc.snapshot()
	rep.written = len(ids)
	for _, id := range ids {
		st := table[id]
		if st.status != "SENT" {
			rep.notSent++
			if st.status == "ERROR" && st.attempts >= maxAttempts {
				rep.dead++
			}
		}
		ds := got[id]
		if len(ds) == 0 {
			rep.lost = append(rep.lost, id)
			continue
		}
		rep.delivered++
		sort.Slice(ds, func(i, j int) bool { return ds[i].at.Before(ds[j].at) })
		for k := 1; k < len(ds); k++ {
			rep.duplicates++
			cause, detail := s.classify(id, ds[k-1], ds[k], rep.faults)
			if cause == "" {
				rep.unexplained = append(rep.unexplained, detail)
				continue
			}
			rep.causes[cause]++
		}
	}
	for id, ds := range got {
		rep.requests += len(ds)
		if _, ok := table[id]; !ok {
			rep.strangers++
		}
	}
	rep.disorders = disorders(got)

	s.sink.mu.Lock()
	rep.levels = cloneMap(s.sink.levels)
	rep.messages = cloneMap(s.sink.messages)
	rep.paused = cloneMap(s.sink.paused)
	rep.resumed = cloneMap(s.sink.resumed)
	s.sink.mu.Unlock()
	return rep, nil
}

// classify says why message id was delivered again (next) after prev: the
// cause, or "" and a description when nothing explains it.
func (s *soak) classify(id int64, prev, next delivery, faults []fault) (cause, detail string) {
	// The send that carried prev, as the relay saw it: from its start to when
	// it returned (or was cut short): the replica's last send of id that
	// started before prev arrived. A request cut short on the client may
	// still arrive, and be served, after the client gave up.
	from, to := prev.at, prev.at
	var carrier *send
	for _, sd := range s.sends.of(id) {
		if sd.replica == prev.replica && !sd.start.After(prev.at) && (carrier == nil || sd.start.After(carrier.start)) {
			carrier = &sd
		}
	}
	if carrier != nil {
		from, to = carrier.start, carrier.end
		if prev.at.After(to) {
			to = prev.at
		}
	}
	near := false
	for _, f := range faults {
		if f.replica == prev.replica && !f.at.Before(from.Add(-s.o.window)) && !f.at.After(to.Add(s.o.window)) {
			near = true
			break
		}
	}
	var said []string
	for _, e := range s.sink.about(prev.replica, id) {
		// An outcome is recorded, or found unrecordable, within its own
		// timeout (10s) of the send's end.
		if !e.at.Before(from) && !e.at.After(to.Add(15*time.Second)) {
			said = append(said, e.msg)
		}
	}
	// The replica that delivered it again may say so too: its outcome found
	// the row already SENT by prev's replica, which had lost the election.
	for _, e := range s.sink.about(next.replica, id) {
		if e.msg == msgStale && !e.at.Before(next.at) {
			said = append(said, e.msg)
		}
	}
	switch {
	case near && slices.Contains(said, msgNotRecorded):
		return causeNotRecorded, ""
	case near && slices.Contains(said, msgInterrupted):
		return causeInterrupted, ""
	case near && slices.Contains(said, msgStale):
		return causeStale, ""
	case near:
		return causeTiming, ""
	}
	return "", fmt.Sprintf("message %d: delivered by replica %d at %s (send %s–%s), again later; no fault on that replica within %s; its log said %q",
		id, prev.replica, prev.at.Format("15:04:05.000"), from.Format("15:04:05.000"), to.Format("15:04:05.000"), s.o.window, said)
}

// disorders lists the deliveries that came after a later message of the same
// key had been received, whatever the two messages' types: a key's order
// broken. A message delivered again after it was received once is not one:
// at-least-once re-delivers what was in flight at a fault (a deposed
// replica's late request, an outcome not recorded), and its first delivery
// kept the key's order.
func disorders(got map[int64][]delivery) []string {
	var all []delivery
	for _, ds := range got {
		all = append(all, ds...)
	}
	sort.Slice(all, func(i, j int) bool { return all[i].at.Before(all[j].at) })
	highest := map[string]delivery{}
	received := map[int64]bool{}
	var out []string
	for _, d := range all {
		again := received[d.id]
		received[d.id] = true
		h, ok := highest[d.key]
		switch {
		case !ok || d.id > h.id:
			highest[d.key] = d
		case d.id < h.id && !again:
			out = append(out, fmt.Sprintf("key %q: %s %d from replica %d at %s, after %s %d from replica %d at %s",
				d.key, d.typ, d.id, d.replica, d.at.Format("15:04:05.000"), h.typ, h.id, h.replica, h.at.Format("15:04:05.000")))
		}
	}
	return out
}

func cloneMap[K comparable, V any](m map[K]V) map[K]V {
	out := make(map[K]V, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func (r *report) print(w io.Writer) {
	p := func(format string, args ...any) { fmt.Fprintf(w, format+"\n", args...) }
	faults := "none"
	if r.o.killEvery > 0 {
		faults = "a session killed every ~" + r.o.killEvery.String()
	}
	lock := ""
	if !r.o.clusterLock {
		lock = ", ClusterLock OFF"
	}
	if r.o.partitions > 1 {
		lock = fmt.Sprintf(", Partitions %d", r.o.partitions)
	}
	p("relay soak: %s of writes at %d/s, %d replicas (Concurrency %d, BatchSize %d, Interval %s%s), %s, seed %d, %s server",
		r.took.Round(time.Millisecond), r.o.rate, r.o.replicas, r.o.concurrency, r.o.batch, r.o.interval, lock, faults, r.o.seed, r.serverKind)
	p("")
	p("rows written            %6d  (order %d, ledger %d; producer committed %d, failed transactions %d)",
		r.written, r.byType[typeOrder], r.byType[typeLedger], r.committed, r.writeErrors)
	p("keys                    %6d  of both types (-keys %d: order the first two thirds, ledger the last two)", r.shared, r.o.keys)
	p("rows delivered          %6d  (requests accepted by the receiver: %d)", r.delivered, r.requests)
	p("duplicates              %6d", r.duplicates)
	causes := make([]string, 0, len(r.causes))
	for c := range r.causes {
		causes = append(causes, c)
	}
	sort.Strings(causes)
	for _, c := range causes {
		p("  %-66s %6d", c, r.causes[c])
	}
	p("  %-66s %6d", "unexplained", len(r.unexplained))
	for i, u := range r.unexplained {
		if i == 10 {
			p("    … and %d more", len(r.unexplained)-10)
			break
		}
		p("    %s", u)
	}
	p("out of key order        %6d  (received after a later message of its key, either type, not as a re-delivery: must be 0)", len(r.disorders))
	for i, d := range r.disorders {
		if i == 10 {
			p("    … and %d more", len(r.disorders)-10)
			break
		}
		p("    %s", d)
	}
	p("lost                    %6d  (written, never delivered: must be 0)%s", len(r.lost), firstIDs(r.lost))
	p("not SENT at the end     %6d  (dead: %d)", r.notSent, r.dead)
	if r.notInTable > 0 || r.strangers > 0 {
		p("inconsistent            committed ids missing from the table: %d; received ids not in the table: %d", r.notInTable, r.strangers)
	}
	p("")
	holder, byState := 0, map[string]int{}
	for _, f := range r.faults {
		if f.lockHolder {
			holder++
		}
		state := f.state
		if state == "" {
			state = "unknown"
		}
		byState[state]++
	}
	states := make([]string, 0, len(byState))
	for st, n := range byState {
		states = append(states, fmt.Sprintf("%s %d", st, n))
	}
	sort.Strings(states)
	if len(states) == 0 {
		states = []string{"none"}
	}
	p("faults injected         %6d  (election holder %d, other sessions %d; by state: %s)",
		len(r.faults), holder, len(r.faults)-holder, strings.Join(states, ", "))
	if r.o.rollEvery > 0 {
		p("replica restarts        %6d", r.rolls)
	}
	byTypes := map[string]int{}
	for _, o := range r.outages {
		byTypes[strings.Join(o.types, "+")]++
	}
	p("receiver outages        %6d  (503 for %s each: order %d, ledger %d, both %d; requests answered 503: order %d, ledger %d)",
		len(r.outages), r.o.outageFor, byTypes[typeOrder], byTypes[typeLedger], byTypes[typeOrder+"+"+typeLedger],
		r.refused[typeOrder], r.refused[typeLedger])
	p("types paused            order %d, ledger %d; resumed: order %d, ledger %d",
		r.paused[typeOrder], r.paused[typeLedger], r.resumed[typeOrder], r.resumed[typeLedger])
	if len(r.outages) > 0 && sumOf(r.paused) == 0 {
		p("                        the outages paused no type: must be at least one (a longer -outage-for)")
	}
	p("passes                  elected %d, coalesced %d, failed %d",
		r.stats.PassesElected, r.stats.PassesCoalesced, r.messages[msgPassFailed])
	p("outcomes recorded       sent %d, failed %d, dead %d", r.stats.Sent, r.stats.Failed, r.stats.Dead)
	p("log lines               error %d, warn %d, info %d, debug %d; \"outcome not recorded\" %d, \"send interrupted\" %d",
		r.levels[slog.LevelError], r.levels[slog.LevelWarn], r.levels[slog.LevelInfo], r.levels[slog.LevelDebug],
		r.messages[msgNotRecorded], r.messages[msgInterrupted])
	lock = "no"
	if len(r.lockLeft) > 0 || !r.electionFree {
		lock = fmt.Sprintf("YES %v (election free afterwards: %t)", r.lockLeft, r.electionFree)
	}
	p("lock left after Stop    %s", lock)
	drain := "drained"
	if !r.drained {
		drain = "NOT drained within " + r.o.drain.String()
	}
	p("drain                   %s in %s", drain, r.drainTook.Round(time.Millisecond))
	p("")
	if r.ok() {
		p("result: PASS")
	} else {
		p("result: FAIL")
	}
}

func firstIDs(ids []int64) string {
	if len(ids) == 0 {
		return ""
	}
	if len(ids) > 10 {
		return fmt.Sprintf(": %v …", ids[:10])
	}
	return fmt.Sprintf(": %v", ids)
}
