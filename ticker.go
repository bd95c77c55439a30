package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/robfig/cron/v3"
)

// ticker is the periodic pass started by Start. It is not API: it applies the
// Enabled gate and delegates to the elected pass, draining a backlog under one
// election. robfig/cron schedules it, with Recover (a panic in a pass is logged,
// the ticker goes on) and SkipIfStillRunning (passes never overlap, never queue).
type ticker struct {
	cron   *cron.Cron
	cancel context.CancelFunc // hard stop: cancels the sends in flight
	halt   chan struct{}      // closed on Stop: no new message, batch or pass
	halted sync.Once
	done   chan struct{} // closed when the last pass has returned

	lastEnd atomic.Int64 // unix nanos when the last pass ended
	backlog atomic.Bool  // the last pass stopped draining with rows left
}

// Start starts the periodic pass in the background and returns at once. Passes
// start Interval after the previous one ended (the first one at once), never
// overlap, and run under the election unless ClusterLock is off. When Enabled
// is false the ticker runs but every tick does nothing. Cancelling ctx stops
// the ticker and cancels the sends in flight; [Relay.Stop] stops it gracefully.
// Start returns an error if the relay is already started.
func (r *Relay) Start(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ticker != nil {
		select {
		case <-r.ticker.done:
		default:
			return errors.New("relay: already started; Stop it first")
		}
	}
	passCtx, cancel := context.WithCancel(ctx)
	t := &ticker{cancel: cancel, halt: make(chan struct{}), done: make(chan struct{})}
	log := cronLogger{r.logger}
	// SkipIfStillRunning must wrap Recover, not the other way round: a panic
	// escaping SkipIfStillRunning's job loses its token and every later tick
	// is skipped for good.
	t.cron = cron.New(cron.WithLogger(log), cron.WithChain(cron.SkipIfStillRunning(log), cron.Recover(log)))
	t.cron.Schedule(every(tickResolution(r.cfg.Interval)), cron.FuncJob(func() { r.tick(passCtx, t) }))
	t.cron.Start()
	r.ticker = t
	go func() {
		select {
		case <-passCtx.Done():
		case <-t.halt:
		}
		t.stopOnce()
		<-t.cron.Stop().Done() // waits for the pass in flight
		cancel()
		close(t.done)
	}()
	r.logger.LogAttrs(ctx, slog.LevelInfo, "relay: started",
		slog.Bool("enabled", r.cfg.Enabled), slog.Bool("cluster_lock", r.cfg.ClusterLock),
		slog.Duration("interval", r.cfg.Interval), slog.String("table", r.cfg.Table), slog.Any("types", r.types))
	return nil
}

func (t *ticker) stopOnce() { t.halted.Do(func() { close(t.halt) }) }

// Stop stops the ticker: no new pass starts, and the pass in flight starts no
// new message, finishes the ones in flight, records their outcomes and releases
// the election. It waits for that, or until ctx ends: then it cancels the sends
// still in flight, waits for the pass to unwind (outcomes and unlock run under
// their own short deadlines) and returns ctx's error. Stop without Start, and a
// second Stop, are harmless.
func (r *Relay) Stop(ctx context.Context) error {
	r.mu.Lock()
	t := r.ticker
	r.mu.Unlock()
	if t == nil {
		return nil
	}
	t.stopOnce()
	select {
	case <-t.done:
		return nil
	case <-ctx.Done():
		t.cancel()
		<-t.done
		return fmt.Errorf("relay: stop: %w", ctx.Err())
	}
}

// tick is the periodic pass: the Enabled gate, then the elected pass, draining.
// It runs every tickResolution and passes unless Interval has gone by since the
// last pass ended, which makes Interval a delay between passes, not a rate.
func (r *Relay) tick(ctx context.Context, t *ticker) {
	if halted(ctx, &passOpts{halt: t.halt}) || !r.cfg.Enabled {
		return
	}
	if !t.backlog.Load() && time.Since(time.Unix(0, t.lastEnd.Load())) < r.cfg.Interval {
		return
	}
	defer func() { t.lastEnd.Store(time.Now().UnixNano()) }()
	res, _ := r.runIfElected(ctx, &passOpts{halt: t.halt, drain: true})
	t.backlog.Store(res.backlog && res.err == nil)
}

// tickResolution is how often the ticker wakes to see whether Interval has
// passed since the last pass ended: a tenth of it, within [10ms, 1s].
func tickResolution(interval time.Duration) time.Duration {
	return min(max(interval/10, 10*time.Millisecond), time.Second)
}

// every is a cron schedule of a fixed period, without cron.Every's rounding to
// whole seconds.
type every time.Duration

func (e every) Next(t time.Time) time.Time { return t.Add(time.Duration(e)) }

// cronLogger adapts slog to cron's logger. Cron's Info lines (every schedule
// and wake-up) go to Debug.
type cronLogger struct{ l *slog.Logger }

func (c cronLogger) Info(msg string, kv ...any) { c.l.Debug("relay: cron: "+msg, kv...) }
func (c cronLogger) Error(err error, msg string, kv ...any) {
	c.l.Error("relay: cron: "+msg, append(kv, "error", err)...)
}
