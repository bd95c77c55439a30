package e2e_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/xadm/relay/kafka"
)

// TestDeliveryThroughTheRelay drains an outbox written by relay.Enqueue and by
// plain SQL through the relay into Kafka: two types sharing one topic, a third
// on the topic named after it (the default), and a consumer reading the
// topics back finds one record per row, with the row's key, payload and
// headers, each key's records on one partition in id order.
func TestDeliveryThroughTheRelay(t *testing.T) {
	t.Parallel()
	c := newCluster(t, kfake.SeedTopics(4, "orders", "invoice.issued"))
	b := setup(t)
	b.cfg.BatchSize = 25
	b.cfg.Concurrency = 4

	// A Timeout longer than any wait of a busy machine: a record given up on
	// and produced again would be a duplicate, which this test counts.
	brokers := c.ListenAddrs()
	created := newSender(t, kafka.Config{Type: "order.created", Topic: "orders", Brokers: brokers, Timeout: waitLimit})
	cancelled := newSender(t, kafka.Config{Type: "order.cancelled", Topic: "orders", Brokers: brokers, Timeout: waitLimit})
	invoices := newSender(t, kafka.Config{Type: "invoice.issued", Brokers: brokers, Timeout: waitLimit})
	b.cfg.SendTimeout = waitLimit

	for round := range 4 {
		for k := range 20 {
			typ := "order.created"
			if round%2 == 1 {
				typ = "order.cancelled"
			}
			b.enqueue(t, typ, fmt.Sprintf("order-%d", k), map[string]any{"order": k, "round": round})
		}
	}
	for round := range 2 {
		for k := range 10 {
			b.enqueue(t, "invoice.issued", fmt.Sprintf("invoice-%d", k), map[string]any{"invoice": k, "round": round})
		}
	}
	// A producer that is not this library: plain SQL, as a JVM service writes.
	_, err := b.pool.Exec(context.Background(), "INSERT INTO "+pgx.Identifier{b.table}.Sanitize()+
		` (type, natural_key, payload) VALUES ('order.created', 'order-0', '{"order": 0, "round": 4, "by": "sql"}'),
		('invoice.issued', 'invoice-3', '{"invoice": 3, "round": 2, "by": "sql"}')`)
	require.NoError(t, err)

	drain(t, b.relay(t, created, cancelled, invoices))

	rs := b.rows(t)
	require.True(t, allSent(rs), "every row SENT: %+v", rs)
	byID := map[int64]row{}
	for _, r := range rs {
		byID[r.ID] = r
	}
	for topic, types := range map[string][]string{
		"orders":         {"order.created", "order.cancelled"},
		"invoice.issued": {"invoice.issued"},
	} {
		var want []row
		for _, r := range rs {
			for _, typ := range types {
				if r.Type == typ {
					want = append(want, r)
				}
			}
		}
		recs := consume(t, c, topic)
		require.Len(t, recs, len(want), "one record per row on %s", topic)
		requireKeyOrder(t, recs, want)
		for _, rec := range recs {
			requireRecordOf(t, rec, byID[recordID(t, rec)], b.table)
		}
	}
}

// requireRecordOf checks that rec carries r as the sender produces it.
func requireRecordOf(t *testing.T, rec *kgo.Record, r row, table string) {
	t.Helper()
	require.Equal(t, r.Key, string(rec.Key), "record key of row %d", r.ID)
	require.JSONEq(t, r.Payload, string(rec.Value), "record value of row %d", r.ID)
	require.Equal(t, strconv.FormatInt(r.ID, 10), header(t, rec, kafka.HeaderMessageID))
	require.Equal(t, r.Type, header(t, rec, kafka.HeaderMessageType))
	require.Equal(t, strconv.Itoa(r.Attempts+1), header(t, rec, kafka.HeaderAttempt),
		"the attempt that succeeded comes after the row's failed attempts")
	// relay.Message.IdempotencyKey: the table (schema-qualified or as
	// configured, the core decides) and the id, naming this one message.
	require.Regexp(t, fmt.Sprintf(`^(public\.)?%s/%d$`, table, r.ID), header(t, rec, kafka.HeaderIdempotencyKey))
	require.Len(t, rec.Headers, 4, "record headers of row %d", r.ID)
}
