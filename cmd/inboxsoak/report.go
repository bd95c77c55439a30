package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// report is what the soak saw.
type report struct {
	duration time.Duration
	drainErr error

	written    int            // messages the producer committed
	byType     map[string]int // of them, per type
	burst      int            // ledger messages the pause faults' bursts wrote
	writeErr   int            // producer transactions that failed
	keys       int            // distinct keys written
	keysByType map[string]int // distinct keys written, per type
	shared     int            // keys written with both types
	notSent    int            // outbox rows not SENT at the end

	once         int            // written messages applied exactly once
	missing      []int64        // written, no effect: lost
	lostByType   map[string]int // the lost, per type
	doubled      []int64        // written, more than one effect
	unknown      int            // effects of ids nobody wrote
	behind       []string       // order keys whose final state is not their newest order message
	sums         []string       // ledger keys whose sum is not the sum of their amounts
	breaks       []string       // effects applied after an effect of a newer message of their key
	breakKeys    int            // keys with a break
	staleDropped []int64        // order messages answered stale and never applied: dropped for good

	faults      map[string]int
	cutConns    int            // connections the cuts froze
	released    int            // cut connections whose held request reached the receiver late
	pauses      map[string]int // per type, the pauses the relays logged
	pauseFaults []pauseFault

	details []string // the timelines of the keys of the first violations

	answers   map[string]int // answers of the receiver by outcome ("applied", "duplicate", "stale", "503", …)
	delivered int            // messages the receiver answered at least once
	again     int            // answers beyond the first per message: the relay's re-deliveries
}

// ok reports whether the run passes: every message's effect exactly once,
// every order key on its newest message, every ledger key on the sum of its
// amounts, no key's effects out of id order, none dropped as stale, nothing
// lost, every row SENT, every fault injected at least once, and the pause
// fault pausing order at least once.
func (r *report) ok() bool {
	return len(r.missing) == 0 && len(r.doubled) == 0 && r.unknown == 0 && len(r.behind) == 0 &&
		len(r.sums) == 0 && len(r.breaks) == 0 && len(r.staleDropped) == 0 &&
		r.notSent == 0 && r.writeErr == 0 && r.drainErr == nil && len(r.faultsMissing()) == 0 && r.written > 0 &&
		r.pausedByFault() > 0
}

// faultsMissing lists the kinds of fault never injected.
func (r *report) faultsMissing() []string {
	var missing []string
	for _, k := range faultKinds {
		if r.faults[k] == 0 {
			missing = append(missing, k)
		}
	}
	return missing
}

// pausedByFault returns how many pause faults saw the relays pause order.
func (r *report) pausedByFault() int {
	n := 0
	for _, pf := range r.pauseFaults {
		if pf.paused {
			n++
		}
	}
	return n
}

// effect is one row of the receiver's effects: one message applied.
type effect struct {
	seq     int64
	id      int64
	typ     string
	applied time.Time
}

