package relay_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/xadm/relay"
)

func TestEnqueue(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	order := relay.Outgoing{Type: "order", Key: "order-1", Payload: []byte(`{"id":1,"total":"9.90"}`)}

	// businessTable is a table of the adopter's own, written in the same transaction.
	businessTable := func(t *testing.T, b *bundle) string {
		name := pgx.Identifier{b.table + "_orders"}.Sanitize()
		_, err := b.pool.Exec(ctx, "CREATE TABLE "+name+" (id int PRIMARY KEY)")
		require.NoError(t, err)
		t.Cleanup(func() { _, _ = b.pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+name) })
		return name
	}

	t.Run("CommitsWithTheBusinessWriteAndIsDelivered", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		orders := businessTable(t, b)

		tx, err := b.pool.Begin(ctx)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, "INSERT INTO "+orders+" (id) VALUES (1)")
		require.NoError(t, err)
		id, err := relay.Enqueue(ctx, tx, b.table, order)
		require.NoError(t, err)
		require.Positive(t, id)
		require.Zero(t, b.countStatus(t, "PENDING"), "not visible before the commit")
		require.NoError(t, tx.Commit(ctx))

		var direction, status string
		var attempts int
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT direction, status, attempts FROM "+
			pgx.Identifier{b.table}.Sanitize()+" WHERE id = $1", id).Scan(&direction, &status, &attempts))
		require.Equal(t, "OUT", direction)
		require.Equal(t, "PENDING", status)
		require.Zero(t, attempts)

		rec := newRecorder("order", nil)
		n, err := b.newRelay(t, b.cfg, rec).Run(ctx)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		require.Len(t, rec.Sent, 1)
		m := rec.Sent[0]
		require.Equal(t, id, m.ID)
		require.Equal(t, "order", m.Type)
		require.Equal(t, "order-1", m.Key)
		require.JSONEq(t, string(order.Payload), string(m.Payload))
		require.Equal(t, "SENT", b.state(t, id).Status)
	})

	t.Run("RollsBackWithTheBusinessWrite", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		orders := businessTable(t, b)

		tx, err := b.pool.Begin(ctx)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, "INSERT INTO "+orders+" (id) VALUES (1)")
		require.NoError(t, err)
		_, err = relay.Enqueue(ctx, tx, b.table, order)
		require.NoError(t, err)
		require.NoError(t, tx.Rollback(ctx))

		var n int
		require.NoError(t, b.pool.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{b.table}.Sanitize()).Scan(&n))
		require.Zero(t, n, "a rolled-back message leaves no row")
		rec := newRecorder("order", nil)
		processed, err := b.newRelay(t, b.cfg, rec).Run(ctx)
		require.NoError(t, err)
		require.Zero(t, processed)
	})

	t.Run("ThroughAPoolOrAConnection", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		first, err := relay.Enqueue(ctx, b.pool, b.table, order)
		require.NoError(t, err)
		conn, err := b.pool.Acquire(ctx)
		require.NoError(t, err)
		defer conn.Release()
		second, err := relay.Enqueue(ctx, conn, b.table, relay.Outgoing{Type: "order", Key: "order-2", Payload: []byte(`[1, 2]`)})
		require.NoError(t, err)
		require.Greater(t, second, first)
		require.Equal(t, 2, b.countStatus(t, "PENDING"), "committed at once, each on its own")
	})

	t.Run("SchemaQualifiedTable", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		_, err := relay.Enqueue(ctx, b.pool, "public."+b.table, order)
		require.NoError(t, err)
		require.Equal(t, 1, b.countStatus(t, "PENDING"))
	})

	t.Run("RefusesBeforeAnySQL", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct {
			name  string
			table string
			m     relay.Outgoing
			want  string
		}{
			{"BadTable", "orders; DROP TABLE x", order, `table "orders; DROP TABLE x"`},
			{"EmptyTable", "", order, `table ""`},
			{"EmptyType", "t", relay.Outgoing{Key: "k", Payload: []byte(`{}`)}, "Outgoing.Type must not be empty"},
			{"BlankType", "t", relay.Outgoing{Type: " \t", Key: "k", Payload: []byte(`{}`)}, "Outgoing.Type must not be empty"},
			{"EmptyKey", "t", relay.Outgoing{Type: "order", Payload: []byte(`{}`)}, "Outgoing.Key must not be empty"},
			{"BlankKey", "t", relay.Outgoing{Type: "order", Key: "  ", Payload: []byte(`{}`)}, "Outgoing.Key must not be empty"},
			{"NoPayload", "t", relay.Outgoing{Type: "order", Key: "k"}, "Outgoing.Payload must not be empty"},
			{"PayloadNotJSON", "t", relay.Outgoing{Type: "order", Key: "k", Payload: []byte(`{"id":`)}, "Outgoing.Payload is not valid JSON"},
			{"PayloadTwoDocuments", "t", relay.Outgoing{Type: "order", Key: "k", Payload: []byte(`{} {}`)}, "Outgoing.Payload is not valid JSON"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				_, err := relay.Enqueue(ctx, neverQuerier{t}, tc.table, tc.m)
				require.ErrorContains(t, err, "relay: enqueue: ")
				require.ErrorContains(t, err, tc.want)
			})
		}
		_, err := relay.Enqueue(ctx, nil, "t", order)
		require.ErrorContains(t, err, "nil Querier")
	})

	t.Run("InsertErrorNamesTheMessage", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		_, err := relay.Enqueue(ctx, b.pool, b.table+"_missing", order)
		require.ErrorContains(t, err, `type "order", key "order-1"`)
		require.ErrorContains(t, err, "does not exist")
	})
}

