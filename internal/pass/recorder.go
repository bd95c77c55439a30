package pass

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/xadm/relay/internal/relaytype"
	"github.com/xadm/relay/internal/store"
)

// This file holds the relay's promise about outcomes: a send is started only
// when its outcome can be recorded (a connection is held for it first), every
// outcome is fenced on the state the pass read, and a message whose outcome
// could not be recorded is not sent again before its backoff step: a
// read-only server, a starved pool, a column too narrow or a missing grant
// never turn into a storm of duplicates.

// delivery is one message's send, waiting to be recorded.
type delivery struct {
	m       *store.Row
	out     relaytype.Outcome
	sendErr error
	took    time.Duration
}

// newAttempts is the attempts column the outcome writes.
func (d *delivery) newAttempts(maxAttempts int) int64 {
	return d.out.Attempts(int64(d.m.Attempts), maxAttempts) // a NULL attempts was read as 0
}

// errorText is the failure's text as last_error, width characters wide, keeps it.
// A permanent failure's starts with permanentPrefix, which a cut keeps.
func (d *delivery) errorText(width int) string {
	if p := d.permanentPrefix(); p != "" {
		return Clip(p+ErrorText(d.sendErr, 0), width)
	}
	return ErrorText(d.sendErr, width)
}

// record is d as the table records it, its failure's text width characters
// wide at most.
func (d *delivery) record(maxAttempts, width int) store.Update {
	o := store.Update{ID: d.m.ID, Status: d.m.Status, ReadAttempts: d.m.ReadAttempts, Sent: d.out.Status() == store.StatusSent,
		NewAttempts: d.newAttempts(maxAttempts)}
	if !o.Sent {
		o.LastError = d.errorText(width)
	}
	return o
}

// permanentPrefix starts the last_error of a row that died of a permanent
// failure ([Permanent], a 4xx, a row that cannot be sent) before the ceiling,
// with the number of attempts really made: the row is written with attempts
// at the ceiling, so that it is dead by the table's own rule (ERROR and
// attempts >= MaxAttempts), which the JVM relay shares; "" for any other
// outcome.
func (d *delivery) permanentPrefix() string {
	if d.out != relaytype.OutcomeDead {
		return ""
	}
	switch {
	case d.m.Bad != "":
		return fmt.Sprintf(permanentMark+"%d attempt(s), not sent: ", d.m.Attempts)
	case permanentFailure(d.sendErr):
		return fmt.Sprintf(permanentMark+"%d attempt(s): ", d.m.Attempts+1)
	}
	return ""
}

// permanentMark starts the last_error of a permanent failure (permanentPrefix).
const permanentMark = "permanent after "

// ParsePermanent reads the mark a relay puts at the start of the last_error
// of a row that died of a permanent failure ("permanent after 1 attempt(s): …")
// and returns the number of attempts really made; ok is false for any other
// text, such as a row that reached MaxAttempts.
func ParsePermanent(lastError string) (attempts int, ok bool) {
	rest, ok := strings.CutPrefix(lastError, permanentMark)
	if !ok {
		return 0, false
	}
	num, _, ok := strings.Cut(rest, " attempt(s)")
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(num)
	if err != nil || n < 0 {
		return 0, false
	}
	return n, true
}

// Timings of recording.
const (
	// OutcomeTimeout bounds the short transaction that records one outcome (or
	// one group). It runs even when the pass was cancelled: the send happened.
	OutcomeTimeout = 10 * time.Second
	// outcomeGroupDelay bounds how long a recorded-later outcome waits for its
	// group to fill: with GroupOutcomes, a crash re-delivers at most
	// GroupOutcomes messages and never more than this much time's worth.
	outcomeGroupDelay = 100 * time.Millisecond
	// outcomePipeline is how many of a worker's outcomes may wait to be
	// written while it sends on, and so how many its writer writes in one
	// round trip (each in its own transaction). It is also what a crash of the
	// relay re-delivers at most, per worker, beyond the messages in flight.
	outcomePipeline = 8
	// adaptivePipeline is outcomePipeline for the adaptive default: what
	// queues behind one write goes in the next as one statement, so a worker
	// may run further ahead of its writes. A crash of the relay re-delivers
	// at most this many per worker, beyond the message in flight
	// (docs/decisions/0037-adaptive-outcomes.md).
	adaptivePipeline = 64
)

// heldConn is a pooled connection a worker (or the grouped recorder) holds
// for the outcomes of its sends, acquired from the Outbox before the first
// of them.
type heldConn struct {
	src Outbox
	c   store.Conn
}

// get returns the held connection, acquiring one first if there is none.
func (h *heldConn) get(ctx context.Context) (store.Conn, error) {
	if h.c != nil && !h.c.Conn().IsClosed() {
		return h.c, nil
	}
	h.release()
	c, err := h.src.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	h.c = c
	return c, nil
}

