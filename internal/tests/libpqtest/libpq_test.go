// Package libpqtest runs the test of the database/sql producers
// (internal/testkit/databasesqltest) through lib/pq, in a module of its own: the
// core module may not depend on lib/pq, even for its tests, or adopters'
// builds would take its version into their module graph.
package libpqtest

import (
	"database/sql"
	"os"
	"testing"

	_ "github.com/lib/pq" // the "postgres" driver of database/sql

	"github.com/xadm/relay/internal/testkit/databasesqltest"
	"github.com/xadm/relay/internal/testkit/pgserver"
)

func TestMain(m *testing.M) { os.Exit(pgserver.Run(m, "RELAY_TEST_DATABASE_URL")) }

// TestDatabaseSQL: Enqueue and EnqueueMany through database/sql with lib/pq
// (the core's own TestDatabaseSQL runs the same test with pgx's stdlib).
func TestDatabaseSQL(t *testing.T) {
	t.Parallel()
	databasesqltest.Run(t, func(t *testing.T, url string) *sql.DB {
		db, err := sql.Open("postgres", url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = db.Close() })
		return db
	})
}
