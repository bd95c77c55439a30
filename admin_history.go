package relay

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/xadm/relay/internal/store"
)

// History is the recent past of an outbox table, by type and step (a
// minute, typically), as [Admin.History] reads it from the rows themselves:
// how many messages were delivered in each step, and how far behind delivery
// was at the end of each.
type History struct {
	// From and To are the window on the database's clock: To is its now(),
	// From is To minus the window. Step i covers [From+i·Step, From+(i+1)·Step).
	From, To time.Time
	Step     time.Duration
	// Types has one entry per type with rows delivered in the window or
	// waiting during it, by type.
	Types []TypeHistory
	// FromID is the lowest id read besides the live rows: the first row
	// written in the window, moved back over the rows that were still
	// waiting at From (in ranges of 4,096 ids, a range of live rows counting
	// as waiting) until 1,024 ids in a row where none was (or an eighth of
	// the way back, if more). A row written before FromID and delivered
	// within the window is not counted: it waited longer than every row
	// written around it, or more than [HistoryLookbackMax]. A row that still
	// waits is.
	FromID int64
}

// TypeHistory is one type's steps in a [History].
type TypeHistory struct {
	Type string
	// Delivered[i] is how many rows of the type were delivered (sent_at) in
	// step i.
	Delivered []int64
	// Lag[i] is the lag at the end of step i (Lag[len-1] is To): how long
	// the row of the type that had waited longest for the relays at that
	// instant had waited, since it was written or re-queued (see
	// [RowHead.WaitingSince]), until it was delivered or died; 0 when none
	// was. A row that waits out a retry's backoff waits for no relay: a live
	// failed row counts from when its retry came due, and a row delivered
	// or dead after retries, whose earlier attempts the table does not date,
	// does not count.
	Lag []time.Duration
}

// Bounds of [Admin.History].
const (
	HistoryWindowMax = 24 * time.Hour
	HistoryStepMin   = time.Second
	HistoryStepsMax  = 1440
	// HistoryLookbackMax is how long before the window's start History
	// looks, at most, for rows written then and delivered within the window.
	HistoryLookbackMax = 24 * time.Hour
)

// History reads the last window of the table, in steps of step: per type,
// the rows delivered in each step and the lag at the end of each. It reads,
// in one statement, through the primary key, the rows written in the window,
// whose first id it finds by a binary search over created_at (a few dozen
// one-row index lookups), and before them the rows that were still waiting
// when the window began, each row once; and the live rows through their
// partial indexes: a range of ids that are all live is counted in the live
// index, not read, and each type's oldest waiting row is found by a skip
// scan. Never the delivered history before that. It costs in proportion to
// the delivered and dead rows of the window and of the backlog it began
// with, and to the index entries of the live ones, not to the table. On a
// table without the relay's partial indexes (the JVM's migration), it reads
// the live rows too.
// window must be in (0, [HistoryWindowMax]], step at least [HistoryStepMin],
// and window/step at most [HistoryStepsMax].
func (a *Admin) History(ctx context.Context, window, step time.Duration) (History, error) {
	switch {
	case window <= 0 || window > HistoryWindowMax:
		return History{}, fmt.Errorf("relay: History: window must be in (0, %s], got %s", HistoryWindowMax, window)
	case step < HistoryStepMin:
		return History{}, fmt.Errorf("relay: History: step must be at least %s, got %s", HistoryStepMin, step)
	case window/step > HistoryStepsMax:
		return History{}, fmt.Errorf("relay: History: at most %d steps, got %s / %s", HistoryStepsMax, window, step)
	}
	indexed, err := historyIndexed(ctx, a.pool, a.table)
	if err != nil {
		return History{}, fmt.Errorf("relay: read the indexes of %s: %w", a.table, err)
	}
	repo, err := a.repoOf(ctx)
	if err != nil {
		return History{}, err
	}
	h, err := repo.history(ctx, a.pool, a.maxAttempts, a.backoff, window, step, indexed)
	if err != nil {
		return h, fmt.Errorf("relay: read the history of %s: %w", a.table, err)
	}
	return h, nil
}

// History's statement is in sql/admin.sql (history): one round trip.

// The walk of History (sql/admin.sql): the ranges of ids it reads, and the
// run of ids where no row waited at the window's start that ends it (or an
// eighth of the distance walked below the window's first id, if more).
const (
	historyChunk = 4096
	historyGap   = 1024
)