// neverQuerier fails the test if Enqueue reaches the database.
type neverQuerier struct{ t *testing.T }

func (q neverQuerier) QueryRow(context.Context, string, ...any) pgx.Row {
	q.t.Fatal("Enqueue ran SQL for a message it should have refused")
	return nil
}

func ExampleEnqueue() {
	ctx := context.Background()
	pool, done := exampleDatabase() // your service's pool: the outbox table, and a table of orders
	defer done()

	// The order and its message commit together, or not at all.
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "INSERT INTO orders (id, total) VALUES ($1, $2)", 42, "9.90"); err != nil {
			return err
		}
		payload, err := json.Marshal(map[string]any{"id": 42, "total": "9.90"})
		if err != nil {
			return err
		}
		_, err = relay.Enqueue(ctx, tx, relay.TableDefault, relay.Outgoing{
			Type:    "order",
			Key:     "order-42", // the natural key
			Payload: payload,
		})
		return err
	})
	if err != nil {
		fmt.Println(err)
		return
	}

	var pending int
	_ = pool.QueryRow(ctx, "SELECT count(*) FROM mensagem_m2m WHERE status = 'PENDING'").Scan(&pending)
	fmt.Println("pending messages:", pending)
	// Output: pending messages: 1
}

// exampleDatabase is a fresh database on the test server with the outbox
// table (relay.TableDefault) and an orders table, and a func that drops it.
func exampleDatabase() (*pgxpool.Pool, func()) {
	ctx := context.Background()
	name := fmt.Sprintf("example_%08x", rand.Uint32())
	must := func(err error) {
		if err != nil {
			panic(err)
		}
	}
	admin, err := pgx.Connect(ctx, server().URL)
	must(err)
	defer admin.Close(ctx)
	_, err = admin.Exec(ctx, "CREATE DATABASE "+name)
	must(err)
	cfg, err := pgxpool.ParseConfig(server().URL)
	must(err)
	cfg.ConnConfig.Database = name
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	must(err)
	must(relay.CreateTable(ctx, pool, relay.TableDefault))
	_, err = pool.Exec(ctx, "CREATE TABLE orders (id int PRIMARY KEY, total numeric NOT NULL)")
	must(err)
	return pool, func() {
		pool.Close()
		conn, err := pgx.Connect(ctx, server().URL)
		must(err)
		defer conn.Close(ctx)
		_, err = conn.Exec(ctx, "DROP DATABASE "+name+" WITH (FORCE)")
		must(err)
	}
}

// TestPerKeyOrderFollowsCommits: ids are drawn at INSERT, not at commit. Two
// producers writing one key at once could commit out of id order, and the
// relay would deliver the later-committed, lower id after the other. Enqueue
// takes the key's order lock before it draws the id, so the second producer
// waits for the first to commit, and ids follow commits. A plain-SQL producer
// that does not take the lock shows the hazard it closes.
func TestPerKeyOrderFollowsCommits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	msg := func(n int) relay.Outgoing {
		return relay.Outgoing{Type: "t", Key: "order-1", Payload: fmt.Appendf(nil, `{"n": %d}`, n)}
	}
	// waiting reports whether a session of the pool waits on an advisory lock.
	waiting := func(b *bundle) bool {
		var n int
		require.NoError(t, b.pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid)
			WHERE l.locktype = 'advisory' AND NOT l.granted AND a.application_name = $1`,
			b.pool.Config().ConnConfig.RuntimeParams["application_name"]).Scan(&n))
		return n > 0
	}

	t.Run("EnqueueSerialisesAKeysWriters", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		first, err := b.pool.Begin(ctx)
		require.NoError(t, err)
		firstID, err := relay.Enqueue(ctx, first, b.table, msg(1))
		require.NoError(t, err)

		secondID := make(chan int64, 1)
		go func() {
			id, err := relay.Enqueue(ctx, b.pool, b.table, msg(2)) // commits on its own
			assert.NoError(t, err)
			secondID <- id
		}()
		require.Eventually(t, func() bool { return waiting(b) }, 10*time.Second, 5*time.Millisecond,
			"the second writer of the key waits for the first")
		require.NoError(t, first.Commit(ctx))
		second := <-secondID
		require.Greater(t, second, firstID, "the later commit has the later id")

		rec := newRecorder("t", nil)
		_, err = b.newRelay(t, b.cfg, rec).Run(ctx)
		require.NoError(t, err)
		require.Equal(t, []int64{firstID, second}, rec.ids())
	})

	t.Run("AProducerWithoutTheLockCanOvertake", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		insert := `INSERT INTO ` + pgx.Identifier{b.table}.Sanitize() + ` (type, natural_key, payload) VALUES ('t', 'order-1', '{}') RETURNING id`
		first, err := b.pool.Begin(ctx)
		require.NoError(t, err)
		var firstID, secondID int64
		require.NoError(t, first.QueryRow(ctx, insert).Scan(&firstID))
		require.NoError(t, b.pool.QueryRow(ctx, insert).Scan(&secondID)) // commits at once
		rec := newRecorder("t", nil)
		r := b.newRelay(t, b.cfg, rec)
		_, err = r.Run(ctx)
		require.NoError(t, err)
		require.NoError(t, first.Commit(ctx))
		_, err = r.Run(ctx)
		require.NoError(t, err)
		require.Equal(t, []int64{secondID, firstID}, rec.ids(),
			"without the lock the key's messages arrive in commit order, not id order")
	})
}
