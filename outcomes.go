package relay

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

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
func (d *delivery) newAttempts(maxAttempts int) int {
	switch d.out {
	case outcomeSent:
		return d.m.Attempts
	case outcomeDead:
		return max(d.m.Attempts+1, maxAttempts)
	default:
		return d.m.Attempts + 1
	}
}

// outcomeGroupDelay bounds how long a recorded-later outcome waits for its
// group to fill: with GroupOutcomes, a crash re-delivers at most GroupOutcomes
// messages and never more than this much time's worth.
const outcomeGroupDelay = 100 * time.Millisecond

// recorder records the outcomes of one batch: each in its own short
// transaction by default, or, with GroupOutcomes > 1, up to that many in one
// statement. A recording that fails stops the batch: the sends it could not
// record will be delivered again by a later pass.
type recorder struct {
	r   *Relay
	ctx context.Context // never cancelled: a send that happened is recorded even during a stop

	flushing sync.Mutex // one group write at a time, so the last flush waits for a timer's
	mu       sync.Mutex
	res      *passResult
	pending  []delivery
	timer    *time.Timer
	err      error // the first recording failure
}

func (r *Relay) newRecorder(ctx context.Context, res *passResult) *recorder {
	return &recorder{r: r, ctx: context.WithoutCancel(ctx), res: res}
}

// add records d, at once or as part of a group. It returns an error once a
// recording has failed, and the batch must then start no new message.
func (rc *recorder) add(d delivery) error {
	if rc.r.cfg.GroupOutcomes <= 1 {
		return rc.keep(rc.write([]delivery{d}))
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
		err = rc.write(group)
	}
	return rc.keep(err)
}

// keep remembers the first recording failure and returns it, nil while none.
func (rc *recorder) keep(err error) error {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if err != nil && rc.err == nil {
		rc.err = err
	}
	return rc.err
}

// write records ds in one statement and reports them.
func (rc *recorder) write(ds []delivery) error {
	r := rc.r
	ctx, cancel := context.WithTimeout(rc.ctx, outcomeTimeout)
	defer cancel()
	stale, err := r.repo.record(ctx, r.pool, ds, r.cfg.MaxAttempts)
	if err != nil && ctx.Err() == nil {
		// Once more, on another connection: after a failover the pool's idle
		// connections are dead and the first statement on each fails. The
		// outcome is fenced on the state the pass read, so writing it twice is
		// harmless: if the first write did commit, the second finds the row
		// moved on and changes nothing.
		stale, err = r.repo.record(ctx, r.pool, ds, r.cfg.MaxAttempts)
	}
	if err != nil {
		for _, d := range ds {
			r.logger.LogAttrs(ctx, slog.LevelError, "relay: outcome not recorded; the message will be delivered again",
				slog.Int64("id", d.m.ID), slog.String("type", d.m.Type), slog.Bool("sent", d.sendErr == nil), slog.String("error", err.Error()))
		}
		return fmt.Errorf("relay: record the outcome of %d message(s) from id %d: %w", len(ds), ds[0].m.ID, err)
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	for _, d := range ds {
		if stale[d.m.ID] {
			r.logger.LogAttrs(ctx, slog.LevelWarn, "relay: outcome not recorded: the row changed while it was sent",
				slog.Int64("id", d.m.ID), slog.String("type", d.m.Type),
				slog.String("read_status", d.m.status), slog.Int("read_attempts", d.m.Attempts))
			continue
		}
		rc.report(d)
	}
	return nil
}

// report counts, logs and observes one recorded outcome. Callers hold rc.mu.
func (rc *recorder) report(d delivery) {
	r := rc.r
	ctx := rc.ctx
	attempts := d.newAttempts(r.cfg.MaxAttempts)
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
			slog.Int64("id", d.m.ID), slog.String("type", d.m.Type), slog.Int("attempts", attempts), slog.String("error", d.sendErr.Error()))
	case outcomeDead:
		rc.res.dead++
		r.stats.dead.Add(1)
		rep.Outcome = OutcomeDead
		r.logger.LogAttrs(ctx, slog.LevelError, "relay: send failed; message is dead until re-queued",
			slog.Int64("id", d.m.ID), slog.String("type", d.m.Type), slog.Int("attempts", attempts), slog.String("error", d.sendErr.Error()))
	}
	if r.observer != nil {
		r.observer.MessageDone(rep)
	}
}

// errorOf is the pass error once recording failed, nil otherwise.
func (rc *recorder) errorOf() error { return rc.keep(nil) }
