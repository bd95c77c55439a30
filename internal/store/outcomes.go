package store

import (
	"context"
	"fmt"
	"hash/fnv"
	"maps"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// The pass's outcomes; their statements are in sql/outcomes.sql.

// record writes the outcomes ds: one in its own short transaction, several in
// one statement. Each row is fenced on the state the pass read; it returns the
// ids of the rows that had moved on and were left alone.
func (r *Table) Record(ctx context.Context, db querier, ds []Update) (stale map[int64]bool, err error) {
	if len(ds) == 1 {
		d := &ds[0]
		sql, args := r.sentSQL, []any{d.ID, d.Status, d.ReadAttempts}
		if !d.Sent {
			sql, args = r.errorSQL, append(args, d.NewAttempts, d.LastError)
		}
		tag, err := db.Exec(ctx, sql, args...)
		if err != nil {
			return nil, err
		}
		if tag.RowsAffected() != 1 {
			return map[int64]bool{d.ID: true}, nil
		}
		return nil, nil
	}

	n := len(ds)
	if allSentFresh(ds) {
		ids := make([]int64, n)
		for i := range ds {
			ids[i] = ds[i].ID
		}
		rows, err := db.Query(ctx, r.groupSentSQL, ids)
		if err != nil {
			return nil, err
		}
		return staleOf(rows, ids)
	}
	ids, statuses, attempts := make([]int64, n), make([]pgtype.Text, n), make([]pgtype.Int8, n)
	newStatuses, newAttempts, errs := make([]string, n), make([]int64, n), make([]*string, n)
	for i := range ds {
		d := &ds[i]
		ids[i], statuses[i], attempts[i] = d.ID, d.Status, d.ReadAttempts
		newStatuses[i], newAttempts[i] = StatusSent, d.NewAttempts
		if !d.Sent {
			newStatuses[i] = StatusError
			errs[i] = &d.LastError
		}
	}
	rows, err := db.Query(ctx, r.groupSQL, ids, statuses, attempts, newStatuses, newAttempts, errs)
	if err != nil {
		return nil, err
	}
	return staleOf(rows, ids)
}

// staleOf reads the ids a grouped outcome returned, and returns those of ids
// it did not: the rows whose fence found them moved on. The statement returns
// only ids of ids, each once, so when it returned as many as ids none is
// stale: the common case builds no set.
func staleOf(rows pgx.Rows, ids []int64) (map[int64]bool, error) {
	recorded := make([]int64, 0, len(ids))
	var id int64
	if _, err := pgx.ForEachRow(rows, []any{&id}, func() error {
		recorded = append(recorded, id)
		return nil
	}); err != nil {
		return nil, err
	}
	if len(recorded) == len(ids) {
		return nil, nil
	}
	done := make(map[int64]bool, len(recorded))
	for _, id := range recorded {
		done[id] = true
	}
	stale := make(map[int64]bool, len(ids)-len(recorded))
	for _, id := range ids {
		if !done[id] {
			stale[id] = true
		}
	}
	return stale, nil
}

// allSentFresh reports whether every delivery of ds was sent from a row read
// as PENDING with no attempt: the common group, which has its own statement.
func allSentFresh(ds []Update) bool {
	for i := range ds {
		m := &ds[i]
		if !m.Sent || !m.Status.Valid || m.Status.String != StatusPending || !m.ReadAttempts.Valid || m.ReadAttempts.Int64 != 0 {
			return false
		}
	}
	return true
}

// recordEach writes each outcome of ds in its own implicit transaction, as
// record does one, but all of them in one round trip: a pipeline with a Sync
// after each statement, so that each commits (or fails) alone. It returns the
// rows whose fence found them moved on, and the rows whose own statement
// failed (a value that does not fit, a trigger); err is for the connection
// or the pipeline as a whole, after which nothing is known.
//
// It needs named prepared statements; on a connection whose pgx mode does not
// prepare statements (configured for a transaction-pooling proxy), it writes
// them one by one.
func (r *Table) RecordEach(ctx context.Context, c Conn, ds []Update) (stale map[int64]bool, failed map[int64]error, err error) {
	stale, failed = map[int64]bool{}, map[int64]error{}
	conn := c.Conn()
	if mode := conn.Config().DefaultQueryExecMode; mode != pgx.QueryExecModeCacheStatement && mode != pgx.QueryExecModeCacheDescribe {
		for _, d := range ds {
			st, err := r.Record(ctx, c, []Update{d})
			if err != nil {
				if SQLState(err) == "" || ConnectionFailed(err) {
					return nil, nil, err
				}
				failed[d.ID] = err
			}
			maps.Copy(stale, st)
		}
		return stale, failed, nil
	}
	sent, err := conn.Prepare(ctx, statementName(r.sentSQL), r.sentSQL)
	if err != nil {
		return nil, nil, err
	}
	failure, err := conn.Prepare(ctx, statementName(r.errorSQL), r.errorSQL)
	if err != nil {
		return nil, nil, err
	}
	text := func(v pgtype.Int8) []byte {
		if !v.Valid {
			return nil
		}
		return strconv.AppendInt(nil, v.Int64, 10)
	}
	var status []byte
	p := conn.PgConn().StartPipeline(ctx)
	for _, d := range ds {
		status = nil
		if d.Status.Valid {
			status = []byte(d.Status.String)
		}
		id := strconv.AppendInt(nil, d.ID, 10)
		if d.Sent {
			p.SendQueryStatement(sent, [][]byte{id, status, text(d.ReadAttempts)}, nil, nil)
		} else {
			n := pgtype.Int8{Int64: d.NewAttempts, Valid: true}
			p.SendQueryStatement(failure, [][]byte{id, status, text(d.ReadAttempts), text(n), []byte(d.LastError)}, nil, nil)
		}
		p.SendPipelineSync()
	}
	if err := p.Flush(); err != nil {
		p.Close()
		return nil, nil, err
	}
	for _, d := range ds {
		res, err := p.GetResults()
		if err == nil {
			rr, ok := res.(*pgconn.ResultReader)
			if !ok {
				p.Close()
				return nil, nil, fmt.Errorf("relay: pipeline: unexpected %T", res)
			}
			var tag pgconn.CommandTag
			if tag, err = rr.Close(); err == nil && tag.RowsAffected() != 1 {
				stale[d.ID] = true
			}
		}
		if err != nil {
			if SQLState(err) == "" || ConnectionFailed(err) {
				p.Close()
				return nil, nil, err
			}
			failed[d.ID] = err // its own transaction failed; the others are unaffected
		}
		if res, err = p.GetResults(); err != nil {
			p.Close()
			return nil, nil, err
		} else if _, ok := res.(*pgconn.PipelineSync); !ok {
			p.Close()
			return nil, nil, fmt.Errorf("relay: pipeline: want the Sync of id %d, got %T", d.ID, res)
		}
	}
	return stale, failed, p.Close()
}

// statementName names a statement the relay prepares itself, by its text.
func statementName(sql string) string {
	h := fnv.New64a()
	h.Write([]byte(sql))
	return fmt.Sprintf("relay_%016x", h.Sum64())
}

// states reads the current state of rows by id; a missing row is absent.
func (r *Table) States(ctx context.Context, db querier, ids []int64) (map[int64]State, error) {
	rows, err := db.Query(ctx, r.stateSQL, ids)
	if err != nil {
		return nil, err
	}
	out := make(map[int64]State, len(ids))
	var id int64
	var st State
	_, err = pgx.ForEachRow(rows, []any{&id, &st.Status, &st.Attempts}, func() error {
		out[id] = st
		return nil
	})
	return out, err
}
