package kafka

import (
	"strings"
	"testing"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/xadm/relay"
	"github.com/xadm/relay/inbox"
)

// TestInboxMessage checks the message a record becomes for the inbox, and
// that a record without the relay's headers, or with one malformed, is
// refused with the header named.
func TestInboxMessage(t *testing.T) {
	s := &Sender{topic: "orders"}
	rec := s.record(&relay.Message{ID: 42, Type: "order", Key: "order-7", Payload: []byte(`{"total":10}`), Attempts: 1})
	rec.Partition, rec.Offset = 3, 99
	m, err := inboxMessage(rec)
	if err != nil {
		t.Fatal(err)
	}
	want := inbox.Message{IdempotencyKey: "42", ID: 42, Key: "order-7", Type: "order", Attempt: 2, Body: []byte(`{"total":10}`)}
	if m.IdempotencyKey != want.IdempotencyKey || m.ID != want.ID || m.Key != want.Key || m.Type != want.Type ||
		m.Attempt != want.Attempt || string(m.Body) != string(want.Body) {
		t.Errorf("message %+v, want %+v", m, want)
	}

	with := func(headers ...kgo.RecordHeader) *kgo.Record {
		return &kgo.Record{Topic: "orders", Partition: 3, Offset: 99, Headers: headers}
	}
	key := kgo.RecordHeader{Key: HeaderIdempotencyKey, Value: []byte("public.outbox/42")}
	id := kgo.RecordHeader{Key: HeaderMessageID, Value: []byte("42")}
	for _, tc := range []struct {
		rec  *kgo.Record
		want string
	}{
		{with(id), "kafka: record orders/3@99: header Idempotency-Key is missing or empty"},
		{with(key), "kafka: record orders/3@99: header Relay-Message-Id is missing or empty"},
		{with(key, key, id), "kafka: record orders/3@99: header Idempotency-Key appears 2 times, want it once"},
		{with(key, kgo.RecordHeader{Key: HeaderMessageID, Value: []byte("4x")}), `kafka: record orders/3@99: header Relay-Message-Id: "4x" is not a positive decimal integer`},
		{with(key, kgo.RecordHeader{Key: HeaderMessageID}), "header Relay-Message-Id is missing or empty"},
	} {
		if _, err := inboxMessage(tc.rec); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("error %v, want %q", err, tc.want)
		}
	}
}
