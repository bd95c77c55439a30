// Package kafka delivers the messages of a relay outbox to Kafka: a
// [relay.Sender] (and [relay.BatchSender]) on franz-go's kgo client that
// produces each message as one record.
//
// It is a module of its own, github.com/xadm/relay/kafka, so that the relay's
// core depends on pgx and cron only.
//
// # Wiring
//
// One sender per message type, each building its own client from seed brokers:
//
//	orders, err := kafka.NewSender(kafka.Config{Type: "order.created", Topic: "orders", Brokers: []string{"kafka:9092"}})
//	defer orders.Close()
//	r, err := relay.New(pool, relay.DefaultConfig(), orders)
//
// Several types can share one client (and its connections) that the caller
// builds with kgo.NewClient and closes: pass it as [Config.Client].
//
// # Topics
//
// Every message of a sender's type goes to [Config.Topic]: give the senders of
// all types the same Topic for one topic, or each its own. Left empty, the
// topic is the type's own name, one topic per type. The topic must exist
// unless the client may create it (kgo.AllowAutoTopicCreation in
// [Config.Options], and a broker that allows it).
//
// # Records
//
// The record's key is the message's natural key, so the default partitioner
// puts all of a key's messages on one partition, in the order the relay hands
// them over: one at a time per key, in id order, the next only after the
// previous one succeeded. The value is the payload, verbatim (JSON). The
// headers are
//
//	Relay-Message-Id     the message's id, in decimal; it grows with each message of a key
//	Relay-Message-Type   the message's type
//	Relay-Attempt        the attempt being made, from 1
//	Idempotency-Key      names this one message (relay.Message.IdempotencyKey), never its key
//
// The producer is idempotent and waits for all in-sync replicas: a produce
// that the client retries after a lost answer is written once. Delivery is
// still at-least-once: a relay that crashes between the acknowledgement and
// the commit of the outcome produces the message again later, and after a
// failover a key's older message can arrive after a newer one. A consumer
// keeps, per key, the last Relay-Message-Id it applied and ignores a record
// whose id is not above it.
//
// # Errors
//
// Send returns nil once all in-sync replicas have the record. What retrying
// cannot fix is wrapped with [relay.Permanent], so the relay marks the row dead
// at once ([PermanentError] lists it: a record too large, a topic that does
// not exist, an ACL that denies the write); everything else (brokers down,
// leader elections, not enough replicas, the sender's [Config.Timeout]) is a
// plain error, which the relay retries with backoff, holding back the later
// messages of the key. [Config.Permanent] changes the classification.
//
// # Batches
//
// [Sender.SendBatch] produces many records at once and waits for all of them:
// one produce round for a whole batch instead of one round trip per message,
// and one error per message, so that a refused record fails only its own row.
// The relay calls it when its engine hands a batch to a [relay.BatchSender].
//
// # Receiving
//
// A consumer whose state lives in PostgreSQL hands each record to [Receive],
// which records it in the receiver's inbox (github.com/xadm/relay/inbox) and
// applies it in the same transaction, once, whatever the re-deliveries.
// Commit the record's offset after Receive returned, never before, with
// kgo.DisableAutoCommit or kgo.AutoCommitMarks:
//
//	for _, rec := range client.PollFetches(ctx).Records() {
//		_, err := kafka.Receive(ctx, ib, rec, apply)
//		if err != nil && !relay.IsPermanent(err) {
//			break // nothing applied: consume it again later
//		}
//		client.MarkCommitRecords(rec) // applied, a duplicate, or never applicable
//	}
package kafka
