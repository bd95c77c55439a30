package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
)

// This file holds the relay's promise about outcomes: a send is started only
// when its outcome can be recorded (a connection is held for it first), every
// outcome is fenced on the state the pass read, and a message whose outcome
// could not be recorded is not sent again before its backoff step: a
// read-only server, a starved pool, a column too narrow or a missing grant
// never turn into a storm of duplicates.

// outcome is what became of one message of a batch.
type outcome int

const (
	outcomeInterrupted outcome = iota // the pass was cancelled mid-send: nothing recorded, the row stays as read
	outcomeSent                       // SENT
	outcomeFailed                     // ERROR below the ceiling: a later pass retries it
	outcomeDead                       // ERROR at the ceiling: dead until an operator re-queues it
)

// delivery is one message's send, waiting to be recorded.
type delivery struct {
	m       *row
	out     outcome
	sendErr error
	took    time.Duration
}

// newAttempts is the attempts column the outcome writes.
func (d *delivery) newAttempts(maxAttempts int) int64 {
	read := int64(d.m.Attempts) // a NULL attempts was read as 0
	switch d.out {
	case outcomeSent:
		return read
	case outcomeDead:
		return max(read+1, int64(maxAttempts))
	default:
		return read + 1
	}
}

// errorText is the failure's text as last_error, width characters wide, keeps it.
// A permanent failure's starts with permanentPrefix, which a cut keeps.
func (d *delivery) errorText(width int) string {
	if p := d.permanentPrefix(); p != "" {
		return clip(p+errorText(d.sendErr, 0), width)
	}
	return errorText(d.sendErr, width)
}

