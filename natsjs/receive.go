package natsjs

import (
	"context"
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/xadm/relay"
	"github.com/xadm/relay/inbox"
)

// Receive receives msg, a message a [Sender] published and the receiver's
// own JetStream consumer read, into ib: in one transaction of the receiver's
// database it records the message, drops a duplicate or a stale one, and
// runs apply ([inbox.Inbox.Receive]). The message is read from msg's headers
// Nats-Msg-Id (the idempotency key) and [HeaderMessageID] (each required,
// once), [HeaderMessageKey] (decoded when [HeaderKeyEncoding] says "token"),
// [HeaderMessageType] and [HeaderAttempt], and its data (the body).
//
// Receive does not acknowledge msg. Acknowledge it only after Receive
// returned, never before:
//
//   - nil: the message is applied, or was (a duplicate, a stale one): Ack.
//     A crash, or an Ack lost, before the server has it delivers the message
//     again after the consumer's AckWait, and the inbox drops it as a
//     duplicate.
//   - an error for which [relay.IsPermanent] is true: the message can never
//     be applied (a header missing or malformed, a body that does not match
//     the one recorded, apply's permanent error): TermWithReason, after
//     setting it aside if it must not be lost.
//   - any other error: nothing was applied: NakWithDelay, and it comes back.
//
// An Ack before the transaction loses the message when the process dies in
// between; the server does not deliver an acknowledged message again.
func Receive(ctx context.Context, ib *inbox.Inbox, msg jetstream.Msg, apply inbox.ApplyFunc) (inbox.Outcome, error) {
	m, err := inboxMessage(msg)
	if err != nil {
		return 0, relay.Permanent(err)
	}
	return ib.Receive(ctx, m, apply)
}

// inboxMessage reads the message of msg, or says which header it lacks.
func inboxMessage(msg jetstream.Msg) (inbox.Message, error) {
	h := msg.Headers()
	where := func(format string, args ...any) error {
		return fmt.Errorf("natsjs: message on %s: %s", msg.Subject(), fmt.Sprintf(format, args...))
	}
	one := func(name string) (string, error) {
		switch vs := h[name]; {
		case len(vs) == 0 || len(vs) == 1 && vs[0] == "":
			return "", where("header %s is missing or empty", name)
		case len(vs) > 1:
			return "", where("header %s appears %d times, want it once", name, len(vs))
		default:
			return vs[0], nil
		}
	}
	key, err := one(jetstream.MsgIDHeader)
	if err != nil {
		return inbox.Message{}, err
	}
	idText, err := one(HeaderMessageID)
	if err != nil {
		return inbox.Message{}, err
	}
	id, err := inbox.ParseMessageID(idText)
	if err != nil {
		return inbox.Message{}, where("header %s: %v", HeaderMessageID, err)
	}
	m := inbox.Message{IdempotencyKey: key, ID: id, Body: msg.Data()}
	if vs := h[HeaderMessageKey]; len(vs) > 0 {
		m.Key = vs[0]
		if enc := h[HeaderKeyEncoding]; len(enc) > 0 && enc[0] == "token" {
			if m.Key, err = ParseToken(vs[0]); err != nil {
				return inbox.Message{}, where("header %s: %v", HeaderMessageKey, err)
			}
		}
	}
	if vs := h[HeaderMessageType]; len(vs) > 0 {
		m.Type = vs[0]
	}
	if vs := h[HeaderAttempt]; len(vs) > 0 {
		m.Attempt, _ = strconv.Atoi(vs[0]) // for logs only
	}
	return m, nil
}
