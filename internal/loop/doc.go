// Package loop is who runs a relay's pass, and when: the pass slot that
// Run, RunIfElected and the started relay's loop share, and the loop itself,
// one goroutine per started relay that waits on a timer, a wake-up and a
// stop, and passes. A message's path goes down from here and never back:
// the loop asks the election (internal/election) whether this replica holds
// it, and runs the pass (internal/pass) under what it holds.
//
// # Guarantees
//
//   - One pass of a relay at a time. A pass that would wait for one in
//     flight coalesces instead, as any loser of the election does, except
//     Run's direct pass, which waits.
//   - Passes never overlap, and each next one starts Interval after the
//     last ended: at once while a backlog remains (a drain cut at DrainMax),
//     wake.FollowUp after a woken pass that delivered (for the rows whose
//     producers did not notify), at once, once, after a pass that lost its
//     election, and later, doubling up to 5s (or Interval), while passes
//     fail.
//   - A standby (its last pass coalesced) leaves wake-ups to the holder and
//     only polls, once per Interval.
//   - The election kept between passes (internal/election, Polled) is kept
//     only while work keeps arriving: never after a failure, a backlog cut at
//     DrainMax, a stop, or a quiet Interval's pass that found nothing; the
//     loop's timer comes no later than its idle bound.
//   - Stop starts no new pass, message or batch; the pass in flight records
//     what it finished and lets go of the election. Past Stop's deadline the
//     sends in flight are cancelled, and Stop returns within one more second.
//
// # Failure handling
//
// A pass that panics costs that pass, never the loop: the panic is logged
// and the loop goes on. A pass after a lost election that finds the lock
// still taken fails rather than coalesces (its own old session's, most
// likely), so the replica backs off and elects again instead of becoming a
// standby. The first pass starts once the wake-up listener has tried its
// LISTEN, so that no commit falls between the two.
package loop
