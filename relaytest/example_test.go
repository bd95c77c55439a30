package relaytest_test

import (
	"context"
	"fmt"

	"github.com/xadm/relay"
	"github.com/xadm/relay/relaytest"
)

// While another replica (or the JVM relay) holds the election, RunIfElected
// coalesces and nothing is sent; once it lets go, the next pass delivers. In a
// test, t is the test's *testing.T.
func Example() {
	t := newExampleT()
	defer t.finish()
	ctx := context.Background()

	pool := relaytest.Database(t)
	relaytest.CreateTable(t, pool, relay.TableDefault)
	relaytest.Enqueue(t, pool, relay.TableDefault, "order", "order-1", map[string]int{"id": 1})
	orders := relaytest.NewRecorder("order")
	cfg := relay.DefaultConfig()
	cfg.AppName = "billing"
	r, err := relay.New(pool, cfg, orders)
	if err != nil {
		t.Fatalf("%v", err)
	}

	release := relaytest.HoldElection(t, pool, cfg.AppName)
	ran, err := r.RunIfElected(ctx)
	fmt.Println("while held:", ran, err, len(orders.Messages()))

	release()
	ran, err = r.RunIfElected(ctx)
	fmt.Println("released:", ran, err, len(orders.Messages()))
	// Output:
	// while held: false <nil> 0
	// released: true <nil> 1
}
