// Package election is how a relay's passes are elected: at most one replica
// of an app delivers a key at a time (decision 0035), or, partitioned, one
// replica per partition (decision 0036), and a JVM relay of the same app
// excludes them and is excluded.
//
// # Guarantees
//
//   - One holder per key. The guard takes pg_try_advisory_lock(hashtext(key))
//     on a connection of its own, computed by the server exactly as the JVM
//     relay does; it never waits, and it never takes a lock its session
//     already holds (session locks stack).
//   - The lock is released on the session that took it, under its own
//     deadline; a connection that may still hold it is closed, never pooled.
//   - A holder stops before another can be elected (internal/lease): the
//     session runs with idle_session_timeout, the watch's heartbeat renews
//     the lease, and the pass asks the lease before each message.
//   - No election on a pool that does not keep its sessions (the check is
//     internal/session's): behind a transaction-pooling proxy the relay
//     refuses, and should the check miss, every statement on a lock's
//     session acts only on its backend (pooling.go).
//
// An election is a gate: it never calls the pass. It answers whether this
// replica holds the election, runs the job its caller gives it under what it
// holds (a context that carries the lease and ends with the election, the
// partitions held), and publishes what it keeps between passes (the kept
// election, the partitions held, for Stats).
//
// # States
//
// A polled election (the relay's own guard) is idle (one poll per Interval,
// holding nothing), elected for a pass, or kept between the loop's passes
// while work keeps arriving; it lets go after a failed pass, a backlog cut at
// DrainMax, a stop, or an idle Interval. A partitioned member holds the app's
// key in shared mode and its partitions' locks on one session for as long as
// the loop runs, and rebalances at the start of its passes; a pass a wake-up
// started within Interval of its last rebalance only looks at its own
// partitions.
//
// # Failure handling
//
// A session the server ends (failover, pg_terminate_backend, the lease) is
// noticed at once by the watch, which cancels the job's context with
// lease.ErrLost; the sends in flight are cancelled and nothing new starts. A
// lock statement that meets a FATAL took nothing and lets go of nothing. An
// adopter's Guard that panics fails the pass, never the relay.
package election
