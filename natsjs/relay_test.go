package natsjs_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/xadm/relay"
	"github.com/xadm/relay/natsjs"
)

// checkDelivered checks that the stream holds exactly one message per row of
// ids, with the subject, headers and data the row gives, and each key's
// messages in id order.
func checkDelivered(t *testing.T, b *bundle, got []received, typ string, ids []int64) {
	t.Helper()
	rows := b.rows(t)
	want := make(map[int64]bool, len(ids))
	for _, id := range ids {
		want[id] = true
	}
	seen := make(map[int64]bool, len(got))
	last := make(map[string]int64)
	for _, m := range got {
		id := m.id(t)
		require.True(t, want[id], "message %d (%s) is not one of the rows sent", id, m.Subject)
		require.False(t, seen[id], "message %d is in the stream twice", id)
		seen[id] = true
		r := rows[id]
		require.Equal(t, "SENT", r.Status, "row %d", id)

		require.Equal(t, "relay."+natsjs.Token(typ)+"."+natsjs.Token(r.Key), m.Subject)
		tokens := strings.Split(m.Subject, ".")
		key, err := natsjs.ParseToken(tokens[len(tokens)-1])
		require.NoError(t, err)
		require.Equal(t, r.Key, key, "the subject's last token gives the key back")

		// Message.IdempotencyKey: the table (schema-qualified or as configured) and the id.
		msgID := m.Header.Get(jetstream.MsgIDHeader)
		require.True(t, msgID == b.table+"/"+strconv.FormatInt(id, 10) || msgID == "public."+b.table+"/"+strconv.FormatInt(id, 10),
			"Nats-Msg-Id %q of message %d", msgID, id)
		require.Equal(t, typ, m.Header.Get(natsjs.HeaderMessageType))
		hk := m.Header.Get(natsjs.HeaderMessageKey)
		if m.Header.Get(natsjs.HeaderKeyEncoding) == "token" {
			hk, err = natsjs.ParseToken(hk)
			require.NoError(t, err)
		}
		require.Equal(t, r.Key, hk, "the key header of message %d", id)
		require.Equal(t, strconv.Itoa(r.Attempts+1), m.Header.Get(natsjs.HeaderAttempt), "attempt of message %d", id)
		require.JSONEq(t, r.Payload, string(m.Data))

		require.Greater(t, id, last[r.Key], "key %q: message %d after %d", r.Key, id, last[r.Key])
		last[r.Key] = id
	}
	require.Len(t, seen, len(ids), "every row is in the stream")
}

func TestRelayDeliversEveryRowToTheStream(t *testing.T) {
	t.Parallel()
	b := setup(t)
	n := startNATS(t)
	js := n.jetStream(t)
	createStream(t, js, jetstream.StreamConfig{Name: "RELAY", Subjects: []string{"relay.>"}})
	orders, err := natsjs.New(js, natsjs.Config{Type: "order.created"})
	require.NoError(t, err)

	keys := []string{"42", "a.b", "x y", "*", ">", "ü", "100%"}
	var ids []int64
	for range 3 {
		ids = append(ids, b.enqueue(t, "order.created", keys...)...)
	}
	// Keys only plain SQL writes: empty, blank-edged, with a line break.
	ids = append(ids,
		b.insert(t, "order.created", "", `{"k": "empty"}`),
		b.insert(t, "order.created", " padded ", `{"k": "padded"}`),
		b.insert(t, "order.created", "line\nbreak", `{"k": "newline"}`),
		b.insert(t, "order.created", "42", `{"k": "42 again"}`),
	)
	other := b.enqueue(t, "invoice", "42") // no sender for it: stays PENDING

	r, err := relay.New(b.pool, b.cfg, orders)
	require.NoError(t, err)
	ran, err := r.RunIfElected(context.Background())
	require.NoError(t, err)
	require.True(t, ran)
	drain(t, r)

	checkDelivered(t, b, consume(t, js, "RELAY"), "order.created", ids)
	require.Equal(t, "PENDING", b.rows(t)[other[0]].Status)
}

// crashAfterPublish publishes through the real sender and then, once, for
// message crashID, takes the relay's database away before the relay can
// record the outcome: it refuses the pool's new connections and terminates
// its sessions (pg_terminate_backend by application_name). That is a relay
// crash between the broker's acknowledgement and the commit, as the relay sees
// it: the row stays PENDING and a later pass delivers it again.
type crashAfterPublish struct {
	inner   *natsjs.Sender
	b       *bundle
	down    *atomic.Bool
	crashID int64

	mu        sync.Mutex
	published map[int64]int // acknowledged publishes per row
	crashed   bool
}

func (c *crashAfterPublish) Type() string { return c.inner.Type() }

func (c *crashAfterPublish) Send(ctx context.Context, m relay.Message) error {
	return c.after(ctx, []relay.Message{m}, []error{c.inner.Send(ctx, m)})[0]
}

func (c *crashAfterPublish) SendBatch(ctx context.Context, ms []relay.Message) []error {
	return c.after(ctx, ms, c.inner.SendBatch(ctx, ms))
}

func (c *crashAfterPublish) after(ctx context.Context, ms []relay.Message, errs []error) []error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, m := range ms {
		if errs[i] != nil {
			continue
		}
		c.published[m.ID]++
		if m.ID == c.crashID && !c.crashed {
			c.crashed = true
			c.down.Store(true)
			_, err := c.b.admin.Exec(context.WithoutCancel(ctx),
				"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1", c.b.app)
			if err != nil {
				panic(err)
			}
		}
	}
	return errs
}

