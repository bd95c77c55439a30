package relay_test

import (
	"database/sql"
	"testing"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" driver of database/sql

	"github.com/xadm/relay/internal/databasesqltest"
)

// TestDatabaseSQL: Enqueue and EnqueueMany through database/sql with pgx's
// stdlib driver (internal/libpqtest runs the same test with lib/pq).
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
