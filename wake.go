package relay

import (
	"context"

	"github.com/xadm/relay/internal/session"
	"github.com/xadm/relay/internal/store"
	"github.com/xadm/relay/internal/wake"
)

// This file is the wake-up on commit as the relay starts it (internal/wake:
// the listener, and the producers' window).

// listen runs the started relay's listener until ctx ends, on the loop's
// own session (internal/loop starts it).
func (r *Relay) listen(ctx context.Context, own *session.OwnSession, wakeUp, attempted func()) {
	li := &wake.Listener{Pool: r.pool, Logger: r.logger, Channel: store.WakeChannel(r.tableID), Types: r.types,
		Wake: r.cfg.WakeOnCommit, Interval: r.cfg.Interval, Presence: r.presence, Sessions: r.sessions, Own: own, WakeUp: wakeUp}
	li.Run(ctx, attempted)
}

// WakeTriggerSQL returns the DDL of a trigger that wakes the relays of table
// (optionally schema-qualified) whenever rows are inserted by any producer,
// for producers that do not call [Enqueue] (a JVM service, plain SQL). It is
// idempotent. One statement notifies once per type it inserted; of several
// transactions inserting at once, only the one holding the wake-up token
// carries the NOTIFY, so the producers' commits stay concurrent. Its price is
// one more function call per INSERT statement. Unlike Enqueue it has no
// window of its own: while a long transaction holds the token, the relays
// find the rows of the others at their next poll.
func WakeTriggerSQL(table string) (string, error) { return store.WakeTriggerSQL(table) }

// CreateWakeTrigger installs [WakeTriggerSQL]'s trigger on table.
func CreateWakeTrigger(ctx context.Context, db Beginner, table string) error {
	return store.CreateWakeTrigger(ctx, db, table)
}