func TestDuplicateWindowDiscardsARedelivery(t *testing.T) {
	t.Parallel()
	var down atomic.Bool
	b := setup(t, func(pc *pgxpool.Config) {
		pc.BeforeConnect = func(context.Context, *pgx.ConnConfig) error {
			if down.Load() {
				return errors.New("the database is away (test)")
			}
			return nil
		}
	})
	n := startNATS(t)
	js := n.jetStream(t)
	createStream(t, js, jetstream.StreamConfig{Name: "RELAY", Subjects: []string{"relay.>"}})
	inner, err := natsjs.New(js, natsjs.Config{Type: "order"})
	require.NoError(t, err)
	ids := b.enqueue(t, "order", "a", "b", "c", "a")
	sender := &crashAfterPublish{inner: inner, b: b, down: &down, crashID: ids[1], published: make(map[int64]int)}

	r, err := relay.New(b.pool, b.cfg, sender)
	require.NoError(t, err)
	_, err = r.Run(context.Background())
	require.Error(t, err, "the pass could not record the outcome of the crashed message")
	require.Contains(t, b.logs.String(), "outcome not recorded; the message is not sent again before its backoff step")
	require.Equal(t, "PENDING", b.rows(t)[ids[1]].Status, "the outcome of the published message was lost")

	// The relay comes back, as a restarted process would: new sessions, and
	// none of the old process's memory of the lost outcome.
	down.Store(false)
	b.pool.Reset()
	r, err = relay.New(b.pool, b.cfg, sender)
	require.NoError(t, err)
	drain(t, r)

	sender.mu.Lock()
	require.Equal(t, 2, sender.published[ids[1]], "the relay published the crashed message again, and JetStream acknowledged it")
	sender.mu.Unlock()
	got := consume(t, js, "RELAY")
	require.Len(t, got, len(ids), "the stream holds one copy of each message")
	checkDelivered(t, b, got, "order", ids)
}

func TestServerDownGivesErrorRowsAndDeliveryResumes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	n := startNATS(t)
	admin := n.jetStream(t, nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond))
	createStream(t, admin, jetstream.StreamConfig{Name: "RELAY", Subjects: []string{"relay.>"}})
	orders, err := natsjs.Connect(n.URL(), natsjs.Config{Type: "order", Logger: testLogger(b.logs)},
		nats.ReconnectWait(20*time.Millisecond))
	require.NoError(t, err)
	t.Cleanup(orders.Close)

	keys := []string{"a", "b", "c"}
	var ids []int64
	for range 3 {
		ids = append(ids, b.enqueue(t, "order", keys...)...)
	}
	cfg := b.cfg
	cfg.SendTimeout = 2 * time.Second
	r, err := relay.New(b.pool, cfg, orders)
	require.NoError(t, err)

	n.stop()
	_, err = r.Run(context.Background())
	require.NoError(t, err)
	rows := b.rows(t)
	for i, id := range ids {
		if i < len(keys) {
			require.Equal(t, "ERROR", rows[id].Status, "the first message of key %s", rows[id].Key)
			require.Equal(t, 1, rows[id].Attempts)
			require.NotEmpty(t, rows[id].LastError)
		} else {
			require.Equal(t, "PENDING", rows[id].Status, "a later message of key %s waits behind the failed one", rows[id].Key)
		}
	}
	require.Contains(t, b.logs.String(), "relay: send failed; will retry")
	eventually(t, "the disconnection to be logged", func() bool {
		return strings.Contains(b.logs.String(), "natsjs: disconnected from NATS")
	})

	n.start()
	require.NoError(t, r.Start(context.Background()))
	eventually(t, "every row to be SENT after the server came back", func() bool {
		return b.count(t, "SENT") == len(ids)
	})
	require.NoError(t, r.Stop(context.Background()))
	require.Contains(t, b.logs.String(), "natsjs: reconnected to NATS")
	checkDelivered(t, b, consume(t, admin, "RELAY"), "order", ids)
}

func TestRelayMarksARowThatCannotBePublishedDead(t *testing.T) {
	t.Parallel()
	b := setup(t)
	n := startNATS(t)
	js := n.jetStream(t)
	createStream(t, js, jetstream.StreamConfig{Name: "RELAY", Subjects: []string{"relay.order.>"}, MaxMsgSize: 4096})
	orders, err := natsjs.New(js, natsjs.Config{Type: "order"})
	require.NoError(t, err)
	refunds, err := natsjs.New(js, natsjs.Config{Type: "refund"}) // no stream listens on relay.refund.>
	require.NoError(t, err)

	ok := b.enqueue(t, "order", "a", "b")
	big := b.insert(t, "order", "c", `{"blob": "`+strings.Repeat("x", 8000)+`"}`)
	refund := b.insert(t, "refund", "a", `{}`)
	after := b.enqueue(t, "order", "d")

	r, err := relay.New(b.pool, b.cfg, orders, refunds)
	require.NoError(t, err)
	drain(t, r)

	rows := b.rows(t)
	for _, id := range []int64{big, refund} {
		require.Equal(t, "ERROR", rows[id].Status)
		require.Equal(t, b.cfg.MaxAttempts, rows[id].Attempts, "row %d is dead at once: %s", id, rows[id].LastError)
	}
	require.Contains(t, rows[big].LastError, "the stream refuses the size")
	require.Contains(t, rows[refund].LastError, "no JetStream stream is bound to the subject")
	checkDelivered(t, b, consume(t, js, "RELAY"), "order", append(ok, after...))
}
