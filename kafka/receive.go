package kafka

import (
	"context"
	"fmt"
	"strconv"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/xadm/relay"
	"github.com/xadm/relay/inbox"
)

// Receive receives rec, a record a [Sender] produced and the receiver's own
// consumer read, into ib: in one transaction of the receiver's database it
// records the message, drops a duplicate or a stale one, and runs apply
// ([inbox.Inbox.Receive]). The message is read from the record: its
// [HeaderIdempotencyKey] and [HeaderMessageID] headers (each required, once),
// [HeaderMessageType] and [HeaderAttempt], its key (the natural key) and its
// value (the body).
//
// Commit the record's offset only after Receive returned, never before:
//
//   - nil: the message is applied, or was (a duplicate, a stale one); commit
//     the offset (kgo's CommitRecords, or MarkCommitRecords with
//     kgo.AutoCommitMarks). A crash before that commit delivers the record
//     again, and the inbox drops it as a duplicate.
//   - an error for which [relay.IsPermanent] is true: the record can never be
//     applied (a header missing or malformed, a body that does not match the
//     one recorded, apply's permanent error). Set it aside (a dead-letter
//     topic, a log) and commit its offset, or the partition stops there.
//   - any other error: nothing was applied; do not commit, and consume the
//     record again after a pause (seek back to it, or restart the consumer).
//
// kgo commits the offsets it polled by default, every 5 seconds, whatever the
// receiver did with the records: a crash then loses the records polled but
// not yet received. Use kgo.DisableAutoCommit or kgo.AutoCommitMarks.
func Receive(ctx context.Context, ib *inbox.Inbox, rec *kgo.Record, apply inbox.ApplyFunc) (inbox.Outcome, error) {
	m, err := inboxMessage(rec)
	if err != nil {
		return 0, relay.Permanent(err)
	}
	return ib.Receive(ctx, m, apply)
}

// inboxMessage reads the message of rec, or says which header it lacks.
func inboxMessage(rec *kgo.Record) (inbox.Message, error) {
	where := func(format string, args ...any) error {
		return fmt.Errorf("kafka: record %s/%d@%d: %s", rec.Topic, rec.Partition, rec.Offset, fmt.Sprintf(format, args...))
	}
	values := map[string][]string{}
	for _, h := range rec.Headers {
		switch h.Key {
		case HeaderIdempotencyKey, HeaderMessageID, HeaderMessageType, HeaderAttempt:
			values[h.Key] = append(values[h.Key], string(h.Value))
		}
	}
	one := func(name string) (string, error) {
		switch vs := values[name]; {
		case len(vs) == 0 || vs[0] == "" && len(vs) == 1:
			return "", where("header %s is missing or empty", name)
		case len(vs) > 1:
			return "", where("header %s appears %d times, want it once", name, len(vs))
		default:
			return vs[0], nil
		}
	}
	key, err := one(HeaderIdempotencyKey)
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
	m := inbox.Message{IdempotencyKey: key, ID: id, Key: string(rec.Key), Body: rec.Value}
	if vs := values[HeaderMessageType]; len(vs) > 0 {
		m.Type = vs[0]
	}
	if vs := values[HeaderAttempt]; len(vs) > 0 {
		m.Attempt, _ = strconv.Atoi(vs[0]) // for logs only
	}
	return m, nil
}
