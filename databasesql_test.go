package relay_test

import (
	"context"
	"database/sql"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/stdlib" // and the "pgx" driver of database/sql

	"github.com/xadm/relay"
	"github.com/xadm/relay/internal/testkit/databasesqltest"
)

// TestDatabaseSQL: Enqueue and EnqueueMany through database/sql with pgx's
// stdlib driver (internal/tests/libpqtest runs the same test with lib/pq).
func TestDatabaseSQL(t *testing.T) {
	t.Parallel()
	databasesqltest.Run(t, func(t *testing.T, url string) *sql.DB {
		db, err := sql.Open("pgx", url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = db.Close() })
		return db
	})
}

func ExampleFromSQL() {
	ctx := context.Background()
	pool, done := exampleDatabase() // the outbox table, and a table of orders
	defer done()
	db := stdlib.OpenDBFromPool(pool) // your service's *sql.DB, of any driver: sql.Open("pgx", url), lib/pq's "postgres", …
	defer db.Close()

	// The order and its message commit together, or not at all.
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer func() { _ = tx.Rollback() }() // after the Commit, it does nothing
	if _, err := tx.ExecContext(ctx, "INSERT INTO orders (id, total) VALUES ($1, $2)", 42, "9.90"); err != nil {
		fmt.Println(err)
		return
	}
	_, err = relay.Enqueue(ctx, relay.FromSQL(tx), relay.TableDefault, relay.Outgoing{
		Type:    "order",
		Key:     "order-42",
		Payload: []byte(`{"id": 42, "total": "9.90"}`),
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := tx.Commit(); err != nil {
		fmt.Println(err)
		return
	}

	var pending int
	_ = db.QueryRowContext(ctx, "SELECT count(*) FROM mensagem_m2m WHERE status = 'PENDING'").Scan(&pending)
	fmt.Println("pending messages:", pending)
	// Output: pending messages: 1
}
