package inbox_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"testing"

	"github.com/xadm/relay/internal/testkit/testlog"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/xadm/relay/inbox"
	"github.com/xadm/relay/internal/testkit/pgserver"
)

// TestMain gets a real PostgreSQL (RELAY_TEST_DATABASE_URL, a container, or the
// local binaries) and, after the tests, checks that no goroutine was left behind.
func TestMain(m *testing.M) { os.Exit(pgserver.Run(m, "RELAY_TEST_DATABASE_URL")) }

// bundle is one test's receiver: its own pool, inbox tables and effects table.
type bundle struct {
	pool    *pgxpool.Pool
	table   string // the inbox's Config.Table
	effects string // the receiver's own table, quoted: one row per apply
	logs    *testlog.Buffer
}

func setup(t testing.TB) *bundle {
	t.Helper()
	name := pgserver.Name(t)
	b := &bundle{
		pool:    pgserver.Pool(t, pgserver.Shared().URL, name, 8),
		table:   name,
		effects: pgx.Identifier{name + "_fx"}.Sanitize(),
		logs:    &testlog.Buffer{},
	}
	ctx := context.Background()
	require.NoError(t, inbox.CreateTable(ctx, b.pool, b.table))
	_, err := b.pool.Exec(ctx, "CREATE TABLE "+b.effects+" (idempotency_key text NOT NULL, message_key text NOT NULL, message_id bigint NOT NULL, body text NOT NULL)")
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = b.pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+b.effects+", "+
			pgx.Identifier{b.table}.Sanitize()+", "+pgx.Identifier{b.table + "_keys"}.Sanitize())
	})
	return b
}

// inbox returns an inbox on b's table; configure changes its Config first.
func (b *bundle) inbox(t *testing.T, configure ...func(*inbox.Config)) *inbox.Inbox {
	t.Helper()
	cfg := inbox.Config{Table: b.table, Logger: slog.New(slog.NewTextHandler(b.logs, nil))}
	for _, c := range configure {
		c(&cfg)
	}
	ib, err := inbox.New(b.pool, cfg)
	require.NoError(t, err)
	return ib
}

// apply is the receiver's apply: one INSERT into b's effects table.
func (b *bundle) apply(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
	_, err := tx.Exec(ctx, "INSERT INTO "+b.effects+" VALUES ($1, $2, $3, $4)", m.IdempotencyKey, m.Key, m.ID, string(m.Body))
	return err
}

// effectCount returns how many effects message key has.
func (b *bundle) effectCount(t *testing.T, key string) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+b.effects+" WHERE idempotency_key = $1", key).Scan(&n))
	return n
}

// count returns the number of rows of a table of b: "fx", "inbox" or "keys".
func (b *bundle) count(t *testing.T, which string) int {
	t.Helper()
	table := map[string]string{
		"fx":    b.effects,
		"inbox": pgx.Identifier{b.table}.Sanitize(),
		"keys":  pgx.Identifier{b.table + "_keys"}.Sanitize(),
	}[which]
	var n int
	require.NoError(t, b.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+table).Scan(&n))
	return n
}

// msg is message id of key in outbox table "public.outbox", body {"id": id}.
func msg(key string, id int64) inbox.Message {
	return inbox.Message{
		IdempotencyKey: fmt.Sprintf("public.outbox/%d", id),
		ID:             id,
		Key:            key,
		Type:           "order",
		Attempt:        1,
		Body:           fmt.Appendf(nil, `{"id": %d}`, id),
	}
}