// release gives the connection back: the pool drops it if it died.
func (h *heldConn) release() {
	if h.c != nil {
		h.c.Release()
		h.c = nil
	}
}

// recorder records the outcomes of one pass through its strategy, chosen once
// per pass (newRecorder) from GroupOutcomes: by default (0) as soon as the
// sending worker's writer is free, alone when they trickle and together when
// they queue (adaptiveOutcomes, outcomes_adaptive.go); with 1, each in its own
// short transaction (eachOutcomes, outcomes_each.go); above 1, up to that many
// in one statement on a connection the strategy holds (groupedOutcomes,
// outcomes_grouped.go). All write through recorder.writeAs, which fences,
// retries and reports. The first failure to
// record stops the pass: nothing new is sent, and the messages whose outcome
// was lost are held back from re-sending.
//
// Nothing of the adopter's (its Observer, its log handler) is called while a
// lock of the recorder is held: a slow callback delays the goroutine that
// reports, never the other workers.
type recorder struct {
	r   *Runner
	ctx context.Context // never cancelled: a send that happened is recorded even during a stop
	res *Result
	outcomeStrategy

	// pipeline is how many of a worker's outcomes may wait to be written
	// while it sends on, and so how many its writer hands over at once.
	pipeline int
	// direct says the workers add their outcomes to the strategy themselves,
	// not through their writers: its add only queues them (groupedOutcomes,
	// which writes its groups behind the workers), so a hop to another
	// goroutine per message would buy no overlap.
	direct bool

	// waiting counts the outcomes sent and not yet written: handed to a
	// writer, and not yet back from the strategy's write.
	waiting waitCount

	mu  sync.Mutex
	err error // the first failure that stops the pass
}

// waitCount is a count and the most it reached, for PassReport.OutcomesWaiting.
type waitCount struct{ now, peak atomic.Int64 }

// add adds n (negative once written) and keeps the peak.
func (c *waitCount) add(n int) {
	v := c.now.Add(int64(n))
	for p := c.peak.Load(); v > p && !c.peak.CompareAndSwap(p, v); p = c.peak.Load() {
	}
}

// outcomeStrategy is how a pass's outcomes reach the table.
type outcomeStrategy interface {
	// ready is called before a send when nothing is in flight: a strategy
	// that writes on a connection of its own holds it first.
	ready(ctx context.Context) error
	// hold holds the connection a worker's outcomes are written on, before
	// the worker's first send, if the strategy writes on the worker's.
	hold(ctx context.Context, conn *heldConn) error
	// add records ds, sent by the worker whose held connection is conn.
	add(ds []delivery, conn *heldConn) error
	// flush writes what waits to be written, if anything.
	flush() error
	// close flushes and gives back what the strategy holds.
	close() error
}

func (r *Runner) newRecorder(ctx context.Context, res *Result) *recorder {
	rc := &recorder{r: r, ctx: context.WithoutCancel(ctx), res: res, pipeline: outcomePipeline}
	switch n := r.cfg.GroupOutcomes; {
	case n > 1:
		rc.outcomeStrategy = &groupedOutcomes{rc: rc, size: n, conn: heldConn{src: r.deps.Outbox}, behind: make(chan struct{}, 1)}
		rc.direct = true
	case n == 1:
		rc.outcomeStrategy = eachOutcomes{rc}
	default:
		rc.outcomeStrategy, rc.pipeline = adaptiveOutcomes{rc}, adaptivePipeline
	}
	return rc
}

// keep remembers the first failure and returns it, nil while none.
func (rc *recorder) keep(err error) error {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if err != nil && rc.err == nil {
		rc.err = err
	}
	return rc.err
}

// errorOf is the pass's stopping failure, nil while none.
func (rc *recorder) errorOf() error { return rc.keep(nil) }

// write records ds in one statement on conn's connection and reports them.
//
// It tries again once, on a fresh connection, only when the connection itself
// failed (a failover, a killed session): the outcome is fenced on the state
// the pass read, so a second write is harmless, and when the first one did
// commit but its answer was lost, the second finds the row already in the
// state it meant to write and counts it as recorded. It tries again once with
// a shorter failure text when the text did not fit its column. Any other
// error (read-only server, permission, constraint) is not retried: the
// messages are held back from re-sending and the pass stops, saying why.
//
// It returns the outcomes it recorded, for the caller to [recorder.report]
// once it holds no lock.
func (rc *recorder) write(ds []delivery, conn *heldConn) ([]delivery, error) {
	return rc.writeAs(ds, conn, writeTogether)
}

// writeMode is how writeAs writes several outcomes.
type writeMode int

