package pass

import (
	"math"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/xadm/relay/internal/store"
)

// This file is the select of sql/pass.sql (fetch), as a model in Go: the
// engine's tests run on it without PostgreSQL (engine_test.go, lanes_test.go,
// keyorder_test.go), and TestSelectModel (the root's keyorder_test.go) checks
// it against the real select on random tables.

// modelRow is a row as the model reads it.
type modelRow struct {
	id       int64
	typ, key string
	status   string // "" is NULL, read as PENDING
	attempts int
	updated  time.Time
	size     int
	visible  bool // its transaction committed
}

// modelTable is a table and what a relay's select reads of it.
type modelTable struct {
	rows                []*modelRow // in id order
	maxAttempts         int
	batch, batchBytes   int // BatchSize; BatchBytes (0: no bound)
	partitions          int
	backoff, backoffCap time.Duration
	now                 time.Time
	partition           func(key string, n int) int
}

func (t *modelTable) live(r *modelRow) bool {
	return r.visible && r.status != store.StatusSent && r.attempts < t.maxAttempts
}

// waiting reports whether r, a failed row, still waits out its backoff.
func (t *modelTable) waiting(r *modelRow) bool {
	if r.status != store.StatusError || t.backoff == 0 || r.attempts == 0 {
		return false // a failed row with 0 attempts is a re-queued one: due at once
	}
	d := t.backoff << min(max(r.attempts, 1)-1, 40)
	if d > t.backoffCap || d <= 0 {
		d = t.backoffCap
	}
	return r.updated.After(t.now.Add(-d))
}

// fetch is the select's answer to q, its rows in id order, before the byte
// bound cuts it (cutBytes).
func (t *modelTable) fetch(q Query) store.Batch {
	var f store.Batch
	limit := t.batch
	if q.Keyed {
		limit = max(limit, len(q.Types))
	}
	epoch := q.Epoch
	if q.StartEpoch {
		epoch = math.MaxInt64
		f.Epoch = math.MinInt64
		for _, r := range t.rows {
			if r.visible {
				f.Epoch = r.id
			}
		}
	}
	inParts := func(r *modelRow) bool {
		return q.Parts == nil || slices.Contains(q.Parts, t.partition(r.key, t.partitions))
	}
	// windows: each lane's deliverable rows past its cursor, at most its width.
	type entry struct {
		r        *modelRow
		lane, rn int
	}
	var w []entry
	windows := make([][]*modelRow, len(q.Types))
	for i, typ := range q.Types {
		for _, r := range t.rows {
			if len(windows[i]) <= int(q.Width[i]) && r.typ == typ && t.live(r) && r.id > q.After[i] && inParts(r) && !t.waiting(r) {
				windows[i] = append(windows[i], r) // one more than its width: the lane has more
				if len(windows[i]) <= int(q.Width[i]) {
					w = append(w, entry{r: r, lane: i, rn: len(windows[i])})
				}
			}
		}
	}
	slices.SortFunc(w, func(a, b entry) int {
		if q.Keyed && a.rn != b.rn {
			return a.rn - b.rn
		}
		return int(a.r.id - b.r.id)
	})
	k := w[:min(limit, len(w))]
	inK := map[int64]bool{}
	last := make([]int64, len(q.Types))
	for i := range last {
		last[i] = math.MinInt64
	}
	for _, e := range k {
		inK[e.r.id] = true
		last[e.lane] = max(last[e.lane], e.r.id)
	}
	more := make([]bool, len(q.Types))
	cut := int64(math.MaxInt64)
	for i, rows := range windows {
		if last[i] == math.MinInt64 {
			continue // not in the batch: the select says nothing of it
		}
		for _, r := range rows {
			more[i] = more[i] || r.id > last[i]
		}
		if more[i] && q.Keyed {
			cut = min(cut, last[i])
		}
	}
	// failedBehind, and whether the select leaves some of the relay's types out.
	probe := q.Keyed && len(q.Types) < len(q.All)
	for i, typ := range q.Types {
		for _, r := range t.rows {
			probe = probe || r.typ == typ && t.live(r) && r.status == store.StatusError && (r.id <= q.After[i] || t.waiting(r))
		}
	}
	older := func(m *modelRow, also func(o *modelRow) bool) bool {
		for _, o := range t.rows {
			if o.key == m.key && o.id < m.id && t.live(o) && slices.Contains(q.All, o.typ) && !inK[o.id] && also(o) {
				return true
			}
		}
		return false
	}
	anyRow := func(*modelRow) bool { return true }
	failed := func(o *modelRow) bool { return o.status == store.StatusError }
	for _, e := range k {
		m := e.r
		var held store.Held
		switch {
		case q.Keyed && (probe || m.id > cut || m.id > epoch):
			switch {
			case !older(m, anyRow):
			case older(m, func(o *modelRow) bool { return slices.Contains(q.Later, o.typ) || t.waiting(o) }):
				held = store.HeldLater
			default:
				held = store.HeldAgain
			}
		case q.Keyed:
		case m.id > epoch:
			held = store.HeldAgain
		case !probe || !older(m, failed):
		case older(m, func(o *modelRow) bool { return failed(o) && t.waiting(o) }):
			held = store.HeldLater
		default:
			held = store.HeldAgain
		}
		row := store.Row{ID: m.id, Type: m.typ, Key: m.key, Attempts: m.attempts, Size: m.size,
			Payload: []byte(strings.Repeat("x", m.size)), Held: held}
		row.Status = pgtype.Text{String: m.status, Valid: m.status != ""}
		row.ReadAttempts = pgtype.Int8{Int64: int64(m.attempts), Valid: true}
		f.Rows = append(f.Rows, row)
		if more[e.lane] && !slices.Contains(f.More, m.typ) {
			f.More = append(f.More, m.typ)
		}
	}
	slices.SortFunc(f.Rows, func(a, b store.Row) int { return int(a.ID - b.ID) })
	if !q.Keyed && len(f.Rows) >= limit {
		f.More = append(f.More, q.Types...)
	}
	slices.Sort(f.More)
	f.More = slices.Compact(f.More)
	f.Full = len(f.More) > 0
	f.Rows = t.cutBytes(f.Rows, &f)
	return f
}

// cutBytes cuts rows, in id order, before the first that would take the
// batch past its byte bound (store.Table.Fetch).
func (t *modelTable) cutBytes(rows []store.Row, f *store.Batch) []store.Row {
	if t.batchBytes == 0 {
		return rows
	}
	budget := t.batchBytes
	for i, m := range rows {
		if budget -= m.Size; budget < 0 && i > 0 {
			f.Full, f.Cut = true, true
			return rows[:i]
		}
	}
	return rows
}
