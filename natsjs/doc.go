// Package natsjs is a [relay.Sender] that publishes outbox messages to NATS
// JetStream, in a module of its own so that the relay's core depends on no
// broker client.
//
// Each row becomes one JetStream message, and the row is SENT once a stream
// acknowledged it:
//
//	js, _ := jetstream.New(nc)                                  // the service's NATS connection
//	orders, _ := natsjs.New(js, natsjs.Config{Type: "order"})   // one Sender per message type
//	r, _ := relay.New(pool, relay.DefaultConfig(), orders)
//
// or, with a connection of its own that [Sender.Close] closes:
//
//	orders, _ := natsjs.Connect("nats://localhost:4222", natsjs.Config{Type: "order"})
//
// A stream must be bound to the subjects ("relay.>" by default): natsjs never
// creates one, the stream's retention, replicas and duplicate window being the
// operator's choice.
//
// # Subjects
//
// A message of type T and natural key K goes to "relay.<Token(T)>.<Token(K)>"
// ([Config.SubjectPrefix] replaces "relay"). [Token] percent-encodes every byte
// but letters, digits, "-", "_" and "~", so any key fits in one token, two
// keys never share one, and [ParseToken] gives the key back: "order-17" stays
// "order-17", "a.b" becomes "a%2Eb", the empty key is "%". A consumer of one
// key subscribes to "relay.order." + natsjs.Token(key). [Config.Subject]
// chooses another subject.
//
// # Headers
//
//   - Nats-Msg-Id: [relay.Message.IdempotencyKey], the table and the row's id.
//     It names one message, the same on every retry, never a whole key.
//   - Relay-Message-Id: the row's id in decimal; ids of one key only grow.
//   - Relay-Message-Type, Relay-Message-Key: the type and the natural key.
//   - Relay-Attempt: 1 on the first attempt, 2 on the first retry, and so on.
//
// # Duplicates and order
//
// Delivery is at-least-once: the relay publishes a message again when it
// could not record that it was acknowledged (a crash, a database away, a lost
// acknowledgement). JetStream discards a message whose Nats-Msg-Id it stored
// within the stream's duplicate window (Duplicates, 2 minutes by default), so
// within the window the stream holds one copy. Give the stream a window longer
// than the longest time between a publish and its re-publish you want covered:
// a database outage, during which no outcome can be recorded, say.
//
// The relay publishes the messages of one key one at a time, in id order, and
// holds back a key's later messages while an earlier one fails, so a stream
// stores each key's messages in id order. A copy re-published after the window,
// or by a relay that lost its election mid-send, can still arrive late: a
// consumer ignores a message whose Relay-Message-Id is lower than the last one
// it applied for its key.
//
// # Errors
//
// An error that retrying cannot help is wrapped with [relay.Permanent], and
// the relay marks the row dead at once: a message larger than the server's
// max_payload or the stream's max_msg_size, a subject no stream is bound to
// (when JetStream answers so; a JetStream that does not answer is retried), a
// subject bound to another stream than [Config.Stream], a sealed stream, a
// publish the account has no permission for, a subject that cannot be
// published to. Everything else is retried: the server down or unreachable,
// the connection reconnecting or closed, a timeout, a stream over its limits.
//
// # Batches
//
// [Sender.SendBatch] publishes a batch without waiting and then collects every
// acknowledgement: a batch of a thousand messages costs about one round trip
// instead of a thousand. Each message keeps its own outcome.
//
// # Receiving
//
// A consumer whose state lives in PostgreSQL hands each message to [Receive],
// which records it in the receiver's inbox (github.com/xadm/relay/inbox) and
// applies it in the same transaction, once, whatever the re-deliveries.
// Acknowledge the message after Receive returned, never before:
//
//	cons.Consume(func(msg jetstream.Msg) {
//		_, err := natsjs.Receive(ctx, ib, msg, apply)
//		switch {
//		case err == nil:
//			msg.Ack() // applied, or a duplicate: a lost Ack only brings a duplicate
//		case relay.IsPermanent(err):
//			msg.TermWithReason(err.Error())
//		default:
//			msg.NakWithDelay(time.Second) // nothing applied
//		}
//	})
package natsjs