const (
	// writeTogether writes them in one statement, one transaction.
	writeTogether writeMode = iota
	// writeApart writes each in its own transaction, all in one round trip
	// (repository.recordEach); a statement that fails alone is written again
	// on its own, as write would write it.
	writeApart
	// writeTogetherOrApart writes them together, and apart if the server
	// refuses the statement as a whole: one row's failure (a constraint, a
	// trigger) never costs the others their outcome.
	writeTogetherOrApart
)

// writeAs is write, with several outcomes written as mode says.
func (rc *recorder) writeAs(ds []delivery, conn *heldConn, mode writeMode) (recorded []delivery, err error) {
	r := rc.r
	ctx, cancel := context.WithTimeout(rc.ctx, OutcomeTimeout)
	defer cancel()
	width := r.deps.Outbox.ErrWidth()
	var failed map[int64]error
	record := func() (map[int64]bool, error) {
		c, err := conn.get(ctx)
		if err != nil {
			return nil, err
		}
		outs := make([]store.Update, len(ds))
		for i := range ds {
			outs[i] = ds[i].record(r.cfg.MaxAttempts, width)
		}
		if mode == writeApart && len(ds) > 1 {
			var stale map[int64]bool
			stale, failed, err = r.deps.Outbox.RecordEach(ctx, c, outs)
			return stale, err
		}
		return r.deps.Outbox.Record(ctx, c, outs)
	}
	stale, err := record()
	if err != nil && store.ConnectionFailed(err) && ctx.Err() == nil {
		maybeCommitted := !pgconn.SafeToRetry(err)
		conn.release()
		if stale, err = record(); err == nil && maybeCommitted && len(stale) > 0 {
			stale = rc.ownEarlierWrite(ctx, conn, ds, stale)
		}
	}
	if code := store.SQLState(err); len(code) == 2+3 && code[:2] == "22" && ctx.Err() == nil {
		// A data exception: the failure's text did not fit a column whose
		// width the relay did not know (or that changed). Record the outcome
		// with a short text rather than not at all, and learn the table again.
		r.deps.Outbox.Relearn()
		width = min(width, 100)
		for i := range ds {
			if !ds[i].out.Delivered() {
				ds[i].sendErr = fmt.Errorf("the failure's text could not be recorded (SQLSTATE %s): %.40s", code, ErrorText(ds[i].sendErr, 40))
			}
		}
		stale, err = record()
	}
	if err != nil && mode == writeTogetherOrApart && len(ds) > 1 && store.SQLState(err) != "" && !store.ConnectionFailed(err) && ctx.Err() == nil {
		return rc.writeAs(ds, conn, writeApart)
	}
	if err != nil {
		return nil, rc.unrecorded(ctx, ds, err)
	}
	var again []delivery // statements that failed alone, in a pipeline
	for _, d := range ds {
		if failed[d.m.ID] != nil {
			again = append(again, d)
			continue
		}
		r.held.forget(d.m.ID)
		if stale[d.m.ID] {
			r.deps.Logger.LogAttrs(ctx, slog.LevelWarn, "relay: outcome not recorded: the row changed while it was sent",
				slog.Int64("id", d.m.ID), slog.String("type", d.m.Type),
				slog.String("read_status", orNULL(d.m.Status)), slog.Int("read_attempts", d.m.Attempts))
			continue
		}
		recorded = append(recorded, d)
	}
	var first error
	for _, d := range again {
		done, err := rc.write([]delivery{d}, conn)
		recorded = append(recorded, done...)
		if err != nil && first == nil {
			first = err
		}
	}
	return recorded, first
}

// ownEarlierWrite looks at the rows whose retried outcome found them moved
// on: a row already in the state this outcome writes was recorded by the
// first attempt, whose answer the failure swallowed. It returns the rows that
// really had moved on.
func (rc *recorder) ownEarlierWrite(ctx context.Context, conn *heldConn, ds []delivery, stale map[int64]bool) map[int64]bool {
	c, err := conn.get(ctx)
	if err != nil {
		return stale
	}
	ids := make([]int64, 0, len(stale))
	for id := range stale {
		ids = append(ids, id)
	}
	now, err := rc.r.deps.Outbox.States(ctx, c, ids)
	if err != nil {
		return stale
	}
	for _, d := range ds {
		st, ok := now[d.m.ID]
		if !stale[d.m.ID] || !ok || st.Status == nil || st.Attempts == nil {
			continue
		}
		if *st.Status == d.out.Status() && *st.Attempts == d.newAttempts(rc.r.cfg.MaxAttempts) {
			delete(stale, d.m.ID)
		}
	}
	return stale
}

