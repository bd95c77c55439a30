package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
)

// This file is Start and Stop: the started relay's loop, its wake-up
// listener and its retention job. The loop itself, the pass slot, backoff,
// follow-up, the kept election and the pass after a loss, is internal/loop.

// Start starts the periodic pass in the background and returns at once. The
// first pass starts at once (with WakeOnCommit, once the listener has tried
// its LISTEN, so no commit falls between the two); each next one starts
// Interval after the previous one ended (at once while a backlog is being
// drained, later while passes fail), never overlapping, under the election unless ClusterLock is off.
// When Enabled is false the loop runs but never passes. Cancelling ctx stops
// the loop and cancels the sends in flight; [Relay.Stop] stops it gracefully.
// Start returns an error if the relay is already started, and one wrapping
// [ErrTransactionPooling] if its pool does not keep its sessions (no election
// can run on it).
func (r *Relay) Start(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.loop != nil {
		select {
		case <-r.loop.Done():
		default:
			return errors.New("relay: already started; Stop it first")
		}
	}
	// No election runs behind a pooler that does not keep sessions: refuse
	// now, loudly, rather than fail every pass (a check that could not tell,
	// the database away, is tried again before the first election).
	if r.sessions != nil {
		if err := r.sessions.Verify(ctx, r.pool, r.logger); errors.Is(err, ErrTransactionPooling) {
			return fmt.Errorf("relay: Start: %w", err)
		}
	}
	passCtx, cancel := context.WithCancel(ctx)
	r.loop = r.passes.Start(passCtx, cancel, r.listen) // with Enabled, the listener carries presence even without WakeOnCommit
	r.startRetention(passCtx)                          // retention.go
	r.logger.LogAttrs(ctx, slog.LevelInfo, "relay: started",
		slog.Bool("enabled", r.cfg.Enabled), slog.Bool("cluster_lock", r.cfg.ClusterLock),
		durationAttr("interval", r.cfg.Interval), slog.String("table", r.cfg.Table), slog.Any("types", r.types),
		slog.String("replica", r.presence.ID()))
	return nil
}

// Stop stops the loop: no new pass starts, and the pass in flight starts no
// new message, finishes the ones in flight, records their outcomes and
// releases the election. It waits for that, or until ctx ends: then it cancels
// the sends still in flight (their rows are delivered again later), gives the
// pass up to one more second to record what finished and release the election,
// and returns ctx's error. What still runs after that (a database that does
// not answer) is logged and ends in the background within 15 s; a later Stop
// waits for it. Stop without Start, and a second Stop, are harmless.
func (r *Relay) Stop(ctx context.Context) error {
	r.mu.Lock()
	l := r.loop
	r.mu.Unlock()
	if l == nil {
		return nil
	}
	l.Halt()
	r.stopRetention(ctx) // retention.go
	return l.Wait(ctx)
}