// check reads the outbox and the receiver's tables and builds the report.
func (s *soak) check(ctx context.Context) (*report, error) {
	s.mu.Lock()
	r := &report{
		written: len(s.written), writeErr: s.writeErr, burst: s.burst, byType: map[string]int{},
		keysByType: map[string]int{}, lostByType: map[string]int{},
		faults: map[string]int{}, cutConns: s.cutConns, released: s.released, answers: map[string]int{},
		pauses: map[string]int{}, pauseFaults: slices.Clone(s.pauseFaults),
	}
	written := make(map[int64]message, len(s.written))
	typesOf := map[string]map[string]bool{} // key → its types
	for id, m := range s.written {
		written[id] = m
		r.byType[m.typ]++
		if typesOf[m.key] == nil {
			typesOf[m.key] = map[string]bool{}
		}
		typesOf[m.key][m.typ] = true
	}
	newest := make(map[string]int64, len(s.newest))
	for k, id := range s.newest {
		newest[k] = id
	}
	sums := make(map[string]int64, len(s.sums))
	for k, sum := range s.sums {
		sums[k] = sum
	}
	for k, n := range s.faults {
		r.faults[k] = n
	}
	for t, n := range s.pauses {
		r.pauses[t] = n
	}
	perMessage := map[string]int{}
	for outcome, byIdem := range s.answers {
		for idem, n := range byIdem {
			r.answers[outcome] += n
			perMessage[idem] += n
		}
	}
	stale := map[int64]bool{}
	for idem := range s.answers["stale"] {
		if id, ok := s.idOf(idem); ok {
			stale[id] = true
		}
	}
	s.mu.Unlock()
	r.keys = len(typesOf)
	for _, types := range typesOf {
		for t := range types {
			r.keysByType[t]++
		}
		if len(types) > 1 {
			r.shared++
		}
	}
	for _, n := range perMessage {
		r.delivered++
		r.again += n - 1
	}

	if err := s.admin.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{s.table}.Sanitize()+" WHERE status <> 'SENT'").Scan(&r.notSent); err != nil {
		return nil, err
	}

	// Every effect, by key in the order applied.
	rows, err := s.rdb.Query(ctx, "SELECT message_key, seq, message_id, type, applied_at FROM "+s.effects+" ORDER BY message_key, seq")
	if err != nil {
		return nil, err
	}
	byKey := map[string][]effect{}
	effects := map[int64]int{}
	for rows.Next() {
		var k string
		var e effect
		if err := rows.Scan(&k, &e.seq, &e.id, &e.typ, &e.applied); err != nil {
			return nil, err
		}
		byKey[k] = append(byKey[k], e)
		effects[e.id]++
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	flagged := map[string][]int64{} // key → its messages in a violation, for the details
	flag := func(key string, id int64) {
		if !slices.Contains(flagged[key], id) {
			flagged[key] = append(flagged[key], id)
		}
	}
	for id, m := range written {
		switch effects[id] {
		case 0:
			r.missing = append(r.missing, id)
			r.lostByType[m.typ]++
			if m.typ == typeOrder && stale[id] {
				r.staleDropped = append(r.staleDropped, id)
			}
			flag(m.key, id)
		case 1:
			r.once++
		default:
			r.doubled = append(r.doubled, id)
			flag(m.key, id)
		}
	}
	for id := range effects {
		if _, ok := written[id]; !ok {
			r.unknown++
		}
	}
	slices.Sort(r.missing)
	slices.Sort(r.doubled)
	slices.Sort(r.staleDropped)

	// No order break: each key's effects, both types together, in id order.
	keys := make([]string, 0, len(byKey))
	for k := range byKey {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		var top effect
		broke := false
		for _, e := range byKey[k] {
			if e.id > top.id {
				top = e
				continue
			}
			broke = true
			flag(k, e.id)
			flag(k, top.id)
			r.breaks = append(r.breaks, fmt.Sprintf("key %s: %s %d applied at %s, after %s %d at %s",
				k, e.typ, e.id, e.applied.Format("15:04:05.000"), top.typ, top.id, top.applied.Format("15:04:05.000")))
		}
		if broke {
			r.breakKeys++
		}
	}

	// Each key's final state: order's newest, ledger's sum.
	rows, err = s.rdb.Query(ctx, "SELECT message_key, order_id, ledger_sum FROM "+s.keys)
	if err != nil {
		return nil, err
	}
	finalOrder := map[string]int64{}
	finalSum := map[string]int64{}
	for rows.Next() {
		var k string
		var id *int64
		var sum int64
		if err := rows.Scan(&k, &id, &sum); err != nil {
			return nil, err
		}
		if id != nil {
			finalOrder[k] = *id
		}
		finalSum[k] = sum
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	for k, id := range newest {
		if finalOrder[k] != id {
			r.behind = append(r.behind, fmt.Sprintf("%s: %d, not %d", k, finalOrder[k], id))
			flag(k, id)
		}
	}
	for k, want := range sums {
		if finalSum[k] != want {
			r.sums = append(r.sums, fmt.Sprintf("%s: %d, not %d", k, finalSum[k], want))
			if _, ok := flagged[k]; !ok {
				flagged[k] = nil
			}
		}
	}
	for k, sum := range finalSum {
		if _, ok := sums[k]; !ok && sum != 0 {
			r.sums = append(r.sums, fmt.Sprintf("%s: %d, not 0 (no ledger message written)", k, sum))
		}
	}
	slices.Sort(r.behind)
	slices.Sort(r.sums)

	// The timelines of the first keys in a violation.
	bad := make([]string, 0, len(flagged))
	for k := range flagged {
		bad = append(bad, k)
	}
	slices.Sort(bad)
	for _, k := range bad[:min(len(bad), 5)] {
		r.details = append(r.details, s.explain(ctx, k, flagged[k], byKey[k]))
	}
	return r, nil
}

// idOf returns the outbox id an Idempotency-Key of this soak names.
func (s *soak) idOf(idem string) (int64, bool) {
	i := strings.LastIndexByte(idem, '/')
	if i < 0 {
		return 0, false
	}
	id, err := strconv.ParseInt(idem[i+1:], 10, 64)
	return id, err == nil
}

// explain tells key's timeline around its messages in a violation: each of
// its messages in id order, when it was written, its row, when it was
// applied, and what the receiver answered for it; the marked ones are in a
// violation (all of them when none is: a sum that is wrong).
func (s *soak) explain(ctx context.Context, key string, marked []int64, applied []effect) string {
	var b strings.Builder
	fmt.Fprintf(&b, "key %s, its messages in id order (* in a violation; … others):", key)
	rows, err := s.admin.Query(ctx, "SELECT id, type, status, attempts, created_at, sent_at FROM "+pgx.Identifier{s.table}.Sanitize()+
		" WHERE natural_key = $1 ORDER BY id", key)
	if err != nil {
		fmt.Fprintf(&b, " (the outbox could not be read: %v)", err)
		return b.String()
	}
	type row struct {
		id          int64
		typ, status string
		attempts    int
		created     time.Time
		sent        *time.Time
	}
	var all []row
	for rows.Next() {
		var r row
		if err := rows.Scan(&r.id, &r.typ, &r.status, &r.attempts, &r.created, &r.sent); err != nil {
			fmt.Fprintf(&b, " (the outbox could not be read: %v)", err)
			return b.String()
		}
		all = append(all, r)
	}
	if err := rows.Err(); err != nil {
		fmt.Fprintf(&b, " (the outbox could not be read: %v)", err)
		return b.String()
	}
	// Shown: the marked messages and the 3 either side of each.
	const around = 3
	shown := make([]bool, len(all))
	for i, r := range all {
		if len(marked) == 0 || slices.Contains(marked, r.id) {
			for j := max(i-around, 0); j <= min(i+around, len(all)-1); j++ {
				shown[j] = true
			}
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, r := range all {
		if !shown[i] {
			if i == 0 || shown[i-1] {
				fmt.Fprintf(&b, "\n    …")
			}
			continue
		}
		mark := " "
		if slices.Contains(marked, r.id) {
			mark = "*"
		}
		fmt.Fprintf(&b, "\n  %s %d %-6s written %s, %s after %d failed attempts", mark, r.id, r.typ, r.created.Format("15:04:05.000"), r.status, r.attempts)
		if r.sent != nil {
			fmt.Fprintf(&b, " (%s)", r.sent.Format("15:04:05.000"))
		}
		for _, e := range applied {
			if e.id == r.id {
				fmt.Fprintf(&b, "; applied %s (seq %d)", e.applied.Format("15:04:05.000"), e.seq)
			}
		}
		if m, ok := s.written[r.id]; ok && m.typ == typeLedger {
			fmt.Fprintf(&b, "; amount %d", m.amount)
		}
		fmt.Fprintf(&b, "\n        answers %v", s.history[fmt.Sprintf("public.%s/%d", s.table, r.id)])
	}
	return b.String()
}

// print writes the report for a person.
func (r *report) print(w io.Writer) {
	fmt.Fprintf(w, "\ninboxsoak: %s\n", r.verdict())
	fmt.Fprintf(w, "  written     %d messages (order %d, ledger %d of which %d in the pause faults' bursts), %d producer errors, over %s\n",
		r.written, r.byType[typeOrder], r.byType[typeLedger], r.burst, r.writeErr, r.duration.Round(time.Second))
	fmt.Fprintf(w, "              for %d keys (order %d, ledger %d, both types %d)\n", r.keys, r.keysByType[typeOrder], r.keysByType[typeLedger], r.shared)
	fmt.Fprintf(w, "  effects     %d of %d exactly once; %d lost (order %d, ledger %d), %d applied more than once, %d of unknown messages\n",
		r.once, r.written, len(r.missing), r.lostByType[typeOrder], r.lostByType[typeLedger], len(r.doubled), r.unknown)
	fmt.Fprintf(w, "  order       %d keys not on their newest message; %d messages dropped as stale (answered stale, never applied)\n", len(r.behind), len(r.staleDropped))
	fmt.Fprintf(w, "  ledger      %d keys whose sum is not the sum of their amounts\n", len(r.sums))
	fmt.Fprintf(w, "  key order   %d order breaks in %d keys (an effect applied after a newer message's of its key, both types together)\n", len(r.breaks), r.breakKeys)
	fmt.Fprintf(w, "  outbox      %d rows not SENT\n", r.notSent)
	if r.drainErr != nil {
		fmt.Fprintf(w, "  drain       %v\n", r.drainErr)
	}
	fmt.Fprintf(w, "  faults:\n")
	for _, k := range faultKinds {
		fmt.Fprintf(w, "    %3d  %s\n", r.faults[k], k)
	}
	fmt.Fprintf(w, "         (the cuts froze %d connections; %d held a request that reached the receiver late)\n", r.cutConns, r.released)
	burst, applied := 0, 0
	for _, pf := range r.pauseFaults {
		burst += pf.burst
		applied += max(pf.applied, 0)
	}
	fmt.Fprintf(w, "  pauses      the relays paused order %d times, ledger %d times; the pause fault paused order in %d of %d,\n",
		r.pauses[typeOrder], r.pauses[typeLedger], r.pausedByFault(), len(r.pauseFaults))
	fmt.Fprintf(w, "              and of its bursts' %d ledger messages %d were applied while order failed\n", burst, applied)
	// The inbox's outcomes always, then any other status.
	outcomes := []string{
		fmt.Sprintf("applied %d", r.answers["applied"]),
		fmt.Sprintf("duplicate %d", r.answers["duplicate"]),
		fmt.Sprintf("stale %d", r.answers["stale"]),
	}
	var others []string
	for o, n := range r.answers {
		if o != "applied" && o != "duplicate" && o != "stale" {
			others = append(others, fmt.Sprintf("%s %d", o, n))
		}
	}
	slices.Sort(others)
	outcomes = append(outcomes, others...)
	fmt.Fprintf(w, "  deliveries  %d answers for %d messages: %s\n", sum(r.answers), r.delivered, strings.Join(outcomes, ", "))
	fmt.Fprintf(w, "              %d re-deliveries by the relay, each dropped by the inbox (duplicate, stale) or retried after a failure\n", r.again)
	for _, d := range r.details {
		fmt.Fprintf(w, "  %s\n", d)
	}
	show := func(what string, list []string) {
		if len(list) > 0 {
			fmt.Fprintf(w, "  %s (%d):\n    %s\n", what, len(list), strings.Join(list[:min(len(list), 20)], "\n    "))
		}
	}
	ids := func(ids []int64) []string {
		out := make([]string, len(ids))
		for i, id := range ids {
			out[i] = strconv.FormatInt(id, 10)
		}
		return out
	}
	show("lost", ids(r.missing))
	show("dropped as stale", ids(r.staleDropped))
	show("applied more than once", ids(r.doubled))
	show("order breaks", r.breaks)
	show("order keys behind", r.behind)
	show("ledger sums wrong", r.sums)
	if m := r.faultsMissing(); len(m) > 0 {
		fmt.Fprintf(w, "  never injected: %s (a longer -duration, or a shorter -fault-every)\n", strings.Join(m, "; "))
	}
	if len(r.pauseFaults) > 0 && r.pausedByFault() == 0 {
		fmt.Fprintf(w, "  the pause fault never paused order (a longer -fail-for)\n")
	}
}

func (r *report) verdict() string {
	if r.ok() {
		return "PASS: every message's effect exactly once, in each key's id order, every order key on its newest message, every ledger key on its sum"
	}
	return "FAIL"
}

func sum(m map[string]int) (n int) {
	for _, v := range m {
		n += v
	}
	return n
}
