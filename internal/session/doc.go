// Package session is the relay's own session and what rides on it: the one
// connection a started relay holds for its life, out of the pool (the
// wake-up listener's, internal/wake, or one that carries only presence), the
// statements other goroutines hand it between its waits (the loop's idle
// poll), presence, the claim of its types (one type, one app), and the check
// that the pool keeps its sessions, which every election and the listener
// ask before they trust a session.
//
// # Guarantees
//
//   - Presence (presence.go): every started relay holds shared advisory locks
//     that say it is live, with its types, ceiling, partitions and paused
//     types, for Admin to read; a killed process's go with its session, and
//     Stop lets go of them before it returns.
//   - One type, one app (ownership.go, decision 0043): a relay yields, on
//     its presence session, a type another app's live relays deliver on its
//     table, and takes it back once they have stopped.
//   - No session advisory lock on a pool that does not keep its sessions
//     (pooling.go): the check tells a direct or session-pooled pool from a
//     transaction-pooling proxy, once, and is kept.
//   - A statement handed to the session (session.go) runs on it between its
//     waits, or gets ErrNoSession at once: it never queues behind another.
//
// # Failure handling
//
// A session that answers from another backend than the one holding its locks
// (ErrPresenceMoved) is let go of and taken again; a closed session's locks
// are waited for until pg_locks no longer shows them (WaitLockGone). The
// package never calls the pass or the election.
package session
