// Package relay delivers the outbound rows of a PostgreSQL transactional outbox
// to their destinations, with instance election so that N replicas of one
// service never do the same delivery at the same time.
//
// A service writes a message row in the same transaction as its business data;
// the relay, running inside that service's process, picks the row up and
// delivers it through the [Sender] registered for its type (typically an HTTP
// PUT, see [HTTPSender]). Delivery is at-least-once: receivers deduplicate by
// the message ([Message.IdempotencyKey]), and a receiver that stores each
// natural key's state ignores a message older than the last one it applied for
// that key (docs/receivers.md in the store.Table).
//
// # The pass
//
// A pass selects a batch of outbound rows (direction 'OUT'), status PENDING or
// ERROR, attempts below [Config.MaxAttempts], of the registered types, oldest
// first, at most [Config.BatchSize] — outside any transaction. It sends each
// through its sender and records each outcome in its own short transaction:
// SENT, or ERROR with attempts + 1 and the error's text. A failure, a timeout or
// a panic in a sender marks only that row; the batch goes on.
//
// # The election
//
// Every periodic pass runs under pg_try_advisory_lock(hashtext(AppName ||
// '_relay_m2m')), held on one dedicated connection for the whole pass and
// released on that same connection (decision 0035). The replica that does not
// get it skips the pass; the next pass tries again. A JVM relay of the same app
// takes the same key, so the two exclude each other. [Config.ClusterLock] =
// false turns the election off (the escape hatch).
//
// # Use
//
//	cfg := relay.DefaultConfig()
//	cfg.AppName = "billing"
//	r, err := relay.New(pool, cfg, ordersSender, invoicesSender)
//	if err != nil {
//		return err
//	}
//	// Start's ctx cancels the sends in flight: stop gracefully with Stop instead.
//	if err := r.Start(context.WithoutCancel(ctx)); err != nil {
//		return err
//	}
//	<-ctx.Done() // SIGTERM
//	stopCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
//	defer cancel()
//	return r.Stop(stopCtx) // the messages in flight finish, the election is released
//
// [Relay.Run] runs one direct pass (tests, "run now"); [Relay.RunIfElected]
// runs the same pass under the election: it is the seam through which adopters
// prove, in their own integration tests, that the relay does not dispatch while
// another replica holds the election.
//
// # Producing, testing, operating
//
// [Enqueue] writes a message in the caller's own transaction, [EnqueueMany]
// many in one statement; [FromSQL] lets both write through database/sql (a
// *sql.Tx of GORM, Bun, sqlx or sqlc). Package relaytest
// gives an adopter's integration test a throwaway database and holds the
// election from another session exactly as a JVM replica would, to prove with
// [Relay.RunIfElected] that nothing is sent meanwhile. [Relay.Stats] and an
// [Observer] show what the relay does; [Admin] counts, lists and re-queues dead
// rows, purges the SENT history and tells who holds the election. The command
// relayctl and the console package (an http.Handler) put it in front of an
// operator. docs/operations.md in the store.Table lists the failure modes and
// their log lines.
//
// Any other job that must run on one replica of N can use the same [Guard]:
//
//	ran, err := relay.NewPostgresGuard(pool).TryRun(ctx, "billing_nightly_report", report)
package relay
