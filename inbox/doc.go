// Package inbox is the receiving half of the relay: it turns the relay's
// at-least-once delivery into one effect per message, for a receiver whose
// state lives in PostgreSQL.
//
// # The guarantee
//
// For each message, in one transaction of the receiver's own database, the
// inbox records the message's idempotency key, checks the key's last applied
// Relay-Message-Id, calls the receiver's [ApplyFunc] with that transaction, and
// commits. The message's record and its effects commit together or not at
// all, so:
//
//   - a message delivered again (the relay crashed before it recorded the
//     answer, the answer was lost, the receiver crashed after its commit and
//     before its answer) finds its record and is a [Duplicate]: apply is not
//     called, the answer is success;
//   - a message older than one applied for its key (a deposed relay's late
//     request, a dead message re-queued after its key's later ones) is
//     [Stale]: apply is not called, the answer is success;
//   - a failure anywhere before the commit (the receiver killed, its database
//     restarted, apply's error) leaves neither record nor effect, and the
//     relay's retry applies the message then.
//
// # Use
//
//	if err := inbox.CreateTable(ctx, pool, inbox.TableDefault); err != nil { … }
//	ib, err := inbox.New(pool, inbox.Config{})
//	mux.Handle("PUT /orders/{key}", ib.Handler(func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
//		_, err := tx.Exec(ctx, `INSERT INTO orders (id, state) VALUES ($1, $2)
//			ON CONFLICT (id) DO UPDATE SET state = excluded.state`, m.Key, m.Body)
//		return err
//	}))
//
// [Inbox.Handler] reads the relay's headers, answers 400 or 413 to a request
// it cannot read, and answers each outcome with the status the relay
// expects. A Kafka or JetStream consumer uses the Receive of the kafka or
// natsjs module, which read the same headers from a record or a message;
// any other transport builds a [Message] and calls [Inbox.Receive].
//
// # Signed requests
//
// With [Config.SigningSecrets] the Handler applies only what the relay
// signed: the Standard Webhooks signature (webhook-id, webhook-timestamp,
// webhook-signature) that relay.HTTPSenderConfig.SigningSecrets makes,
// checked against the same secrets (or Ed25519 public keys) before anything
// is read, applied or recorded; a request unsigned, forged, signed with a
// retired secret or older than [Config.SignatureTolerance] is answered 401,
// saying which. docs/security.md has the scheme and its rotation.
//
// # The tables
//
// [Config.Table] ("relay_inbox") holds one row per message received: its
// idempotency key (the primary key), a SHA-256 of its body and when it was
// received. The table named Table + "_keys" holds, per outbox table (the
// idempotency key's part before its last "/") and natural key, the id of the
// last message applied. One statement inserts the record (ON CONFLICT DO
// NOTHING) and, for a new one, raises the key's id unless it is as high
// already: one round trip more than the receiver's own transaction. The
// conflict clauses make two deliveries of one message, or of one key, wait
// for each other; the first to commit wins and the other is a duplicate or
// stale.
//
// # The stale-drop, and when to turn it off
//
// A receiver that stores each key's state (each message carries the whole
// state: the PUT model) wants the stale-drop: an older message must not
// overwrite a newer state. A receiver that applies each message as a change
// (appends an event, adds to a balance) sets [Config.KeepStale]: it must apply
// a dead message that an operator re-queued after later messages of its key
// went on, and deduplication alone keeps every other message to one effect.
//
// # Failure handling
//
//   - A duplicate whose body differs from the recorded one is refused with
//     [ErrBodyMismatch] (422): nothing is applied, the relay marks the row
//     dead, an operator looks at it.
//   - apply's error rolls everything back. Marked with [relay.Permanent] it is
//     a 422 (the row dies); otherwise a 503 (the relay retries).
//   - A panic in apply is recovered and logged, and the message retried.
//   - A commit whose answer is lost may have committed: the retry then finds
//     the record and is a duplicate.
//   - Records older than a retention age are deleted by [Inbox.Purge], which
//     [Inbox.RetentionJob] runs as a job of the relay's Scheduler.
//
// # Kafka and NATS: acknowledge after the commit
//
// A consumer commits the database transaction first (Receive returns) and
// then the record's offset, or the JetStream message's Ack. A crash between
// the two delivers the message again, and the inbox drops it as a duplicate.
// The other order loses the message when the process dies between the
// acknowledgement and the commit.
package inbox