// unrecorded handles outcomes that could not be written: the messages are
// held back from re-sending for a backoff step, each is logged, and the
// error that stops the pass says why in the operator's terms.
func (rc *recorder) unrecorded(ctx context.Context, ds []delivery, err error) error {
	r := rc.r
	why := recordFailure(err, r.cfg.Table)
	for _, d := range ds {
		until := r.held.hold(d.m.ID)
		r.deps.Logger.LogAttrs(ctx, slog.LevelError, "relay: outcome not recorded; the message is not sent again before its backoff step",
			slog.Int64("id", d.m.ID), slog.String("type", d.m.Type), slog.Bool("sent", d.out.Delivered()),
			slog.String("not_before", until.UTC().Format(time.RFC3339)), slog.String("why", why), slog.String("error", err.Error()))
	}
	return fmt.Errorf("relay: record the outcome of %d message(s) from id %d: %s: %w", len(ds), ds[0].m.ID, why, err)
}

// recordFailure says in an operator's terms why an outcome could not be written.
func recordFailure(err error, table string) string {
	switch code := store.SQLState(err); {
	case errors.Is(err, store.ErrPoolExhausted):
		return "the pool had no free connection"
	case code == "25006":
		return "the server is read-only (a hot standby, or default_transaction_read_only)"
	case code == "42501":
		return "permission denied: the relay's role needs SELECT and UPDATE on " + table
	case len(code) == 5 && code[:2] == "22":
		return "a value does not fit its column (SQLSTATE " + code + ")"
	case len(code) == 5 && code[:2] == "23":
		return "the table refused the update: a constraint or trigger (SQLSTATE " + code + ")"
	case code == "57014":
		return "the update was cancelled (statement_timeout, or an operator)"
	case store.ConnectionFailed(err):
		return "the database connection failed"
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Sprintf("the database did not answer within %s", OutcomeTimeout)
	}
	return "the database refused the update"
}

// report counts, logs and observes recorded outcomes. The caller holds no
// lock: the log handler and the Observer are the adopter's code.
func (rc *recorder) report(ds []delivery) {
	rc.mu.Lock()
	for _, d := range ds {
		rc.res.Add(d.out)
	}
	rc.mu.Unlock()
	for _, d := range ds {
		rc.reportOne(d)
	}
}

// reportOne logs one recorded outcome and tells the relay's Report.
func (rc *recorder) reportOne(d delivery) {
	r := rc.r
	ctx := rc.ctx
	attempts := int(d.newAttempts(r.cfg.MaxAttempts))
	switch d.out {
	case relaytype.OutcomeError:
		r.deps.Logger.LogAttrs(ctx, slog.LevelWarn, "relay: send failed; will retry",
			slog.Int64("id", d.m.ID), slog.String("type", d.m.Type), slog.Int("attempts", attempts), slog.String("error", ErrorText(d.sendErr, 0)))
	case relaytype.OutcomeDead:
		msg := "relay: send failed; message is dead until re-queued"
		if d.m.Bad != "" {
			msg = "relay: row cannot be delivered; marked dead without sending"
		}
		r.deps.Logger.LogAttrs(ctx, slog.LevelError, msg,
			slog.Int64("id", d.m.ID), slog.String("type", d.m.Type), slog.Int("attempts", attempts), slog.String("error", ErrorText(d.sendErr, 0)))
	}
	if r.deps.Report != nil {
		r.deps.Report(Report{Row: d.m, Outcome: d.out, Attempts: attempts, Took: d.took, Err: d.sendErr})
	}
}

// heldBack remembers, per message id, the outcomes this relay could not
// record, and until when the message must not be sent again: 1s after the
// first failure, doubling up to unrecordedBackoffMax. It is this process's
// memory; a restart forgets it, as it forgets everything in flight.
type heldBack struct {
	mu   sync.Mutex
	rows map[int64]heldRow
}

type heldRow struct {
	failures int
	until    time.Time
}

// unrecordedBackoffMax caps the wait before a message whose outcome could not
// be recorded is sent again.
const unrecordedBackoffMax = 5 * time.Minute

// hold holds id back for its next backoff step and returns until when.
func (h *heldBack) hold(id int64) time.Time {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.rows == nil {
		h.rows = make(map[int64]heldRow)
	}
	now := time.Now()
	if len(h.rows) > 1024 {
		for k, v := range h.rows { // forget what nobody asked about for an hour
			if now.Sub(v.until) > time.Hour {
				delete(h.rows, k)
			}
		}
	}
	e := h.rows[id]
	e.failures++
	e.until = now.Add(min(time.Second<<min(e.failures-1, 20), unrecordedBackoffMax))
	h.rows[id] = e
	return e.until
}

// waiting reports whether id is held back right now.
func (h *heldBack) waiting(id int64, now time.Time) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	e, ok := h.rows[id]
	return ok && now.Before(e.until)
}

// forget drops id: its outcome was recorded.
func (h *heldBack) forget(id int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.rows, id)
}

// orNULL is a nullable column's text for a log line.
func orNULL(s pgtype.Text) string {
	if !s.Valid {
		return "NULL"
	}
	return s.String
}
