package relay_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/xadm/relay"
	"github.com/xadm/relay/internal/testkit/pgserver"
)

func TestEnqueueMany(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// batch mixes two types, repeats key k1 (its messages must keep their
	// order) and gives one message headers.
	batch := func() []relay.Outgoing {
		return []relay.Outgoing{
			{Type: "order", Key: "k1", Payload: []byte(`{"n": 0}`)},
			{Type: "invoice", Key: "k2", Payload: []byte(`{"n": 1}`), Headers: map[string]string{"traceparent": "00-1-2-01"}},
			{Type: "order", Key: "k1", Payload: []byte(`{"n": 2}`)},
			{Type: "order", Key: "k3", Payload: []byte(`{"n": 3}`)},
			{Type: "order", Key: "k1", Payload: []byte(`{"n": 4}`)},
		}
	}
	// row is what the table holds of a message.
	type row struct {
		Type, Key, Payload string
		Headers            map[string]string
	}
	rows := func(t *testing.T, b *bundle, ids []int64) []row {
		t.Helper()
		got := make([]row, len(ids))
		for i, id := range ids {
			require.NoError(t, b.pool.QueryRow(ctx, "SELECT type, natural_key, payload::text, headers FROM "+
				pgx.Identifier{b.table}.Sanitize()+" WHERE id = $1 AND status = 'PENDING' AND direction = 'OUT'", id).
				Scan(&got[i].Type, &got[i].Key, &got[i].Payload, &got[i].Headers))
		}
		return got
	}
	count := func(t *testing.T, b *bundle) int {
		t.Helper()
		var n int
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{b.table}.Sanitize()).Scan(&n))
		return n
	}

	t.Run("CommitsInOrderWithTheBusinessWriteAndIsDelivered", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ms := batch()
		tx, err := b.pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		ids, err := relay.EnqueueMany(ctx, tx, b.table, ms)
		require.NoError(t, err)
		require.Len(t, ids, len(ms))
		require.True(t, slices.IsSorted(ids) && len(slices.Compact(slices.Clone(ids))) == len(ids), "ids in the batch's order: %v", ids)
		require.Zero(t, count(t, b), "not visible before the commit")
		require.NoError(t, tx.Commit(ctx))

		got := rows(t, b, ids)
		for i, m := range ms {
			require.Equal(t, m.Type, got[i].Type, "messages[%d]", i)
			require.Equal(t, m.Key, got[i].Key, "messages[%d]", i)
			require.JSONEq(t, string(m.Payload), got[i].Payload, "messages[%d]", i)
			require.Equal(t, m.Headers, got[i].Headers, "messages[%d]", i)
		}

		orders, invoices := newRecorder("order", nil), newRecorder("invoice", nil)
		n, err := b.newRelay(t, b.cfg, orders, invoices).Run(ctx)
		require.NoError(t, err)
		require.Equal(t, len(ms), n)
		var k1 []string
		for _, m := range orders.Sent {
			if m.Key == "k1" {
				k1 = append(k1, string(m.Payload))
			}
		}
		require.Equal(t, []string{`{"n": 0}`, `{"n": 2}`, `{"n": 4}`}, k1, "a key's messages in the batch's order")
		require.Len(t, invoices.Sent, 1)
		require.Equal(t, ms[1].Headers, invoices.Sent[0].Headers)
		require.Equal(t, ids[1], invoices.Sent[0].ID)
	})

	t.Run("RollsBackWithTheBusinessWrite", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		tx, err := b.pool.Begin(ctx)
		require.NoError(t, err)
		_, err = relay.EnqueueMany(ctx, tx, b.table, batch())
		require.NoError(t, err)
		require.NoError(t, tx.Rollback(ctx))
		require.Zero(t, count(t, b), "a rolled-back batch leaves no row")
	})

	t.Run("ThroughAPoolAllOrNothing", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ids, err := relay.EnqueueMany(ctx, b.pool, b.table, batch())
		require.NoError(t, err)
		require.Equal(t, len(ids), count(t, b), "committed at once")

		// Valid JSON to Go, refused by jsonb: the server refuses the
		// statement, and nothing of the batch is written.
		bad := append(batch(), relay.Outgoing{Type: "order", Key: "k9", Payload: []byte(`"\u0000"`)})
		_, err = relay.EnqueueMany(ctx, b.pool, b.table, bad)
		require.ErrorContains(t, err, "relay: enqueue: insert 6 messages into "+b.table)
		require.ErrorContains(t, err, "unsupported Unicode escape sequence")
		require.Equal(t, len(ids), count(t, b), "no row of the refused batch")
	})

	t.Run("InEveryQueryExecMode", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		// Behind a transaction-pooling proxy pools run in Exec or simple
		// protocol mode, where pgx sends the arrays as text.
		for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol} {
			pool := pgserver.Pool(t, server().URL, "", 1, func(c *pgxpool.Config) { c.ConnConfig.DefaultQueryExecMode = mode })
			ms := batch()
			ids, err := relay.EnqueueMany(ctx, pool, b.table, ms)
			require.NoError(t, err, "%v", mode)
			got := rows(t, b, ids)
			for i, m := range ms {
				require.Equal(t, m.Key, got[i].Key, "%v: messages[%d]", mode, i)
				require.Equal(t, m.Headers, got[i].Headers, "%v: messages[%d]", mode, i)
			}
		}
	})

	t.Run("SchemaQualifiedTable", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ids, err := relay.EnqueueMany(ctx, b.pool, "public."+b.table, batch())
		require.NoError(t, err)
		require.Len(t, rows(t, b, ids), len(batch()))
	})

	t.Run("HeadersNeedTheColumn", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.exec(t, "ALTER TABLE %s DROP COLUMN headers")
		_, err := relay.EnqueueMany(ctx, b.pool, b.table, batch())
		require.ErrorContains(t, err, "the table has no headers column")
		require.ErrorContains(t, err, "ADD COLUMN IF NOT EXISTS headers jsonb")
		ms := batch()
		ms[1].Headers = nil
		_, err = relay.EnqueueMany(ctx, b.pool, b.table, ms)
		require.NoError(t, err, "messages without headers need no column")
	})

	t.Run("EmptyWritesNothing", func(t *testing.T) {
		t.Parallel()
		ids, err := relay.EnqueueMany(ctx, neverQuerier{t}, "t", nil)
		require.NoError(t, err)
		require.Empty(t, ids)
	})

	t.Run("RefusesBeforeAnySQL", func(t *testing.T) {
		t.Parallel()
		good := relay.Outgoing{Type: "order", Key: "k", Payload: []byte(`{}`)}
		with := func(i int, m relay.Outgoing) []relay.Outgoing {
			ms := []relay.Outgoing{good, good, good, good}
			ms[i] = m
			return ms
		}
		big := relay.Outgoing{Type: "order", Key: "k", Payload: []byte(`"` + strings.Repeat("x", relay.EnqueueManyBytesMax/2) + `"`)}
		for _, tc := range []struct {
			name  string
			table string
			ms    []relay.Outgoing
			want  string
		}{
			{"BadTable", "orders; DROP TABLE x", with(0, good), `table "orders; DROP TABLE x"`},
			{"EmptyType", "t", with(2, relay.Outgoing{Key: "k", Payload: []byte(`{}`)}), "messages[2]: Outgoing.Type must not be empty"},
			{"BlankKey", "t", with(3, relay.Outgoing{Type: "order", Key: " ", Payload: []byte(`{}`)}), "messages[3]: Outgoing.Key must not be empty"},
			{"NoPayload", "t", with(0, relay.Outgoing{Type: "order", Key: "k"}), "messages[0]: Outgoing.Payload must not be empty"},
			{"PayloadNotJSON", "t", with(1, relay.Outgoing{Type: "order", Key: "k", Payload: []byte(`{"id":`)}), "messages[1]: Outgoing.Payload is not valid JSON"},
			{"ReservedHeader", "t", with(1, relay.Outgoing{Type: "order", Key: "k", Payload: []byte(`{}`), Headers: map[string]string{"Relay-Id": "1"}}),
				"messages[1]: Outgoing.Headers must not set header Relay-Id"},
			{"TooMany", "t", make([]relay.Outgoing, relay.EnqueueManyMax+1), fmt.Sprintf("%d messages, more than EnqueueManyMax (%d)", relay.EnqueueManyMax+1, relay.EnqueueManyMax)},
			{"TooLarge", "t", []relay.Outgoing{big, big, good}, "more than EnqueueManyBytesMax (67108864): write them in several calls"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				_, err := relay.EnqueueMany(ctx, neverQuerier{t}, tc.table, tc.ms)
				require.ErrorContains(t, err, "relay: enqueue: ")
				require.ErrorContains(t, err, tc.want)
			})
		}
		_, err := relay.EnqueueMany(ctx, nil, "t", []relay.Outgoing{good})
		require.ErrorContains(t, err, "nil Querier")
	})

	t.Run("OneWakeUpPerStatementOnCommit", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		channel := "relay:" + b.table
		listener := listenOn(t, channel)
		// drain returns the notifications that arrive before a sentinel
		// sent now: notifications arrive in commit order, so every one a
		// transaction committed before it has arrived by then.
		drain := func() []string {
			t.Helper()
			_, err := b.pool.Exec(ctx, "SELECT pg_notify($1, 'sentinel')", channel)
			require.NoError(t, err)
			var got []string
			for {
				n, err := listener.WaitForNotification(ctx)
				require.NoError(t, err)
				if n.Payload == "sentinel" {
					return got
				}
				got = append(got, n.Payload)
			}
		}
		ms := batch()
		ms = append(ms, relay.Outgoing{Type: "invoice", Key: "k4", Payload: []byte(`{}`)})
		tx, err := b.pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		_, err = relay.EnqueueMany(ctx, tx, b.table, ms) // its types' first attempts on the test's channel: each tries
		require.NoError(t, err)
		require.Empty(t, drain(), "nothing before the commit")
		require.NoError(t, tx.Commit(ctx))
		got := drain()
		slices.Sort(got)
		require.Equal(t, []string{"invoice", "order"}, got, "one notification per type of the statement")

		_, err = relay.EnqueueMany(ctx, b.pool, b.table, batch(), relay.WithoutWakeUp())
		require.NoError(t, err)
		require.Empty(t, drain(), "WithoutWakeUp")
	})
}

