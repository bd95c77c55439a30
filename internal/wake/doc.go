// Package wake is the wake-up on commit: producers NOTIFY when they write a
// message, and each started relay LISTENs on a session of its own, so a
// message reaches its Sender within milliseconds of its commit instead of at
// the next poll.
//
// # Guarantees
//
//   - Polling every Interval stays underneath: rows written without a NOTIFY
//     (the JVM, plain SQL), and relays behind a transaction-pooling proxy
//     where LISTEN cannot work, are still delivered within one Interval.
//   - Producers' commits stay concurrent: only one transaction at a time
//     carries the NOTIFY (the wake-up token), and a producer whose Enqueues
//     come densely tries at most once per UpWindow (window.go).
//
// # Failure handling
//
// The listener checks that its own test notification comes back before it
// trusts the session: through a transaction-pooling proxy it never does, and
// the relay says so once and polls; a late one (a loaded server) only makes
// it connect again. A lost connection is replaced with a backoff, and the
// loop is woken after each reconnection for what was missed meanwhile. The
// same session carries the relay's presence, let go of before Stop returns.
package wake
