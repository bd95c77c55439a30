// Package databasesqltest is the test of the database/sql producers
// (relay.FromSQL), run once per driver: pgx's stdlib by the core's tests,
// lib/pq by the module of internal/tests/libpqtest, which the core may not depend
// on. The test binary's TestMain starts the server (pgserver.Run).
package databasesqltest

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/xadm/relay"
	"github.com/xadm/relay/internal/testkit/pgserver"
)

// Run runs the tests through the *sql.DB that open returns for a test, on
// pgserver.Shared()'s database; each test compares it with pgx's own path.
func Run(t *testing.T, open func(t *testing.T, url string) *sql.DB) {
	ctx := context.Background()
	order := relay.Outgoing{Type: "order", Key: "order-1", Payload: []byte(`{"id": 1}`)}
	lines := []relay.Outgoing{
		{Type: "line", Key: "order-1/1", Payload: []byte(`{"n": 1}`)},
		{Type: "line", Key: "order-1/2", Payload: []byte(`{"n": 2}`), Headers: map[string]string{"traceparent": "00-1-2-01"}},
	}

	t.Run("CommitsWithTheBusinessWrite", func(t *testing.T) {
		t.Parallel()
		w := setup(t, open)
		tx, err := w.db.BeginTx(ctx, nil)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback() }()
		_, err = tx.ExecContext(ctx, "INSERT INTO "+w.orders+" (id) VALUES (1)")
		require.NoError(t, err)
		id, err := relay.Enqueue(ctx, relay.FromSQL(tx), w.table, order)
		require.NoError(t, err)
		ids, err := relay.EnqueueMany(ctx, relay.FromSQL(tx), w.table, lines)
		require.NoError(t, err)
		require.Len(t, ids, 2)
		require.True(t, id < ids[0] && ids[0] < ids[1], "ids in the order written: %d, %v", id, ids)
		require.Zero(t, w.count(t), "not visible before the commit")
		require.NoError(t, tx.Commit())

		require.Equal(t, 3, w.count(t))
		sent := w.deliver(t, "order", "line")
		require.Equal(t, []int64{id, ids[0], ids[1]}, idsOf(sent))
		require.JSONEq(t, string(lines[1].Payload), string(sent[2].Payload))
		require.Equal(t, lines[1].Headers, sent[2].Headers)
	})

	t.Run("RollsBackWithTheBusinessWrite", func(t *testing.T) {
		t.Parallel()
		w := setup(t, open)
		tx, err := w.db.BeginTx(ctx, nil)
		require.NoError(t, err)
		_, err = tx.ExecContext(ctx, "INSERT INTO "+w.orders+" (id) VALUES (1)")
		require.NoError(t, err)
		_, err = relay.Enqueue(ctx, relay.FromSQL(tx), w.table, order)
		require.NoError(t, err)
		_, err = relay.EnqueueMany(ctx, relay.FromSQL(tx), w.table, lines)
		require.NoError(t, err)
		require.NoError(t, tx.Rollback())
		require.Zero(t, w.count(t), "a rolled-back transaction leaves no message")
		var orders int
		require.NoError(t, w.pool.QueryRow(ctx, "SELECT count(*) FROM "+w.orders).Scan(&orders))
		require.Zero(t, orders)
		require.Empty(t, w.deliver(t, "order", "line"))
	})

	t.Run("WakeUpArrivesOnCommit", func(t *testing.T) {
		t.Parallel()
		w := setup(t, open)
		channel := "relay:" + w.table
		listener, err := pgx.Connect(ctx, pgserver.Shared().URL)
		require.NoError(t, err)
		defer listener.Close(context.Background())
		_, err = listener.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize())
		require.NoError(t, err)
		// arrived returns the notifications that arrive before a sentinel
		// sent now: they arrive in commit order, so every one a
		// transaction committed before it has arrived by then.
		arrived := func() []string {
			t.Helper()
			_, err := w.pool.Exec(ctx, "SELECT pg_notify($1, 'sentinel')", channel)
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
		// The table is new: the first message of each type tries the
		// wake-up, and notifies.
		tx, err := w.db.BeginTx(ctx, nil)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback() }()
		_, err = relay.Enqueue(ctx, relay.FromSQL(tx), w.table, order)
		require.NoError(t, err)
		_, err = relay.EnqueueMany(ctx, relay.FromSQL(tx), w.table, lines)
		require.NoError(t, err)
		require.Empty(t, arrived(), "nothing before the commit")
		require.NoError(t, tx.Commit())
		got := arrived()
		slices.Sort(got)
		require.Equal(t, []string{"line", "order"}, got)
	})

	t.Run("BadInputGetsPgxsErrors", func(t *testing.T) {
		t.Parallel()
		w := setup(t, open)
		for _, tc := range []struct {
			name  string
			table string
			ms    []relay.Outgoing
		}{
			{"BadTable", "orders; DROP TABLE x", []relay.Outgoing{order}},
			{"EmptyKey", w.table, []relay.Outgoing{{Type: "order", Payload: []byte(`{}`)}}},
			{"PayloadNotJSON", w.table, []relay.Outgoing{order, {Type: "order", Key: "k", Payload: []byte(`{"id":`)}}},
			{"ReservedHeader", w.table, []relay.Outgoing{{Type: "order", Key: "k", Payload: []byte(`{}`), Headers: map[string]string{"Content-Type": "x"}}}},
			{"TooMany", w.table, make([]relay.Outgoing, relay.EnqueueManyMax+1)},
		} {
			t.Run(tc.name, func(t *testing.T) {
				_, viaSQL := relay.EnqueueMany(ctx, relay.FromSQL(w.db), tc.table, tc.ms)
				_, viaPgx := relay.EnqueueMany(ctx, w.pool, tc.table, tc.ms)
				require.Error(t, viaPgx)
				require.EqualError(t, viaSQL, viaPgx.Error())
				if len(tc.ms) == 1 {
					_, viaSQL = relay.Enqueue(ctx, relay.FromSQL(w.db), tc.table, tc.ms[0])
					_, viaPgx = relay.Enqueue(ctx, w.pool, tc.table, tc.ms[0])
					require.Error(t, viaPgx)
					require.EqualError(t, viaSQL, viaPgx.Error())
				}
			})
		}
		for _, q := range []relay.SQLQuerier{nil, (*sql.Tx)(nil), (*sql.DB)(nil), (*sql.Conn)(nil)} {
			_, err := relay.Enqueue(ctx, relay.FromSQL(q), w.table, order)
			require.ErrorContains(t, err, "nil Querier", "%T", q)
			_, err = relay.EnqueueMany(ctx, relay.FromSQL(q), w.table, lines)
			require.ErrorContains(t, err, "nil Querier", "%T", q)
		}

		// The server's refusals: the same SQLSTATE, and nothing written.
		sqlState := func(err error) string {
			var coded interface{ SQLState() string }
			require.True(t, errors.As(err, &coded), "%v has no SQLSTATE", err)
			return coded.SQLState()
		}
		_, viaSQL := relay.Enqueue(ctx, relay.FromSQL(w.db), w.table+"_missing", order)
		_, viaPgx := relay.Enqueue(ctx, w.pool, w.table+"_missing", order)
		require.Equal(t, "42P01", sqlState(viaPgx))
		require.Equal(t, sqlState(viaPgx), sqlState(viaSQL))
		require.ErrorContains(t, viaSQL, `type "order", key "order-1"`)
		bad := append(slices.Clone(lines), relay.Outgoing{Type: "line", Key: "k", Payload: []byte(`"\u0000"`)}) // jsonb refuses it
		_, viaSQL = relay.EnqueueMany(ctx, relay.FromSQL(w.db), w.table, bad)
		_, viaPgx = relay.EnqueueMany(ctx, w.pool, w.table, bad)
		require.Equal(t, "22P05", sqlState(viaPgx))
		require.Equal(t, sqlState(viaPgx), sqlState(viaSQL))
		require.ErrorContains(t, viaSQL, "relay: enqueue: insert 3 messages into "+w.table)
		require.Zero(t, w.count(t), "nothing of a refused batch")

		_, err := w.pool.Exec(ctx, "ALTER TABLE "+pgx.Identifier{w.table}.Sanitize()+" DROP COLUMN headers")
		require.NoError(t, err)
		for _, write := range []func(relay.Querier) error{
			func(q relay.Querier) error { _, err := relay.Enqueue(ctx, q, w.table, lines[1]); return err },
			func(q relay.Querier) error { _, err := relay.EnqueueMany(ctx, q, w.table, lines); return err },
		} {
			require.ErrorContains(t, write(w.pool), "the table has no headers column")
			require.ErrorContains(t, write(relay.FromSQL(w.db)), "the table has no headers column")
		}
	})

	t.Run("ThroughADBOrAConn", func(t *testing.T) {
		t.Parallel()
		w := setup(t, open)
		first, err := relay.Enqueue(ctx, relay.FromSQL(w.db), w.table, order)
		require.NoError(t, err)
		conn, err := w.db.Conn(ctx)
		require.NoError(t, err)
		defer conn.Close()
		ids, err := relay.EnqueueMany(ctx, relay.FromSQL(conn), w.table, lines)
		require.NoError(t, err)
		require.Greater(t, ids[0], first)
		require.Equal(t, 3, w.count(t), "committed at once")
	})

	t.Run("KeysAndPayloadsArriveAsWritten", func(t *testing.T) {
		t.Parallel()
		w := setup(t, open)
		// What an array literal must escape or quote, and what it must not
		// take for its own syntax.
		keys := []string{`a"b`, `a\b`, `a,b`, `{a}`, `NULL`, ` spaced `, `é中`, `\"`, `''`}
		ms := make([]relay.Outgoing, len(keys))
		for i, k := range keys {
			ms[i] = relay.Outgoing{Type: "t,\"x\"", Key: k, Payload: fmt.Appendf(nil, `{"key": %q}`, k),
				Headers: map[string]string{"x-key": `v"\` + k}}
		}
		ids, err := relay.EnqueueMany(ctx, relay.FromSQL(w.db), w.table, ms)
		require.NoError(t, err)
		for i, id := range ids {
			var typ, key, payload string
			var headers map[string]string
			require.NoError(t, w.pool.QueryRow(ctx, "SELECT type, natural_key, payload::text, headers FROM "+
				pgx.Identifier{w.table}.Sanitize()+" WHERE id = $1", id).Scan(&typ, &key, &payload, &headers))
			require.Equal(t, ms[i].Type, typ)
			require.Equal(t, keys[i], key)
			require.JSONEq(t, string(ms[i].Payload), payload)
			require.Equal(t, ms[i].Headers, headers)
		}
	})
}

// world is one test's table, a table of the business's own beside it, the
// driver's *sql.DB and a pgx pool on the same database.
type world struct {
	db     *sql.DB
	pool   *pgxpool.Pool
	table  string
	orders string // quoted
}

func setup(t *testing.T, open func(t *testing.T, url string) *sql.DB) *world {
	t.Helper()
	ctx := context.Background()
	name := pgserver.Name(t)
	w := &world{db: open(t, pgserver.Shared().URL), pool: pgserver.Pool(t, pgserver.Shared().URL, name, 4), table: name,
		orders: pgx.Identifier{name + "_orders"}.Sanitize()}
	require.NoError(t, relay.CreateTable(ctx, w.pool, w.table))
	_, err := w.pool.Exec(ctx, "CREATE TABLE "+w.orders+" (id int PRIMARY KEY)")
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = w.pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+pgx.Identifier{w.table}.Sanitize()+", "+w.orders)
	})
	return w
}

func (w *world) count(t *testing.T) int {
	t.Helper()
	var n int
	require.NoError(t, w.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+pgx.Identifier{w.table}.Sanitize()).Scan(&n))
	return n
}

// deliver runs a relay of the given types over the table until it finds
// nothing more, and returns what it sent, by id.
func (w *world) deliver(t *testing.T, types ...string) []relay.Message {
	t.Helper()
	cfg := relay.DefaultConfig()
	cfg.AppName, cfg.Table = w.table, w.table
	cfg.Logger = slog.New(slog.DiscardHandler)
	var mu sync.Mutex
	var sent []relay.Message
	var senders []relay.Sender
	for _, typ := range types {
		senders = append(senders, relay.SenderFunc(typ, func(_ context.Context, m relay.Message) error {
			mu.Lock()
			defer mu.Unlock()
			sent = append(sent, m)
			return nil
		}))
	}
	r, err := relay.New(w.pool, cfg, senders...)
	require.NoError(t, err)
	for {
		n, err := r.Run(context.Background())
		require.NoError(t, err)
		if n == 0 {
			break
		}
	}
	mu.Lock()
	defer mu.Unlock()
	slices.SortFunc(sent, func(a, b relay.Message) int { return cmp.Compare(a.ID, b.ID) })
	return sent
}

func idsOf(ms []relay.Message) []int64 {
	ids := make([]int64, len(ms))
	for i, m := range ms {
		ids[i] = m.ID
	}
	return ids
}
