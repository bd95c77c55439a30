package relay

import (
	"context"
	"encoding/json"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/xadm/relay/internal/store"
)

// Admin's statements, in internal/store's sql/admin.sql.

// adminRepository runs Admin's statements (internal/store renders them) for
// one table, with or without its optional requeued_at column. A dead row is an outbound ERROR row whose attempts reached the
// ceiling (@ceiling everywhere).
type adminRepository struct{ *store.AdminSQL }

func newAdminRepository(table string, requeued bool) (*adminRepository, error) {
	a, err := store.NewAdminSQL(table, requeued)
	if err != nil {
		return nil, err
	}
	return &adminRepository{a}, nil
}

func (r *adminRepository) countByStatus(ctx context.Context, db store.Querier, ceiling int) ([]StatusCount, error) {
	rows, err := db.Query(ctx, r.CountSQL, ceiling)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (StatusCount, error) {
		var c StatusCount
		err := row.Scan(&c.Type, &c.Status, &c.Dead, &c.Count)
		return c, err
	})
}

func (r *adminRepository) deadPage(ctx context.Context, db store.Querier, ceiling int, q DeadQuery) ([]DeadMessage, error) {
	sql, args := r.DeadPageSQL, []any{ceiling, q.AfterID, q.Limit, PayloadPreviewMax, LastErrorMax}
	if q.Type != "" {
		sql, args = r.DeadTypeSQL, append(args, q.Type)
	}
	return collectDead(db.Query(ctx, sql, args...))
}

func (r *adminRepository) deadRows(ctx context.Context, db store.Querier, ceiling int, ids []int64) ([]DeadMessage, error) {
	return collectDead(db.Query(ctx, r.DeadIDsSQL, ceiling, ids, PayloadPreviewMax, LastErrorMax))
}

// collectDead reads the rows of a dead-rows statement.
func collectDead(rows pgx.Rows, err error) ([]DeadMessage, error) {
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (DeadMessage, error) {
		var d DeadMessage
		err := row.Scan(&d.ID, &d.Type, &d.Key, &d.Attempts, &d.LastError, &d.CreatedAt, &d.UpdatedAt, &d.Payload)
		d.Permanent, d.AttemptsMade = permanence(d.LastError, d.Attempts)
		if n := utf8.RuneCountInString(d.Payload); n > PayloadPreviewMax {
			d.Payload, d.PayloadCut = cutRunes(d.Payload, PayloadPreviewMax), true
		}
		return d, err
	})
}

// cutRunes returns the first n runes of s.
func cutRunes(s string, n int) string {
	for i := range s {
		if n == 0 {
			return s[:i]
		}
		n--
	}
	return s
}

func (r *adminRepository) requeueAll(ctx context.Context, db store.Execer, ceiling int, s writeScope) (int64, error) {
	return rowsAffected(db.Exec(ctx, r.RequeueAllSQL, ceiling, s.types, s.excluded()))
}

func (r *adminRepository) requeueType(ctx context.Context, db store.Execer, ceiling int, typ string) (int64, error) {
	return rowsAffected(db.Exec(ctx, r.RequeueTypeSQL, ceiling, typ))
}

func (r *adminRepository) requeueIDs(ctx context.Context, db store.Execer, ceiling int, ids []int64, s writeScope) (int64, error) {
	return rowsAffected(db.Exec(ctx, r.RequeueIDsSQL, ceiling, ids, s.types, s.excluded()))
}

// cutoff is the database's now() minus retention, fixed once for a whole purge.
func (r *adminRepository) cutoff(ctx context.Context, db store.Querier, retention time.Duration) (time.Time, error) {
	var t time.Time
	err := db.QueryRow(ctx, store.PurgeCutoffSQL, retention.Seconds()).Scan(&t)
	return t, err
}

func (r *adminRepository) purgeChunk(ctx context.Context, db store.Execer, cutoff time.Time, limit int, s writeScope) (int64, error) {
	return rowsAffected(db.Exec(ctx, r.PurgeSQL, cutoff, limit, s.types, s.excluded()))
}