// TestEnqueueManyConcurrentKeyOrder: 8 producers write batches of messages
// of overlapping keys, each batch's keys in a random order, at once. None
// deadlocks (every statement takes its keys' locks in one order), and every
// key's messages are delivered in the order their transactions committed:
// each transaction, after its EnqueueMany, counts itself in a row per key it
// wrote, whose row lock orders the counts as the commits, so a key's count
// is its transaction's place in that key's commit order. Without the order
// locks a later-committed transaction could have drawn lower ids, and its
// messages would be delivered first.
func TestEnqueueManyConcurrentKeyOrder(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	const producers, txs, perTx, nkeys = 8, 20, 30, 12
	keys := make([]string, nkeys)
	for i := range keys {
		keys[i] = fmt.Sprint("key-", i)
	}
	commits := pgx.Identifier{b.table + "_commits"}.Sanitize()
	_, err := b.pool.Exec(ctx, "CREATE TABLE "+commits+" (key text PRIMARY KEY, n int NOT NULL DEFAULT 0)")
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = b.pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+commits) })
	_, err = b.pool.Exec(ctx, "INSERT INTO "+commits+" (key) SELECT unnest($1::text[])", keys)
	require.NoError(t, err)

	// place is where a message stands in its key's order: its transaction's
	// place among the key's commits, then its index in the batch.
	type place struct{ commit, index int }
	var mu sync.Mutex
	placeOf := map[int64]place{} // committed messages, by id
	errs := make(chan error, producers)
	var wg sync.WaitGroup
	for p := range producers {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(p), 48))
			for n := range txs {
				ms := make([]relay.Outgoing, perTx)
				for i := range ms {
					ms[i] = relay.Outgoing{Type: "t", Key: keys[rng.IntN(nkeys)], Payload: fmt.Appendf(nil, `{"p": %d, "n": %d, "i": %d}`, p, n, i)}
				}
				rollback := n%5 == 4
				var ids []int64
				counts := map[string]int{}
				err := pgx.BeginFunc(ctx, b.pool, func(tx pgx.Tx) error {
					var err error
					if ids, err = relay.EnqueueMany(ctx, tx, b.table, ms); err != nil {
						return err
					}
					written := make([]string, len(ms))
					for i, m := range ms {
						written[i] = m.Key
					}
					rows, err := tx.Query(ctx, "UPDATE "+commits+" SET n = n + 1 WHERE key = ANY($1) RETURNING key, n", written)
					if err != nil {
						return err
					}
					var key string
					var c int
					if _, err := pgx.ForEachRow(rows, []any{&key, &c}, func() error { counts[key] = c; return nil }); err != nil {
						return err
					}
					if rollback {
						return errRollback
					}
					return nil
				})
				if rollback && errors.Is(err, errRollback) {
					continue
				}
				if err != nil {
					errs <- fmt.Errorf("producer %d, transaction %d: %w", p, n, err)
					return
				}
				mu.Lock()
				for i, id := range ids {
					placeOf[id] = place{counts[ms[i].Key], i}
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err, "no deadlock, no failure")
	}
	require.Len(t, placeOf, producers*(txs-txs/5)*perTx)

	rec := newRecorder("t", nil)
	r := b.newRelay(t, b.cfg, rec)
	for {
		n, err := r.Run(ctx)
		require.NoError(t, err)
		if n == 0 {
			break
		}
	}
	require.Equal(t, len(placeOf), rec.count(), "every committed message, no rolled-back one")
	last := map[string]place{}
	for _, m := range rec.Sent {
		p, ok := placeOf[m.ID]
		require.True(t, ok, "message %d was not committed", m.ID)
		if prev, seen := last[m.Key]; seen {
			require.True(t, p.commit > prev.commit || p.commit == prev.commit && p.index > prev.index,
				"key %s: message %d (commit %d, index %d) delivered after commit %d, index %d", m.Key, m.ID, p.commit, p.index, prev.commit, prev.index)
		}
		last[m.Key] = p
	}
}