// permanentPrefix starts the last_error of a row that died of a permanent
// failure ([Permanent], a 4xx, a row that cannot be sent) before the ceiling,
// with the number of attempts really made: the row is written with attempts
// at the ceiling, so that it is dead by the table's own rule (ERROR and
// attempts >= MaxAttempts), which the JVM relay shares; "" for any other
// outcome.
func (d *delivery) permanentPrefix() string {
	if d.out != outcomeDead {
		return ""
	}
	switch {
	case d.m.bad != "":
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
	// outcomeTimeout bounds the short transaction that records one outcome (or
	// one group). It runs even when the pass was cancelled: the send happened.
	outcomeTimeout = 10 * time.Second
	// outcomeGroupDelay bounds how long a recorded-later outcome waits for its
	// group to fill: with GroupOutcomes, a crash re-delivers at most
	// GroupOutcomes messages and never more than this much time's worth.
	outcomeGroupDelay = 100 * time.Millisecond
	// acquireTimeout bounds the wait for a pooled connection. The pass waits
	// for it before it sends, so a starved pool delays delivery, and says so,
	// but never costs a duplicate.
	acquireTimeout = 5 * time.Second
	// outcomePipeline is how many of a worker's outcomes may wait to be
	// written while it sends on, and so how many its writer writes in one
	// round trip (each in its own transaction). It is also what a crash of the
	// relay re-delivers at most, per worker, beyond the messages in flight.
	outcomePipeline = 8
)

// ErrPoolExhausted says the relay's pool had no free connection within a few
// seconds: the service's own code holds them all, or the pool is smaller than
// Concurrency + 2. The pass sent nothing it could not record; it stopped, and
// the next one tries again.
var ErrPoolExhausted = errors.New("relay: the pool has no free connection")

// ErrReadOnly says the server cannot write: a hot standby (after a failover,
// with a stale DNS name or a proxy that still points at the old primary), or a
// server with default_transaction_read_only on during a cutover. The relay
// sends nothing from such a server, since it could not record the outcome, and
// takes no election there, since a lock on a standby excludes nobody on the
// primary.
var ErrReadOnly = errors.New("relay: the server is read-only (a hot standby, or default_transaction_read_only)")

// acquire takes a connection from pool for what, waiting at most
// acquireTimeout; a pool that stays full is reported as [ErrPoolExhausted]
// with its size, not as a bare deadline.
func acquire(ctx context.Context, pool *pgxpool.Pool, what string) (*pgxpool.Conn, error) {
	actx, cancel := context.WithTimeout(ctx, acquireTimeout)
	defer cancel()
	c, err := pool.Acquire(actx)
	if err == nil {
		return c, nil
	}
	if ctx.Err() == nil && actx.Err() != nil {
		st := pool.Stat()
		return nil, fmt.Errorf("%w to %s within %s: all %d connections of the pool are in use; "+
			"give it Concurrency + 2 connections more than the service's own code holds at once", ErrPoolExhausted, what, acquireTimeout,
			st.MaxConns())
	}
	return nil, fmt.Errorf("relay: acquire a connection to %s: %w", what, err)
}

// heldConn is a pooled connection a worker (or the grouped recorder) holds
// for the outcomes of its sends, acquired before the first of them.
type heldConn struct {
	pool *pgxpool.Pool
	c    *pgxpool.Conn
}

// get returns the held connection, acquiring one first if there is none.
func (h *heldConn) get(ctx context.Context) (*pgxpool.Conn, error) {
	if h.c != nil && !h.c.Conn().IsClosed() {
		return h.c, nil
	}
	h.release()
	c, err := acquire(ctx, h.pool, "record an outcome")
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

// recorder records the outcomes of one pass: each in its own short
// transaction on the sending worker's held connection by default, or, with
// GroupOutcomes > 1, up to that many in one statement on a connection the
// recorder holds. The first failure to record stops the pass: nothing new is
// sent, and the messages whose outcome was lost are held back from re-sending.
type recorder struct {
	r   *Relay
	ctx context.Context // never cancelled: a send that happened is recorded even during a stop
	res *passResult

	grouped  bool
	flushing sync.Mutex // one group write at a time, so the last flush waits for a timer's
	conn     heldConn   // grouped: the connection the groups are written on
	mu       sync.Mutex
	pending  []delivery
	timer    *time.Timer
	err      error // the first failure that stops the pass
}

func (r *Relay) newRecorder(ctx context.Context, res *passResult) *recorder {
	return &recorder{
		r: r, ctx: context.WithoutCancel(ctx), res: res,
		grouped: r.cfg.GroupOutcomes > 1,
		conn:    heldConn{pool: r.pool},
	}
}

// ready holds, before the pass's first send, the connection the grouped
// outcomes will be written on. Without grouping each worker's writer holds
// its own (newWriter).
func (rc *recorder) ready(ctx context.Context) error {
	if !rc.grouped {
		return rc.errorOf()
	}
	rc.flushing.Lock()
	defer rc.flushing.Unlock()
	_, err := rc.conn.get(ctx)
	return rc.keep(err)
}

// writer writes one worker's outcomes on a goroutine of its own, so that the
// worker sends its next message while the last one's outcome is being
// written: the send and the write's round trip overlap. It holds the
// connection the outcomes are written on (one transaction each) from before
// the worker's first send; with GroupOutcomes it hands them to the recorder's
// group instead. It also says when a task's keys are done — once their
// outcomes are recorded, never before, so that the engine never selects a
// row whose outcome is on its way as if it were still waiting.
type writer struct {
	rc    *recorder
	conn  heldConn
	in    chan submission
	slots chan struct{} // one per outcome handed over and not yet recorded: at most outcomePipeline
	done  chan struct{}
}

// submission is outcomes to record; once they are, ack (if set) is closed and
// keys (if set) go to finished.
type submission struct {
	ds       []delivery
	ack      chan struct{}
	keys     []string
	finished chan<- []string
}

// newWriter starts a worker's writer, holding its connection first.
func (rc *recorder) newWriter(ctx context.Context) (*writer, error) {
	// The worker sends on while up to outcomePipeline outcomes wait to be
	// written (slots), in submissions that also carry its tasks' keys.
	w := &writer{rc: rc, conn: heldConn{pool: rc.r.pool}, in: make(chan submission, 2*outcomePipeline),
		slots: make(chan struct{}, outcomePipeline), done: make(chan struct{})}
	if !rc.grouped {
		if _, err := w.conn.get(ctx); err != nil {
			return nil, rc.keep(err)
		}
	}
	go w.run()
	return w, nil
}

func (w *writer) run() {
	defer close(w.done)
	for s := range w.in {
		// Whatever else is waiting goes in the same round trip, each outcome
		// in its own transaction.
		batch := []submission{s}
		n := len(s.ds)
	more:
		for n < outcomePipeline {
			select {
			case next, ok := <-w.in:
				if !ok {
					break more
				}
				batch = append(batch, next)
				n += len(next.ds)
			default:
				break more
			}
		}
		var ds []delivery
		for _, b := range batch {
			ds = append(ds, b.ds...)
		}
		if len(ds) > 0 {
			_ = w.rc.addAll(ds, &w.conn) // a failure stops the pass through rc.err
			for range ds {
				<-w.slots
			}
		}
		for _, b := range batch {
			if b.ack != nil {
				close(b.ack)
			}
			if b.finished != nil {
				b.finished <- b.keys
			}
		}
	}
}

// addAll records ds: each in its own transaction, all in one round trip, or
// into the group.
func (rc *recorder) addAll(ds []delivery, conn *heldConn) error {
	if !rc.grouped {
		return rc.keep(rc.writeEach(ds, conn, true))
	}
	for _, d := range ds {
		if err := rc.add(d, conn); err != nil {
			return err
		}
	}
	return nil
}

// record hands ds to the writer; with wait, it returns once they are
// recorded (a key's next message is sent only after its previous outcome is
// written, so a lost write can never let it overtake). It returns the pass's
// stopping failure, if any.
func (w *writer) record(ds []delivery, wait bool) error {
	for len(ds) > 0 || wait {
		n := min(len(ds), outcomePipeline)
		s := submission{ds: ds[:n:n]}
		ds = ds[n:]
		last := len(ds) == 0
		if wait && last {
			s.ack = make(chan struct{})
		}
		for range s.ds {
			w.slots <- struct{}{} // waits while outcomePipeline outcomes wait
		}
		w.in <- s
		if s.ack != nil {
			<-s.ack
		}
		if last {
			break
		}
	}
	return w.rc.errorOf()
}

// finish has the writer send keys to finished once every outcome handed to it
// before is recorded.
func (w *writer) finish(keys []string, finished chan<- []string) {
	w.in <- submission{keys: keys, finished: finished}
}

// close waits for the last outcome and gives the connection back.
func (w *writer) close() {
	close(w.in)
	<-w.done
	w.conn.release()
}

// add records d, at once on the worker's connection or as part of a group. It
// returns an error once a recording has failed: the pass then starts no new
// message.
func (rc *recorder) add(d delivery, worker *heldConn) error {
	if !rc.grouped {
		return rc.keep(rc.write([]delivery{d}, worker))
	}
	rc.mu.Lock()
	rc.pending = append(rc.pending, d)
	if len(rc.pending) < rc.r.cfg.GroupOutcomes {
		if rc.timer == nil {
			rc.timer = time.AfterFunc(outcomeGroupDelay, func() { _ = rc.flush() })
		}
		err := rc.err
		rc.mu.Unlock()
		return err
	}
	rc.mu.Unlock()
	return rc.flush()
}

// flush records the pending group, if any.
func (rc *recorder) flush() error {
	rc.flushing.Lock()
	defer rc.flushing.Unlock()
	rc.mu.Lock()
	group := rc.pending
	rc.pending = nil
	if rc.timer != nil {
		rc.timer.Stop()
		rc.timer = nil
	}
	rc.mu.Unlock()
	var err error
	if len(group) > 0 {
		err = rc.write(group, &rc.conn)
	}
	return rc.keep(err)
}

// close flushes the last group and gives the recorder's connection back.
func (rc *recorder) close() error {
	err := rc.flush()
	rc.flushing.Lock()
	rc.conn.release()
	rc.flushing.Unlock()
	return err
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
func (rc *recorder) write(ds []delivery, conn *heldConn) error { return rc.writeEach(ds, conn, false) }

// writeEach is write; with each, ds are written one transaction each, in one
// round trip (repository.recordEach), and a statement that fails alone is
// written again on its own, as write would write it.
func (rc *recorder) writeEach(ds []delivery, conn *heldConn, each bool) error {
	r := rc.r
	ctx, cancel := context.WithTimeout(rc.ctx, outcomeTimeout)
	defer cancel()
	width := r.table().errWidth
	var failed map[int64]error
	record := func() (map[int64]bool, error) {
		c, err := conn.get(ctx)
		if err != nil {
			return nil, err
		}
		if each && len(ds) > 1 {
			var stale map[int64]bool
			stale, failed, err = r.repo.recordEach(ctx, c, ds, r.cfg.MaxAttempts, width)
			return stale, err
		}
		return r.repo.record(ctx, c, ds, r.cfg.MaxAttempts, width)
	}
	stale, err := record()
	if err != nil && connectionFailed(err) && ctx.Err() == nil {
		maybeCommitted := !pgconn.SafeToRetry(err)
		conn.release()
		if stale, err = record(); err == nil && maybeCommitted && len(stale) > 0 {
			stale = rc.ownEarlierWrite(ctx, conn, ds, stale)
		}
	}
	if code := sqlState(err); len(code) == 2+3 && code[:2] == "22" && ctx.Err() == nil {
		// A data exception: the failure's text did not fit a column whose
		// width the relay did not know (or that changed). Record the outcome
		// with a short text rather than not at all, and learn the table again.
		r.forgetTable()
		width = min(width, 100)
		for i := range ds {
			if ds[i].out != outcomeSent {
				ds[i].sendErr = fmt.Errorf("the failure's text could not be recorded (SQLSTATE %s): %.40s", code, errorText(ds[i].sendErr, 40))
			}
		}
		stale, err = record()
	}
	if err != nil {
		return rc.unrecorded(ctx, ds, err)
	}
	var again []delivery // statements that failed alone, in a pipeline
	rc.mu.Lock()
	for _, d := range ds {
		if failed[d.m.ID] != nil {
			again = append(again, d)
			continue
		}
		r.held.forget(d.m.ID)
		if stale[d.m.ID] {
			r.logger.LogAttrs(ctx, slog.LevelWarn, "relay: outcome not recorded: the row changed while it was sent",
				slog.Int64("id", d.m.ID), slog.String("type", d.m.Type),
				slog.String("read_status", orNULL(d.m.status)), slog.Int("read_attempts", d.m.Attempts))
			continue
		}
		rc.report(d)
	}
	rc.mu.Unlock()
	var first error
	for _, d := range again {
		if err := rc.write([]delivery{d}, conn); err != nil && first == nil {
			first = err
		}
	}
	return first
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
	now, err := rc.r.repo.states(ctx, c, ids)
	if err != nil {
		return stale
	}
	for _, d := range ds {
		st, ok := now[d.m.ID]
		if !stale[d.m.ID] || !ok || st.status == nil || st.attempts == nil {
			continue
		}
		want := statusSent
		if d.out != outcomeSent {
			want = statusError
		}
		if *st.status == want && *st.attempts == d.newAttempts(rc.r.cfg.MaxAttempts) {
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
		r.logger.LogAttrs(ctx, slog.LevelError, "relay: outcome not recorded; the message is not sent again before its backoff step",
			slog.Int64("id", d.m.ID), slog.String("type", d.m.Type), slog.Bool("sent", d.out == outcomeSent),
			slog.String("not_before", until.UTC().Format(time.RFC3339)), slog.String("why", why), slog.String("error", err.Error()))
	}
	return fmt.Errorf("relay: record the outcome of %d message(s) from id %d: %s: %w", len(ds), ds[0].m.ID, why, err)
}

// recordFailure says in an operator's terms why an outcome could not be written.
func recordFailure(err error, table string) string {
	switch code := sqlState(err); {
	case errors.Is(err, ErrPoolExhausted):
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
	case connectionFailed(err):
		return "the database connection failed"
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Sprintf("the database did not answer within %s", outcomeTimeout)
	}
	return "the database refused the update"
}

// report counts, logs and observes one recorded outcome. Callers hold rc.mu.
func (rc *recorder) report(d delivery) {
	r := rc.r
	ctx := rc.ctx
	attempts := int(d.newAttempts(r.cfg.MaxAttempts))
	rep := MessageReport{ID: d.m.ID, Type: d.m.Type, Attempts: attempts, Duration: d.took, Err: d.sendErr}
	switch d.out {
	case outcomeSent:
		rc.res.sent++
		r.stats.sent.Add(1)
		rep.Outcome = OutcomeSent
	case outcomeFailed:
		rc.res.failed++
		r.stats.failed.Add(1)
		rep.Outcome = OutcomeError
		r.logger.LogAttrs(ctx, slog.LevelWarn, "relay: send failed; will retry",
			slog.Int64("id", d.m.ID), slog.String("type", d.m.Type), slog.Int("attempts", attempts), slog.String("error", errorText(d.sendErr, 0)))
	case outcomeDead:
		rc.res.dead++
		r.stats.dead.Add(1)
		rep.Outcome = OutcomeDead
		msg := "relay: send failed; message is dead until re-queued"
		if d.m.bad != "" {
			msg = "relay: row cannot be delivered; marked dead without sending"
		}
		r.logger.LogAttrs(ctx, slog.LevelError, msg,
			slog.Int64("id", d.m.ID), slog.String("type", d.m.Type), slog.Int("attempts", attempts), slog.String("error", errorText(d.sendErr, 0)))
	}
	if r.observer != nil {
		r.callObserver("MessageDone", func() { r.observer.MessageDone(rep) })
	}
}

// connectionFailed reports whether err is the connection's failure rather
// than the statement's: the network, a terminated or restarting server, a
// connection already closed. Only such a failure is worth trying again on
// another connection.
func connectionFailed(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, ErrPoolExhausted) {
		return false
	}
	if pgconn.SafeToRetry(err) {
		return true
	}
	if code := sqlState(err); code != "" {
		// 08: connection exception; 57P01..57P05: the server ended the
		// session (shutdown, crash, restart, database dropped, idle timeout).
		return code[:2] == "08" || strings.HasPrefix(code, "57P")
	}
	// Not the server's answer: a broken socket, EOF, a closed connection.
	return true
}

// sqlState is the SQLSTATE of a server error in err's chain, "" if none.
func sqlState(err error) string {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code
	}
	return ""
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
