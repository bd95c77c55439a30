package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/xadm/relay/internal/pass"
	"github.com/xadm/relay/internal/session"
)

// This file is retention that runs itself ([Config.Retention]): a started
// relay runs, as an elected job of a [Scheduler] on its pool, the purge of
// the SENT rows of its own types older than the retention, on
// [Config.RetentionSchedule]. Each occurrence runs on one replica of the app,
// once ([Scheduler]'s "Once per occurrence"); the purge deletes chunks of
// [PurgeChunk] rows, oldest first, so producers and passes never wait on it.
// Its progress is in [Stats.Retention], in presence ([Replica.Retention]:
// relayctl status and who, the metrics' relay_retention_*), and in the log.

// retentionScheduleDefault is the default of [Config.RetentionSchedule].
const retentionScheduleDefault = "@hourly"

// retention is a started relay's retention job and its last run.
type retention struct {
	mu    sync.Mutex
	sched *Scheduler
	last  *RetentionRun
	total int64
}

// retentionKey is the job's lock: one per app and table.
func (r *Relay) retentionKey() string {
	return r.cfg.AppName + "_relay_retention:" + r.cfg.Table
}

// startRetention starts the retention job when Config.Retention is set.
func (r *Relay) startRetention(ctx context.Context) {
	if r.cfg.Retention <= 0 || !r.cfg.Enabled {
		return
	}
	s, err := NewScheduler(r.pool, SchedulerConfig{Logger: r.logger})
	if err == nil {
		err = s.Add(r.retentionKey(), r.cfg.RetentionSchedule, r.purgeOld)
	}
	if err == nil {
		err = s.Start(ctx)
	}
	if err != nil {
		r.logger.LogAttrs(ctx, slog.LevelError, "relay: retention: the job cannot run; SENT rows are kept", slog.String("error", err.Error()))
		return
	}
	r.ret.mu.Lock()
	r.ret.sched = s
	r.ret.mu.Unlock()
}

// stopRetention stops the retention job, within a second of ctx: a purge in
// flight is cut short (it resumes at the next occurrence), and so is the
// hold of its occurrence's window, which a purge run twice does not mind.
func (r *Relay) stopRetention(ctx context.Context) {
	r.ret.mu.Lock()
	s := r.ret.sched
	r.ret.sched = nil
	r.ret.mu.Unlock()
	if s == nil {
		return
	}
	sctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if err := s.Stop(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		r.logger.LogAttrs(ctx, slog.LevelWarn, "relay: retention: stop", slog.String("error", err.Error()))
	}
}

// purgeOld is the retention job: it purges the SENT rows of the types this
// relay delivers (not those it yields to another app) delivered longer ago
// than Config.Retention.
func (r *Relay) purgeOld(ctx context.Context) error {
	start := time.Now()
	types := slices.DeleteFunc(slices.Clone(r.types), func(t string) bool {
		return slices.ContainsFunc(r.yielded(), func(y YieldedType) bool { return y.Type == t })
	})
	var n int64
	err := errors.New("relay: retention: every type of this relay is yielded to another app")
	if len(types) > 0 {
		var admin *Admin
		if admin, err = NewAdmin(r.pool, r.cfg, AdminTypes(types...)); err == nil {
			n, err = admin.PurgeSent(ctx, r.cfg.Retention)
		}
	}
	run := RetentionRun{At: time.Now().UTC(), Deleted: n, Age: r.cfg.Retention, Took: time.Since(start)}
	if err != nil {
		run.Err = pass.Clip(err.Error(), 200)
	}
	r.ret.mu.Lock()
	r.ret.total += n
	run.Total = r.ret.total
	r.ret.last = &run
	r.ret.mu.Unlock()
	desc := &session.RetentionDescriptor{At: run.At.Truncate(time.Second), Deleted: n, Err: pass.Clip(run.Err, 80),
		Age: run.Age.String(), Took: run.Took.Round(time.Millisecond).String(), Total: run.Total}
	r.presence.SetRetention(desc)
	attrs := []slog.Attr{slog.String("table", r.cfg.Table), slog.Int64("rows", n), durationAttr("older_than", r.cfg.Retention),
		durationAttr("duration", run.Took)}
	if err != nil {
		r.logger.LogAttrs(ctx, slog.LevelError, "relay: retention: the purge failed; it runs again at its next occurrence",
			append(attrs, slog.String("error", err.Error()))...)
		return fmt.Errorf("relay: retention: %w", err)
	}
	r.logger.LogAttrs(ctx, slog.LevelInfo, "relay: retention: purged SENT rows", attrs...)
	return nil
}

// retentionRun is this relay's last retention run; nil when none ran.
func (r *Relay) retentionRun() *RetentionRun {
	r.ret.mu.Lock()
	defer r.ret.mu.Unlock()
	if r.ret.last == nil {
		return nil
	}
	run := *r.ret.last
	return &run
}
