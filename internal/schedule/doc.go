// Package schedule runs jobs on cron specs under the election: on N replicas,
// each with its own Scheduler and the same jobs, every occurrence of a job
// runs on one replica, once (relay.Scheduler is its public face). It takes
// its dependencies as one value (Deps): the guard, the database, a logger.
//
// # Guarantees
//
//   - An occurrence runs at most once across replicas, and once more per
//     runner that vanishes within its window (below). At its time T every
//     replica tries the job's lock through the Guard. The winner reads the
//     database's clock, runs the job only before T + window, then holds the
//     lock until that clock has passed T + window. A later try finds the
//     lock held, or the window over.
//   - One clock decides: the database's (clock_timestamp()), so the replicas'
//     own clocks may drift. Specs are read in one Location (UTC by default),
//     and @every d falls on multiples of d: replicas agree on T.
//   - The window is the Tolerance (10s), capped at half the gap to the next
//     occurrence, so the hold ends before the next one is due.
//   - Runs of one job never overlap. An occurrence due while its run goes on
//     is skipped, and logged; the hold reaches the last such one's window.
//   - The price: an occurrence no replica reaches within its window is
//     skipped, never run late; the next one runs as usual.
//
// # Failure handling
//
// A runner that vanishes mid-run (its lock's session terminated, its process
// killed, a Stop that cut its hold short) frees the lock early. The losers
// keep trying it, every eighth of the window (50ms to 1s), until T + window:
// one that wins within it logs that the runner vanished and runs T again,
// holding in turn. So T runs once more per death, and never after its
// window. The job may have done part of its work, or all of it: a job should
// tolerate a second run. A runner whose lock is lost gets its ctx cancelled
// with lease.ErrLost.
//
// A job's panic becomes an error, logged with its stack; later occurrences
// run. A panic in the guard, perhaps the adopter's, is logged too. A clock
// that cannot be read before the job runs skips the occurrence; during the
// hold the local clock stands in.
//
// Stop waits for the runs in flight and their windows. Once its ctx ends, or
// Start's (a hard stop), the jobs' contexts are cancelled; a cut hold may let a
// late replica run that occurrence again. A job that has not returned 250ms
// later is abandoned: logged at ERROR, its goroutine left to it, and its
// guard told election.ErrJobAbandoned. The default guard then closes the
// lock's session and waits until the server drops the lock. Until the job
// returns, this process starts none of its occurrences. After the grace, Stop
// waits 4s at most for the guards: one of the adopter's cannot be forced, and
// Stop says which locks may still be held.
package schedule
