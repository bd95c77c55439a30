package e2e_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/xadm/relay"
	"github.com/xadm/relay/inbox"
	"github.com/xadm/relay/kafka"
)

// TestInboxReceive: the relay produces an outbox's messages to Kafka, each
// twice and each key's previous message again after the next (the
// re-deliveries of a crash and of a failover), and a consumer group receives
// them into an inbox. The first member commits the offsets of half the
// records it received and dies; the second resumes from there and receives
// the rest again. Every message's effect is applied once, every key ends on
// its newest message, and a record without the relay's headers is refused
// permanently, naming the header.
func TestInboxReceive(t *testing.T) {
	t.Parallel()
	c := newCluster(t, kfake.SeedTopics(2, "orders"))
	b := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()

	// The relay's side: each message produced twice, and each key's previous
	// message once more after it.
	sender := newSender(t, kafka.Config{Type: "order", Topic: "orders", Brokers: c.ListenAddrs(), Timeout: waitLimit})
	var (
		mu   sync.Mutex
		prev = map[string]relay.Message{}
	)
	twice := relay.SenderFunc("order", func(ctx context.Context, m relay.Message) error {
		if err := sender.Send(ctx, m); err != nil {
			return err
		}
		if err := sender.Send(ctx, m); err != nil {
			return err
		}
		mu.Lock()
		p, ok := prev[m.Key]
		prev[m.Key] = m
		mu.Unlock()
		if ok {
			return sender.Send(ctx, p)
		}
		return nil
	})
	const keys, perKey = 5, 4
	want := map[string]int64{} // each key's newest id
	var ids []int64
	for i := range perKey {
		for k := range keys {
			key := fmt.Sprintf("order-%d", k)
			want[key] = b.enqueue(t, "order", key, map[string]int{"n": i})
			ids = append(ids, want[key])
		}
	}
	drain(t, b.relay(t, twice))
	// A record that no Sender made.
	producer, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	require.NoError(t, err)
	defer producer.Close()
	require.NoError(t, producer.ProduceSync(ctx, &kgo.Record{Topic: "orders", Key: []byte("order-0"), Value: []byte(`{}`)}).FirstErr())

	// The receiver's side: a member of a consumer group receives every
	// record, commits the offsets of the first half only and dies; a second
	// member resumes from those offsets and receives the rest again.
	rc := newReceiver(t, b)
	total := keys*perKey*2 + keys*(perKey-1) + 1
	outcomes := map[string]int{}
	receive := func(rec *kgo.Record) {
		got, err := kafka.Receive(ctx, rc.ib, rec, rc.apply)
		switch {
		case err == nil:
			outcomes[got.String()]++
		case relay.IsPermanent(err):
			require.ErrorContains(t, err, fmt.Sprintf("kafka: record orders/%d@%d: header Idempotency-Key is missing or empty", rec.Partition, rec.Offset))
			outcomes["refused"]++
		default:
			t.Fatalf("record %d: %v", rec.Offset, err)
		}
	}
	member := func() *kgo.Client {
		cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics("orders"),
			kgo.ConsumerGroup(b.table), kgo.DisableAutoCommit(), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
		require.NoError(t, err)
		return cl
	}
	cl := member()
	for received := 0; received < total; {
		fs := cl.PollFetches(ctx)
		require.NoError(t, fs.Err())
		for _, rec := range fs.Records() {
			receive(rec) // the database transaction first,
			received++
			if received <= total/2 {
				require.NoError(t, cl.CommitRecords(ctx, rec)) // then the offset
			}
		}
	}
	cl.Close()
	first := sum(outcomes)
	require.Equal(t, total, first)

	cl = member()
	defer cl.Close()
	produced := 0
	for _, p := range c.PartitionInfos("orders") {
		produced += int(p.HighWatermark)
	}
	require.Equal(t, total, produced, "the records on the topic")
	for sum(outcomes)-first < total-total/2 {
		fs := cl.PollFetches(ctx)
		require.NoError(t, fs.Err())
		for _, rec := range fs.Records() {
			receive(rec)
			require.NoError(t, cl.CommitRecords(ctx, rec))
		}
	}

	rc.requireOnce(t, ids, want)
	require.Equal(t, keys*perKey, outcomes["applied"], "outcomes: %v", outcomes)
	require.GreaterOrEqual(t, outcomes["refused"], 1, "outcomes: %v", outcomes)
	t.Logf("outcomes of %d records received, %d of them again after the crash: %v", sum(outcomes), sum(outcomes)-first, outcomes)
}

// sum adds the outcomes' counts.
func sum(outcomes map[string]int) (n int) {
	for _, v := range outcomes {
		n += v
	}
	return n
}

// receiver is the receiving service: an inbox on the test's database and a
// table of each key's state and of every effect.
type receiver struct {
	ib      *inbox.Inbox
	pool    *pgxpool.Pool
	effects string
	state   string
}

func newReceiver(t *testing.T, b *bundle) *receiver {
	t.Helper()
	ctx := context.Background()
	table := b.table + "_inbox"
	require.NoError(t, inbox.CreateTable(ctx, b.pool, table))
	ib, err := inbox.New(b.pool, inbox.Config{Table: table})
	require.NoError(t, err)
	rc := &receiver{ib: ib, pool: b.pool,
		effects: pgx.Identifier{b.table + "_fx"}.Sanitize(), state: pgx.Identifier{b.table + "_st"}.Sanitize()}
	_, err = b.pool.Exec(ctx, "CREATE TABLE "+rc.effects+" (message_id bigint NOT NULL); CREATE TABLE "+rc.state+" (key text PRIMARY KEY, message_id bigint NOT NULL)")
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = b.pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+rc.effects+", "+rc.state+", "+
			pgx.Identifier{table}.Sanitize()+", "+pgx.Identifier{table + "_keys"}.Sanitize())
	})
	return rc
}

// apply records the message's effect and makes it its key's state.
func (rc *receiver) apply(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
	_, err := tx.Exec(ctx, "INSERT INTO "+rc.effects+" VALUES ($1)", m.ID)
	if err == nil {
		_, err = tx.Exec(ctx, "INSERT INTO "+rc.state+" VALUES ($1, $2) ON CONFLICT (key) DO UPDATE SET message_id = excluded.message_id", m.Key, m.ID)
	}
	return err
}

// requireOnce checks that each of ids has exactly one effect, there is no
// other, and each key's state is its newest message.
func (rc *receiver) requireOnce(t *testing.T, ids []int64, newest map[string]int64) {
	t.Helper()
	ctx := context.Background()
	rows, err := rc.pool.Query(ctx, "SELECT message_id, count(*) FROM "+rc.effects+" GROUP BY message_id")
	require.NoError(t, err)
	got := map[int64]int64{}
	for rows.Next() {
		var id, n int64
		require.NoError(t, rows.Scan(&id, &n))
		got[id] = n
	}
	require.NoError(t, rows.Err())
	want := map[int64]int64{}
	for _, id := range ids {
		want[id] = 1
	}
	require.Equal(t, want, got, "effects per message")
	rows, err = rc.pool.Query(ctx, "SELECT key, message_id FROM "+rc.state)
	require.NoError(t, err)
	state, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (kv, error) {
		var x kv
		return x, r.Scan(&x.key, &x.id)
	})
	require.NoError(t, err)
	final := map[string]int64{}
	for _, s := range state {
		final[s.key] = s.id
	}
	require.Equal(t, newest, final, "each key's final state")
}

type kv struct {
	key string
	id  int64
}
