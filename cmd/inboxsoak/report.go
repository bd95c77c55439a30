package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// report is what the soak saw.
type report struct {
	duration time.Duration
	drainErr error

	written  int // messages the producer committed
	writeErr int // producer transactions that failed
	keys     int // distinct keys written
	notSent  int // outbox rows not SENT at the end

	missing []int64  // written, no effect: lost
	doubled []int64  // written, more than one effect
	unknown int      // effects of ids nobody wrote
	behind  []string // keys whose final state is not their newest message

	faults   map[string]int
	cutConns int // connections the cuts froze
	released int // cut connections whose held request reached the receiver late

	details []string // what happened to the lost and doubled messages, and the keys behind

	answers   map[string]int // answers of the receiver by outcome ("applied", "duplicate", "stale", "503", …)
	delivered int            // messages the receiver answered at least once
	again     int            // answers beyond the first per message: the relay's re-deliveries
}

// ok reports whether the run passes: every message's effect exactly once,
// every key on its newest message, nothing lost, every row SENT, and every
// fault injected at least once.
func (r *report) ok() bool {
	return len(r.missing) == 0 && len(r.doubled) == 0 && r.unknown == 0 && len(r.behind) == 0 &&
		r.notSent == 0 && r.writeErr == 0 && r.drainErr == nil && len(r.faultsMissing()) == 0 && r.written > 0
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

// check reads the outbox and the receiver's tables and builds the report.
func (s *soak) check(ctx context.Context) (*report, error) {
	s.mu.Lock()
	r := &report{
		written: len(s.written), writeErr: s.writeErr, keys: len(s.newest),
		faults: map[string]int{}, cutConns: s.cutConns, released: s.released, answers: map[string]int{},
	}
	written := make(map[int64]string, len(s.written))
	for id, k := range s.written {
		written[id] = k
	}
	newest := make(map[string]int64, len(s.newest))
	for k, id := range s.newest {
		newest[k] = id
	}
	for k, n := range s.faults {
		r.faults[k] = n
	}
	perKey := map[string]int{}
	for outcome, byKey := range s.answers {
		for key, n := range byKey {
			r.answers[outcome] += n
			perKey[key] += n
		}
	}
	s.mu.Unlock()
	for _, n := range perKey {
		r.delivered++
		r.again += n - 1
	}

	if err := s.admin.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{s.table}.Sanitize()+" WHERE status <> 'SENT'").Scan(&r.notSent); err != nil {
		return nil, err
	}
	rows, err := s.rdb.Query(ctx, "SELECT message_id, count(*) FROM "+s.effects+" GROUP BY message_id")
	if err != nil {
		return nil, err
	}
	effects := map[int64]int{}
	for rows.Next() {
		var id int64
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			return nil, err
		}
		effects[id] = n
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	for id := range written {
		switch effects[id] {
		case 0:
			r.missing = append(r.missing, id)
		case 1:
		default:
			r.doubled = append(r.doubled, id)
		}
	}
	for id := range effects {
		if _, ok := written[id]; !ok {
			r.unknown++
		}
	}
	slices.Sort(r.missing)
	slices.Sort(r.doubled)

	rows, err = s.rdb.Query(ctx, "SELECT message_key, message_id FROM "+s.state)
	if err != nil {
		return nil, err
	}
	final := map[string]int64{}
	for rows.Next() {
		var k string
		var id int64
		if err := rows.Scan(&k, &id); err != nil {
			return nil, err
		}
		final[k] = id
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	for k, id := range newest {
		if final[k] != id {
			r.behind = append(r.behind, fmt.Sprintf("%s: %d, not %d", k, final[k], id))
		}
	}
	slices.Sort(r.behind)
	for _, id := range append(slices.Clone(r.missing), r.doubled...) {
		r.details = append(r.details, s.explain(ctx, id, written[id], newest[written[id]], final[written[id]]))
	}
	return r, nil
}

// explain says what happened to message id of key: its row, and what the
// receiver answered for it and for the key's other messages.
func (s *soak) explain(ctx context.Context, id int64, key string, newest, final int64) string {
	var b strings.Builder
	fmt.Fprintf(&b, "message %d of key %s (its newest %d, its final state %d):", id, key, newest, final)
	var status string
	var attempts int
	_ = s.admin.QueryRow(ctx, "SELECT status, attempts FROM "+pgx.Identifier{s.table}.Sanitize()+" WHERE id = $1", id).Scan(&status, &attempts)
	fmt.Fprintf(&b, " row %s after %d failed attempts", status, attempts)
	s.mu.Lock()
	defer s.mu.Unlock()
	var ids []int64
	for other, k := range s.written {
		if k == key {
			ids = append(ids, other)
		}
	}
	slices.Sort(ids)
	for _, other := range ids {
		mark := " "
		if other == id {
			mark = "*"
		}
		fmt.Fprintf(&b, "\n    %s %d: %v", mark, other, s.history[fmt.Sprintf("public.%s/%d", s.table, other)])
	}
	return b.String()
}

// print writes the report for a person.
func (r *report) print(w io.Writer) {
	fmt.Fprintf(w, "\ninboxsoak: %s\n", r.verdict())
	fmt.Fprintf(w, "  written     %d messages for %d keys (%d producer errors), over %s\n", r.written, r.keys, r.writeErr, r.duration.Round(time.Second))
	fmt.Fprintf(w, "  effects     %d lost, %d applied more than once, %d of unknown messages\n", len(r.missing), len(r.doubled), r.unknown)
	fmt.Fprintf(w, "  final state %d keys not on their newest message\n", len(r.behind))
	fmt.Fprintf(w, "  outbox      %d rows not SENT\n", r.notSent)
	if r.drainErr != nil {
		fmt.Fprintf(w, "  drain       %v\n", r.drainErr)
	}
	fmt.Fprintf(w, "  faults:\n")
	for _, k := range faultKinds {
		fmt.Fprintf(w, "    %3d  %s\n", r.faults[k], k)
	}
	fmt.Fprintf(w, "         (the cuts froze %d connections; %d held a request that reached the receiver late)\n", r.cutConns, r.released)
	var outcomes []string
	for o, n := range r.answers {
		outcomes = append(outcomes, fmt.Sprintf("%s %d", o, n))
	}
	slices.Sort(outcomes)
	fmt.Fprintf(w, "  deliveries  %d answers for %d messages: %s\n", sum(r.answers), r.delivered, strings.Join(outcomes, ", "))
	fmt.Fprintf(w, "              %d re-deliveries by the relay, each dropped by the inbox or retried after a failure\n", r.again)
	show := func(what string, ids []int64) {
		if len(ids) > 0 {
			fmt.Fprintf(w, "  %s: %v\n", what, ids[:min(len(ids), 20)])
		}
	}
	for _, d := range r.details {
		fmt.Fprintf(w, "  %s\n", d)
	}
	show("lost", r.missing)
	show("applied more than once", r.doubled)
	if len(r.behind) > 0 {
		fmt.Fprintf(w, "  behind: %v\n", r.behind[:min(len(r.behind), 20)])
	}
	if m := r.faultsMissing(); len(m) > 0 {
		fmt.Fprintf(w, "  never injected: %s (a longer -duration, or a shorter -fault-every)\n", strings.Join(m, "; "))
	}
}

func (r *report) verdict() string {
	if r.ok() {
		return "PASS: every message's effect exactly once, every key on its newest message, none lost"
	}
	return "FAIL"
}

func sum(m map[string]int) (n int) {
	for _, v := range m {
		n += v
	}
	return n
}
