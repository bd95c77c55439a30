package natsjs_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/xadm/relay"
	"github.com/xadm/relay/inbox"
	"github.com/xadm/relay/natsjs"
)

// TestReceive: the relay publishes an outbox's messages to JetStream and a
// durable consumer receives them into an inbox, acknowledging only after the
// transaction. Every first delivery is received and then not acknowledged
// (Nak, as if the process died or its Ack was lost before the server had it):
// the server delivers it again, and the inbox drops it as a duplicate. Every
// message's effect is applied once, every key ends on its newest message
// (keys with bytes a header cannot carry included), and a message without the
// relay's headers is refused permanently and terminated.
func TestReceive(t *testing.T) {
	t.Parallel()
	srv := startNATS(t)
	js := srv.jetStream(t)
	stream := createStream(t, js, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"relay.>"}})
	b := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	sender, err := natsjs.New(js, natsjs.Config{Type: "order"})
	require.NoError(t, err)
	keys := []string{"order-1", "order-2", " padded ", "line\nbreak"}
	var ids []int64
	newest := map[string]int64{}
	for range 3 {
		for _, k := range keys {
			id := b.insert(t, "order", k, fmt.Sprintf(`{"key": %q}`, k))
			ids = append(ids, id)
			newest[k] = id
		}
	}
	r, err := relay.New(b.pool, b.cfg, sender)
	require.NoError(t, err)
	drain(t, r)
	_, err = js.Publish(ctx, "relay.order.stray", []byte(`{}`)) // no relay headers
	require.NoError(t, err)

	// The receiver: an inbox and its own tables in the test's database.
	table := b.table + "_inbox"
	require.NoError(t, inbox.CreateTable(ctx, b.admin, table))
	ib, err := inbox.New(b.admin, inbox.Config{Table: table})
	require.NoError(t, err)
	effects, state := pgx.Identifier{b.table + "_fx"}.Sanitize(), pgx.Identifier{b.table + "_st"}.Sanitize()
	_, err = b.admin.Exec(ctx, "CREATE TABLE "+effects+" (message_id bigint NOT NULL); CREATE TABLE "+state+" (key text PRIMARY KEY, message_id bigint NOT NULL)")
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = b.admin.Exec(context.Background(), "DROP TABLE IF EXISTS "+effects+", "+state+", "+
			pgx.Identifier{table}.Sanitize()+", "+pgx.Identifier{table + "_keys"}.Sanitize())
	})
	apply := func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		if _, err := tx.Exec(ctx, "INSERT INTO "+effects+" VALUES ($1)", m.ID); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, "INSERT INTO "+state+" VALUES ($1, $2) ON CONFLICT (key) DO UPDATE SET message_id = excluded.message_id", m.Key, m.ID)
		return err
	}

	cons, err := stream.CreateConsumer(ctx, jetstream.ConsumerConfig{Durable: "inbox", AckPolicy: jetstream.AckExplicitPolicy})
	require.NoError(t, err)
	outcomes := map[string]int{}
	for outcomes["applied"]+outcomes["duplicate"]+outcomes["refused"] < 2*len(ids)+1 {
		require.NoError(t, ctx.Err(), "outcomes so far: %v", outcomes)
		batch, err := cons.Fetch(10, jetstream.FetchMaxWait(time.Second))
		require.NoError(t, err)
		for msg := range batch.Messages() {
			meta, err := msg.Metadata()
			require.NoError(t, err)
			got, err := natsjs.Receive(ctx, ib, msg, apply)
			switch {
			case relay.IsPermanent(err):
				require.ErrorContains(t, err, "natsjs: message on relay.order.stray: header Nats-Msg-Id is missing or empty")
				outcomes["refused"]++
				require.NoError(t, msg.TermWithReason(err.Error()))
			case err != nil:
				t.Fatalf("message %s: %v", msg.Subject(), err)
			case meta.NumDelivered == 1:
				require.Equal(t, inbox.Applied, got, "first delivery of %s", msg.Subject())
				outcomes[got.String()]++
				require.NoError(t, msg.Nak()) // the Ack that never reached the server
			default:
				outcomes[got.String()]++
				require.NoError(t, msg.Ack())
			}
		}
		require.NoError(t, batch.Error())
	}
	require.Equal(t, map[string]int{"applied": len(ids), "duplicate": len(ids), "refused": 1}, outcomes)

	var n int
	require.NoError(t, b.admin.QueryRow(ctx, "SELECT count(DISTINCT message_id) FROM "+effects+" WHERE message_id = ANY($1) HAVING count(*) = count(DISTINCT message_id)", ids).Scan(&n))
	require.Equal(t, len(ids), n, "one effect per message, and none twice")
	rows, err := b.admin.Query(ctx, "SELECT key, message_id FROM "+state)
	require.NoError(t, err)
	final := map[string]int64{}
	for rows.Next() {
		var k string
		var id int64
		require.NoError(t, rows.Scan(&k, &id))
		final[k] = id
	}
	require.NoError(t, rows.Err())
	require.Equal(t, newest, final, "each key's final state")
}