// purgeSamplePages is about how many pages estimatePurge samples of a table
// too large to count: 8 MB, tens of milliseconds. Its error is about 1/√m for
// m sampled pages holding rows to purge: on a table of a million rows (33,000
// pages) within 1.5% for half the table or more, about 10% for a tenth, 40%
// for a hundredth (TestPurgeEstimateMillion).
const purgeSamplePages = 1024

// estimatePurge counts the SENT rows delivered before cutoff, by type, on a
// table of at most sentCountMaxPages pages, and scales a TABLESAMPLE of about
// purgeSamplePages pages on a larger one. Not the planner: on a table never
// analyzed (a bulk load autovacuum has not reached) it guesses from default
// selectivities (9 rows for 960,000), and even analyzed it multiplies
// status = 'SENT' by sent_at < cutoff as if they were independent, though
// only SENT rows have a sent_at.
func (r *adminRepository) estimatePurge(ctx context.Context, db store.Querier, cutoff time.Time, scope writeScope) (PurgeEstimate, error) {
	est := PurgeEstimate{Cutoff: cutoff}
	srv, err := r.server(ctx, db)
	if err != nil {
		return est, err
	}
	est.Pages = srv.pages
	var sample int64 // the table's pages, to sample; 0 counts
	if est.Exact = srv.pages <= sentCountMaxPages; !est.Exact {
		sample, est.SampledPages = srv.pages, purgeSamplePages
	}
	counts, err := r.purgeCounts(ctx, db, cutoff, sample, scope)
	if err != nil {
		return est, err
	}
	for _, c := range counts {
		est.Rows += c.Rows
	}
	est.Types = counts
	return est, nil
}

// purgeCounts counts the SENT rows of scope's types delivered before cutoff
// by type: all of
// them with pages 0; else those of a sample of about purgeSamplePages of the
// table's pages, scaled by the pages the sample read.
func (r *adminRepository) purgeCounts(ctx context.Context, db store.Querier, cutoff time.Time, pages int64, scope writeScope) ([]TypeCount, error) {
	if pages == 0 {
		rows, err := db.Query(ctx, r.CountPurgeSQL, cutoff, scope.types, scope.excluded())
		if err != nil {
			return nil, err
		}
		return pgx.CollectRows(rows, func(row pgx.CollectableRow) (TypeCount, error) {
			var c TypeCount
			err := row.Scan(&c.Type, &c.Rows)
			return c, err
		})
	}
	pct := min(100, 100*float64(purgeSamplePages)/float64(pages))
	rows, err := db.Query(ctx, r.SamplePurgeSQL, cutoff, pct, scope.types, scope.excluded())
	if err != nil {
		return nil, err
	}
	var read int64
	counts, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (TypeCount, error) {
		var c TypeCount
		err := row.Scan(&c.Type, &c.Rows, &read)
		return c, err
	})
	for i := range counts {
		counts[i].Rows = int64(float64(counts[i].Rows)*float64(pages)/float64(max(read, 1)) + 0.5)
	}
	return counts, err
}

// The kinds of liveGroupsSQL's rows.
const (
	liveIsPending     = iota // a type's pending rows
	liveIsDue                // its failed rows whose retry came due
	liveIsBackoff            // its failed rows that wait out their backoff
	liveIsDead               // its dead rows
	liveIsCandidate          // one of its rows that may have waited longest for the relays
	liveIsUndelivered        // one of its rows that may be its oldest not yet delivered
)

// liveGroup is one row of liveGroupsSQL: a type's rows of one kind, with
// the first of them (head); or a candidate row (count 0).
type liveGroup struct {
	typ   string
	kind  int
	count int64
	at    time.Time // the earliest next attempt of the failed rows of the group
	head  RowHead
}

func (r *adminRepository) liveGroups(ctx context.Context, db store.Querier, ceiling int, backoff time.Duration) ([]liveGroup, error) {
	rows, err := db.Query(ctx, r.LiveGroupsSQL, ceiling, LastErrorMax, backoff.Seconds(), retryBackoffMax.Seconds())
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (liveGroup, error) {
		var g liveGroup
		var kind int32
		var count *int64
		var at, created, since, next *time.Time
		err := row.Scan(&g.typ, &kind, &count, &at, &g.head.ID, &g.head.Status, &g.head.Attempts, &created, &since, &next, &g.head.LastError)
		g.kind = int(kind)
		if count != nil {
			g.count = *count
		}
		g.at, g.head.CreatedAt, g.head.WaitingSince, g.head.NextAttempt = timeOr(at), timeOr(created), timeOr(since), timeOr(next)
		g.head.Permanent, g.head.AttemptsMade = permanence(g.head.LastError, g.head.Attempts)
		return g, err
	})
}

