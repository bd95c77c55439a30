package container_test

import (
	"testing"

	"github.com/xadm/relay"
	"github.com/xadm/relay/relaytest"
	_ "github.com/xadm/relay/relaytest/container"
)

func TestMain(m *testing.M) { relaytest.Main(m) }

// With the container route registered, relaytest still gives a database: a
// container where a Docker engine answers, the local binaries elsewhere.
func TestDatabaseWithTheContainerRouteRegistered(t *testing.T) {
	pool := relaytest.Database(t)
	relaytest.CreateTable(t, pool, relay.TableDefault)
	relaytest.Enqueue(t, pool, relay.TableDefault, "order", "order-1", map[string]int{"id": 1})
	var n int
	if err := pool.QueryRow(t.Context(), "SELECT count(*) FROM "+relay.TableDefault).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatalf("rows in the outbox: got %d, want 1", n)
	}
}
