package relay

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
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
	// waiting at From. A row written before FromID and delivered within the
	// window is not counted: it waited longer than every row written around
	// it, or more than [HistoryLookbackMax]. A row that still waits is.
	FromID int64
}

// TypeHistory is one type's steps in a [History].
type TypeHistory struct {
	Type string
	// Delivered[i] is how many rows of the type were delivered (sent_at) in
	// step i.
	Delivered []int64
	// Lag[i] is the lag at the end of step i (Lag[len-1] is To): the age then
	// of the oldest row of the type that was waiting at that instant
	// (written, and neither delivered nor dead yet); 0 when none was.
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

// historyBackChunk is the first range of ids History reads back from the
// window's start.
const historyBackChunk = 1024

// History reads the last window of the table, in steps of step: per type,
// the rows delivered in each step and the lag at the end of each. It reads,
// through the primary key, the rows written in the window, whose first id it
// finds by a binary search over created_at (a few dozen one-row index
// lookups), and before them the rows that were still waiting when the window
// began; and the live rows through their partial indexes: never the
// delivered history before that. It costs in proportion to the rows of the
// window and of the backlog it began with, not to the table.
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
	h, err := a.repo.history(ctx, a.pool, a.maxAttempts, window, step)
	if err != nil {
		return h, fmt.Errorf("relay: read the history of %s: %w", a.table, err)
	}
	return h, nil
}

// History's statements are in sql/admin.sql (historyStart, historyBack,
// historyRead, historyLive).

// historyBack extends the window's first id back, from first, over the rows
// that were still waiting at from (written before it, delivered or dead
// after it, or live): in ranges of historyBackChunk ids, doubling, until a
// range where none was, or rows written more than HistoryLookbackMax before
// from. Its cost follows the lag at from: a range or two when delivery keeps
// up, the backlog's rows when it did not.
func (r *adminRepository) historyBack(ctx context.Context, db querier, minID, first int64, from time.Time, ceiling int) (int64, error) {
	at := float64(from.UnixMicro()) / 1e6
	oldest := from.Add(-HistoryLookbackMax)
	for hi, size := first, int64(historyBackChunk); hi > minID; size *= 2 {
		lo := max(hi-size, minID)
		var waiting *int64
		var created *time.Time
		if err := db.QueryRow(ctx, r.historyBackSQL, lo, hi, at, ceiling).Scan(&waiting, &created); err != nil {
			return 0, err
		}
		if waiting == nil {
			break // none of the range waited at from
		}
		first, hi = *waiting, lo
		if created != nil && created.Before(oldest) {
			break
		}
	}
	return first, nil
}

// historyBatch is the window's two reads, sent together: the rows delivered
// or dead in it (historyRead, sql/admin.sql) and the oldest live row of
// each type (historyLive).
func (r *adminRepository) historyBatch(first int64, fromEpoch float64, step time.Duration, steps, ceiling int, from time.Time) *pgx.Batch {
	b := &pgx.Batch{}
	b.Queue(r.historyReadSQL, first, fromEpoch, step.Seconds(), steps, ceiling, from)
	b.Queue(r.historyLiveSQL, ceiling)
	return b
}

func (r *adminRepository) history(ctx context.Context, db querier, ceiling int, window, step time.Duration) (History, error) {
	var h History
	var minID, first int64
	if err := db.QueryRow(ctx, r.historyStartSQL, window.Seconds()).Scan(&h.To, &minID, &first); err != nil {
		return h, err
	}
	h.From, h.Step = h.To.Add(-window), step
	steps := int(window / step)
	if window%step != 0 {
		steps++
	}
	first, err := r.historyBack(ctx, db, minID, first, h.From, ceiling)
	if err != nil {
		return h, err
	}
	h.FromID = first
	at := float64(h.From.UnixMicro()) / 1e6
	br := db.SendBatch(ctx, r.historyBatch(first, at, step, steps, ceiling, h.From))
	defer br.Close()

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
	var typ string
	var k1, k2, b *int32
	var created float64
	var n int64
	rows, err := br.Query()
	if err != nil {
		return h, err
	}
	_, err = pgx.ForEachRow(rows, []any{&typ, &k1, &k2, &b, &created, &n}, func() error {
		th := get(typ)
		switch {
		case b != nil: // the (type, b) set: deliveries of step b
			if i := int(*b); i >= 0 && i < steps {
				th.Delivered[i] += n
			}
		case k1 != nil && k2 != nil: // the (type, k1, k2) set: rows waiting at k1..k2
			cover(typ, int(*k1), int(*k2), created)
		}
		return nil
	})
	if err != nil {
		return h, err
	}
	// A live row waits from its first instant to now.
	if rows, err = br.Query(); err != nil {
		return h, err
	}
	_, err = pgx.ForEachRow(rows, []any{&typ, &created}, func() error {
		get(typ)
		first := int(math.Ceil((created - at) / step.Seconds()))
		cover(typ, first, steps, created)
		return nil
	})
	if err != nil {
		return h, err
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