// timeOr is *t, or the zero time for a NULL.
func timeOr(t *time.Time) time.Time {
	if t == nil {
		return time.Time{}
	}
	return *t
}

// typeCount is a count of one type's rows.
type typeCount struct {
	typ   string
	count int64
}

func (r *adminRepository) sentByType(ctx context.Context, db store.Querier) ([]typeCount, error) {
	rows, err := db.Query(ctx, r.SentByTypeSQL)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (typeCount, error) {
		var c typeCount
		err := row.Scan(&c.typ, &c.count)
		return c, err
	})
}

// serverState is what Overview reads of the server and of the table's size.
type serverState struct {
	now                         time.Time
	inRecovery, defaultReadOnly bool
	analyzed                    bool  // the table has statistics (reltuples is known)
	pages                       int64 // the table's size now, in pages
}

func (r *adminRepository) server(ctx context.Context, db store.Querier) (serverState, error) {
	var s serverState
	err := db.QueryRow(ctx, store.ServerStateSQL, r.Table).Scan(&s.now, &s.inRecovery, &s.defaultReadOnly, &s.analyzed, &s.pages)
	return s, err
}

// sampledPages is how many pages sampleSent reads of a table never analyzed.
const sampledPages = 256

// sampleSent estimates the SENT rows of a table of pages pages that has no
// statistics yet, from a sample of about sampledPages of its pages.
func (r *adminRepository) sampleSent(ctx context.Context, db store.Querier, pages int64) (int64, error) {
	pct := min(100, 100*float64(sampledPages)/float64(max(pages, 1)))
	var n int64
	if err := db.QueryRow(ctx, r.SampleSentSQL, pct).Scan(&n); err != nil {
		return 0, err
	}
	return int64(float64(n) * 100 / pct), nil
}

// estimate runs an EXPLAIN (FORMAT JSON) and returns its top plan's row estimate.
func (r *adminRepository) estimate(ctx context.Context, db store.Querier, explainSQL string, args ...any) (int64, error) {
	var doc []byte
	if err := db.QueryRow(ctx, explainSQL, args...).Scan(&doc); err != nil {
		return 0, err
	}
	var plans []struct {
		Plan struct {
			Rows float64 `json:"Plan Rows"`
		}
	}
	if err := json.Unmarshal(doc, &plans); err != nil || len(plans) != 1 {
		return 0, fmt.Errorf("read the planner's estimate: unexpected EXPLAIN output %.200q", doc)
	}
	return int64(plans[0].Plan.Rows), nil
}

func (r *adminRepository) lockHolders(ctx context.Context, db store.Querier, keys []string) ([]LockHolder, error) {
	rows, err := db.Query(ctx, store.LockHoldersSQL, keys)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (LockHolder, error) {
		var h LockHolder
		var mode string
		var start, change, queryStart *time.Time
		var pid int32
		var parts []int32
		var of *int32
		err := row.Scan(&h.Key, &mode, &h.Granted, &pid, &h.User, &h.ApplicationName, &h.ClientAddr,
			&start, &h.State, &change, &h.Hidden, &h.At, &h.query, &queryStart, &parts, &of)
		for _, p := range parts {
			h.Partitions = append(h.Partitions, int(p))
		}
		if of != nil {
			h.PartitionsOf = int(*of)
		}
		if queryStart != nil {
			h.queryStart = *queryStart
		}
		h.PID = int(pid)
		h.Mode = LockExclusive
		if mode == "ShareLock" {
			h.Mode = LockShared
		}
		if start != nil {
			h.BackendStart = *start
		}
		if change != nil {
			h.StateChange = *change
		}
		return h, err
	})
}

func rowsAffected(tag pgconn.CommandTag, err error) (int64, error) {
	if err != nil {
		return 0, err
	}
	return tag.RowsAffected(), nil
}