// errRollback makes a transaction of a test roll back.
var errRollback = errors.New("roll back")

func ExampleEnqueueMany() {
	ctx := context.Background()
	pool, done := exampleDatabase() // your service's pool: the outbox table, and a table of orders
	defer done()

	// An order fans out to the services of its lines: one message each,
	// all in one statement, committed with the order or not at all.
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "INSERT INTO orders (id, total) VALUES ($1, $2)", 42, "9.90"); err != nil {
			return err
		}
		ids, err := relay.EnqueueMany(ctx, tx, relay.TableDefault, []relay.Outgoing{
			{Type: "stock", Key: "sku-a", Payload: []byte(`{"order": 42, "taken": 2}`)},
			{Type: "stock", Key: "sku-b", Payload: []byte(`{"order": 42, "taken": 1}`)},
			{Type: "invoice", Key: "order-42", Payload: []byte(`{"order": 42, "total": "9.90"}`)},
		})
		fmt.Println("ids in the messages' order:", slices.IsSorted(ids), len(ids))
		return err
	})
	if err != nil {
		fmt.Println(err)
		return
	}

	var pending int
	_ = pool.QueryRow(ctx, "SELECT count(*) FROM mensagem_m2m WHERE status = 'PENDING'").Scan(&pending)
	fmt.Println("pending messages:", pending)
	// Output:
	// ids in the messages' order: true 3
	// pending messages: 3
}