// historyIndexes are the partial indexes History reads the live rows
// through (indexes.go): without any of them it reads them by the primary
// key's ranges, as it reads the rest.
var historyIndexes = []string{"_outbox", "_outbox_pending", "_outbox_error"}

// historyIndexed reports whether table has the partial indexes History's
// skip scans need.
func historyIndexed(ctx context.Context, db store.Querier, table string) (bool, error) {
	missing, err := missingIndexes(ctx, db, table)
	if err != nil {
		return false, err
	}
	id, err := store.ParseTable(table)
	if err != nil {
		return false, err
	}
	name := id[len(id)-1]
	for _, m := range missing {
		for _, suffix := range historyIndexes {
			if m.Name == strings.Trim(store.IndexName(name, suffix), `"`) {
				return false, nil
			}
		}
	}
	return true, nil
}

func (r *adminRepository) history(ctx context.Context, db store.Querier, ceiling int, backoff, window, step time.Duration, indexed bool) (History, error) {
	var h History
	steps := int(window / step)
	if window%step != 0 {
		steps++
	}
	rows, err := db.Query(ctx, r.HistorySQL, window.Seconds(), step.Seconds(), steps, ceiling,
		historyChunk, historyGap, HistoryLookbackMax.Seconds(), indexed, backoff.Seconds(), retryBackoffMax.Seconds())
	if err != nil {
		return h, err
	}
	type group struct {
		typ       string
		k1, k2, d *int32
		created   float64
		n         int64
	}
	var groups, heads []group
	var kind int32
	var g group
	var typ *string
	var now *time.Time
	var n *int64
	var c *float64
	_, err = pgx.ForEachRow(rows, []any{&kind, &typ, &g.k1, &g.k2, &g.d, &c, &n, &now}, func() error {
		switch kind {
		case 0:
			h.To, h.FromID = *now, *n
		case 1, 2:
			if typ == nil || kind == 2 && c == nil {
				return nil // no row: nothing to count
			}
			g.typ, g.created, g.n = *typ, 0, 0
			if c != nil {
				g.created = *c
			} else {
				g.k1, g.k2 = nil, nil // delivered after retries: counted, not drawn as waiting
			}
			if n != nil {
				g.n = *n
			}
			if kind == 1 {
				groups = append(groups, g)
			} else {
				heads = append(heads, g)
			}
		}
		return nil
	})
	if err != nil {
		return h, err
	}
	h.From, h.Step = h.To.Add(-window), step
	at := float64(h.From.UnixMicro()) / 1e6

	byType := map[string]*TypeHistory{}
	oldest := map[string][]float64{} // per type, per instant k (index k-1): the oldest row waiting then (0: none)
	get := func(typ string) *TypeHistory {
		th, ok := byType[typ]
		if !ok {
			th = &TypeHistory{Type: typ, Delivered: make([]int64, steps), Lag: make([]time.Duration, steps)}
			byType[typ] = th
			oldest[typ] = make([]float64, steps)
		}
		return th
	}
	cover := func(typ string, k1, k2 int, created float64) {
		o := oldest[typ]
		for k := max(k1, 1); k <= min(k2, steps); k++ {
			if o[k-1] == 0 || created < o[k-1] {
				o[k-1] = created
			}
		}
	}
	for _, g := range groups {
		th := get(g.typ)
		if g.d != nil { // delivered in step d
			if i := int(*g.d); i >= 0 && i < steps {
				th.Delivered[i] += g.n
			}
		}
		if g.k1 != nil && g.k2 != nil { // waiting at the instants k1..k2
			cover(g.typ, int(*g.k1), int(*g.k2), g.created)
		}
	}
	// A live row waits from its first instant to now.
	for _, g := range heads {
		get(g.typ)
		cover(g.typ, int(math.Ceil((g.created-at)/step.Seconds())), steps, g.created)
	}
	for typ, th := range byType {
		for k, o := range oldest[typ] {
			if o == 0 {
				continue
			}
			at := h.From.Add(time.Duration(k+1) * step)
			if at.After(h.To) {
				at = h.To
			}
			th.Lag[k] = max(at.Sub(time.UnixMicro(int64(o*1e6+0.5))), 0)
		}
		h.Types = append(h.Types, *th)
	}
	slices.SortFunc(h.Types, func(a, b TypeHistory) int { return strings.Compare(a.Type, b.Type) })
	return h, nil
}
