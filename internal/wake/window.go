package wake

import (
	"sync"
	"sync/atomic"
	"time"
)

// This file is the wake-up on commit: producers NOTIFY when they write a
// message (Enqueue does, and a trigger can for producers it does not write
// for), and each started relay LISTENs on a connection of its own, so a
// message reaches its Sender within milliseconds of its commit instead of at
// the next poll. Polling every Interval stays underneath: rows written without
// a NOTIFY (the JVM, plain SQL), and relays behind a transaction-pooling proxy
// where LISTEN cannot work, are still delivered within one Interval.
//
// PostgreSQL commits the transactions that NOTIFY one at a time (they take a
// global lock through their WAL flush): measured, 8 producers that each
// notify commit at 0.41× their rate without. So only one transaction at a
// time carries the NOTIFY: it takes the wake-up token, a transaction-scoped
// try-lock on the channel, and the others, finding it taken, do not notify.
// Even one notifier at a time cost 8 producers 0.79–0.87× of a plain INSERT's
// commits (issue 21): a transaction was nearly always holding the token, and
// its commit was the slow one. So a producer process whose Enqueues of a type
// and table come densely (less than DenseGap, 2ms, apart) tries at most
// once per UpWindow (5ms): the other Enqueues of the window write their
// row with neither the token's try nor a NOTIFY. A sparser producer (200
// msg/s is 5ms apart) tries on every Enqueue, as before, so that a trickle's
// latency does not wait for the relay's follow-up. Rows written
// without a NOTIFY are found by the woken pass if they committed before it
// selected, else by the relay's follow-up poll, FollowUp after a woken
// pass that delivered. A token held by a long transaction would silence every
// other producer for its length, so an attempt notifies, token or not, when
// its process has not notified for ForceAfter (50ms). Enqueue and the
// trigger take the same token; the trigger has no window.

// Timings of the wake-up.
const (
	// FollowUp is how soon after a woken pass that delivered rows the
	// relay looks again, for rows whose producers did not notify because
	// another had just done so.
	FollowUp = 5 * time.Millisecond
	// probeTimeout bounds the wait for the listener's own test
	// notification, which does not come back through a transaction-pooling
	// proxy.
	probeTimeout = 2 * time.Second
	// retryMax caps the wait before the listener connects again.
	retryMax = 30 * time.Second
)

// The timings of a producer process's wake-up attempts (see above).
const (
	// UpWindow is how often, at most, a producer process tries to wake
	// the relays of a table for a type: one Enqueue per window carries the
	// attempt (the wake-up token's try, and the NOTIFY if it gets the token);
	// the others of the window write their row without either. It is
	// FollowUp, so that the rows of the window are, most of the time,
	// committed before the follow-up poll of the pass the attempt woke.
	UpWindow = FollowUp
	// DenseGap is the gap between two Enqueues of a process (of one type
	// and table) under which the second is dense: then UpWindow applies.
	DenseGap = 2 * time.Millisecond
	// ForceAfter is how long a producer process goes without notifying a
	// type and table before an attempt notifies without the token.
	ForceAfter = 50 * time.Millisecond
)

// Windows are a producer's wake-up attempts, per channel and type, with
// their timings. Every Enqueue shares one, Enqueues; a test gives Enqueue one of
// its own to change the timings.
type Windows struct {
	window, denseGap, forceAfter int64     // nanoseconds
	clock                        time.Time // the monotonic origin of the states' times
	states                       sync.Map  // channel + "\x00" + type → *State
}

func NewWindows(window, denseGap, forceAfter time.Duration) *Windows {
	return &Windows{window: int64(window), denseGap: int64(denseGap), forceAfter: int64(forceAfter), clock: time.Now()}
}

// Enqueues are this process's wake-up attempts, shared by every Enqueue:
// set once here, never reassigned.
var Enqueues = NewWindows(UpWindow, DenseGap, ForceAfter)

// State is when a producer last tried to wake, and last notified, a
// channel for a type (nanoseconds on its wakeWindows' clock).
type State struct {
	of       *Windows
	channel  string
	seen     atomic.Int64 // the last Enqueue
	attempt  atomic.Int64
	notified atomic.Int64
}

// Attempt reports whether the Enqueue of a message of typ into channel's
// table should try to wake the relays (nil: it comes densely after another
// Enqueue of this producer, and one tried within the window), and whether it
// should notify even without the token (this producer has not notified for
// forceAfter).
func (ws *Windows) Attempt(channel, typ string) (w *State, force bool) {
	return ws.AttemptAt(channel, typ, int64(time.Since(ws.clock)))
}

// AttemptAt is Attempt at now, nanoseconds on ws.clock.
func (ws *Windows) AttemptAt(channel, typ string, now int64) (w *State, force bool) {
	v, ok := ws.states.Load(channel + "\x00" + typ)
	if !ok {
		v, _ = ws.states.LoadOrStore(channel+"\x00"+typ, &State{of: ws, channel: channel})
	}
	w = v.(*State)
	seen := w.seen.Swap(now)
	if dense := seen != 0 && now-seen < ws.denseGap; !dense {
		w.attempt.Store(now)
	} else if prev := w.attempt.Load(); prev != 0 && now-prev < ws.window || !w.attempt.CompareAndSwap(prev, now) {
		return nil, false
	}
	last := w.notified.Load()
	return w, last == 0 || now-last >= ws.forceAfter
}

// NotifiedNow records that an attempt notified.
func (w *State) NotifiedNow() { w.notified.Store(max(int64(time.Since(w.of.clock)), 1)) }

// Channel is the channel the state's attempts notify.
func (w *State) Channel() string { return w.channel }
