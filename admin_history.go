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

// historyStartSQL reads the clock and finds, by a binary search on the
// primary key, the first id whose row was written at or after $1 (now() - $1
// seconds): each step one index lookup of one row, all in one statement.
// created_at follows the ids but for transactions that overlap: near enough
// for a boundary, which historyBack then moves back over the rows waiting.
func (r *adminRepository) historyStartSQL() string {
	t := r.table
	return `WITH RECURSIVE b AS (
  SELECT now() AS now, now() - make_interval(secs => $1::float8) AS at,
    coalesce((SELECT min(id) FROM ` + t + `), 0) AS lo, coalesce((SELECT max(id) FROM ` + t + `), 0) AS hi
), s(lo, hi) AS (
  SELECT lo, hi + 1 FROM b
  UNION ALL
  SELECT CASE WHEN p.created_at < b.at THEN least(p.id + 1, s.hi) ELSE s.lo END,
    CASE WHEN p.created_at < b.at THEN s.hi ELSE s.lo + (s.hi - s.lo) / 2 END
  FROM s CROSS JOIN b
  LEFT JOIN LATERAL (SELECT id, created_at FROM ` + t + ` WHERE id >= s.lo + (s.hi - s.lo) / 2 ORDER BY id LIMIT 1) p ON true
  WHERE s.lo < s.hi
)
SELECT b.now, b.lo, (SELECT min(lo) FROM s WHERE lo >= hi) FROM b`
}

// historySQL groups the rows of the window that were delivered or died in
// it, in one read of the primary key's range: $1 the first id, $2 From (as
// seconds since the epoch: date_part is float8 arithmetic, where extract()
// would be numeric, several times slower), $3 the step in seconds, $4 the
// number of steps, $5 the ceiling, $6 From. A row waits over [created_at,
// ended): ended is sent_at for a SENT row, updated_at (when it died) for a
// dead one. Instant k is From + k·step (k = 1..steps, the end of step k-1);
// a row covers the instants k1..k2 with created_at <= instant < ended.
// Grouping by (type, k1, k2) keeps each group's oldest created_at; grouping
// by (type, b) counts the deliveries of step b: hash aggregates, no sort.
// The live rows of the range are filtered out before any arithmetic:
// historyLiveSQL reads the one of them that matters per type.
func (r *adminRepository) historySQL() string {
	return `SELECT type, k1, k2, b, min(c), count(*) FROM (
  SELECT type, c, greatest(ceil((c - $2::float8) / $3::float8), 1)::int AS k1,
    least(ceil((e - $2::float8) / $3::float8) - 1, $4::int)::int AS k2,
    CASE WHEN sent AND e >= $2::float8 THEN least(floor((e - $2::float8) / $3::float8), $4::int - 1)::int END AS b
  FROM (
    SELECT type, date_part('epoch', created_at) AS c, status = 'SENT' AS sent,
      date_part('epoch', CASE WHEN status = 'SENT' THEN sent_at ELSE updated_at END) AS e
    FROM ` + r.table + `
    WHERE id >= $1 AND direction = 'OUT'
      AND (status = 'SENT' AND sent_at >= $6 OR status = 'ERROR' AND attempts >= $5 AND updated_at > $6)
  ) r
) k
WHERE k1 <= k2 OR b IS NOT NULL
GROUP BY GROUPING SETS ((type, k1, k2), (type, b))`
}

// historyLiveSQL reads, per type, the first live row (the lowest id, the
// one the relays deliver first) of the pending and of the failed rows,
// through their partial indexes (their predicates repeated word for word):
// the oldest row waiting, which alone sets a type's lag while its rows wait.
// $1 the ceiling.
func (r *adminRepository) historyLiveSQL() string {
	t := r.table
	return `SELECT g.type, date_part('epoch', h.created_at) FROM (
  SELECT type, min(id) AS head FROM ` + t + ` WHERE direction = 'OUT' AND (status = 'PENDING' OR status IS NULL) GROUP BY type
  UNION ALL
  SELECT type, min(id) FROM ` + t + ` WHERE direction = 'OUT' AND status = 'ERROR' AND attempts < $1 GROUP BY type
) g JOIN ` + t + ` h ON h.id = g.head`
}

// historyBackSQL reads the lowest id of the rows of an id range [$1, $2)
// that were waiting at From ($3, seconds since the epoch), and the range's
// oldest created_at: one pk range read per step of the search back.
func (r *adminRepository) historyBackSQL() string {
	return `SELECT min(id) FILTER (WHERE status IS NULL OR status = 'PENDING' OR status = 'ERROR' AND attempts < $4
    OR date_part('epoch', CASE WHEN status = 'SENT' THEN sent_at WHEN status = 'ERROR' THEN updated_at END) > $3::float8),
  min(created_at)
FROM ` + r.table + ` WHERE id >= $1 AND id < $2 AND direction = 'OUT'`
}

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
		if err := db.QueryRow(ctx, r.historyBackSQL(), lo, hi, at, ceiling).Scan(&waiting, &created); err != nil {
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

func (r *adminRepository) history(ctx context.Context, db querier, ceiling int, window, step time.Duration) (History, error) {
	var h History
	var minID, first int64
	if err := db.QueryRow(ctx, r.historyStartSQL(), window.Seconds()).Scan(&h.To, &minID, &first); err != nil {
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
	batch := &pgx.Batch{}
	batch.Queue(r.historySQL(), first, at, step.Seconds(), steps, ceiling, h.From)
	batch.Queue(r.historyLiveSQL(), ceiling)
	br := db.SendBatch(ctx, batch)
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
