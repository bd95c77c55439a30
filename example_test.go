package relay_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/xadm/relay"
)

// New builds a relay from DefaultConfig (or ConfigFromEnv) and one sender per
// message type. A Config that did not start from DefaultConfig is refused:
// its ClusterLock would silently be false.
func ExampleNew() {
	ctx := context.Background()
	pool := connect(ctx) // the service's *pgxpool.Pool; it needs at least 2 connections
	defer pool.Close()

	cfg := relay.DefaultConfig() // every default, ClusterLock = true among them
	cfg.AppName = "billing"      // the same on every replica: it names the election
	cfg.Interval = 500 * time.Millisecond

	orders, err := relay.NewHTTPSender(relay.HTTPSenderConfig{
		Type: "order", // rows of type "order" go to PUT https://orders.internal/orders/<key>
		URL:  relay.URLWithKey("https://orders.internal/orders"),
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := relay.CreateTable(ctx, pool, cfg.Table); err != nil {
		log.Fatal(err)
	}
	r, err := relay.New(pool, cfg, orders)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("relay of %q drains %s, elected by hashtext('%s%s')\n", cfg.AppName, cfg.Table, cfg.AppName, relay.LockKeySuffix)
	_ = r // r.Start(ctx) in a service; see Relay.Start

	_, err = relay.New(pool, relay.Config{AppName: "billing"}, orders)
	fmt.Println(err != nil)
	// Output:
	// relay of "billing" drains mensagem_m2m, elected by hashtext('billing_relay_m2m')
	// true
}

// Run is the direct pass, without election: tests and "run now". The message
// is written in the same transaction as the business data, with Enqueue.
func ExampleRelay_Run() {
	ctx := context.Background()
	pool := connect(ctx)
	defer pool.Close()
	if err := relay.CreateTable(ctx, pool, relay.TableDefault); err != nil {
		log.Fatal(err)
	}

	// The service's own transaction: its business rows and its messages commit together.
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// ... INSERT INTO orders ...
		for _, key := range []string{"order-1", "order-2"} {
			_, err := relay.Enqueue(ctx, tx, relay.TableDefault, relay.Outgoing{
				Type:    "order",
				Key:     key,
				Payload: []byte(`{"total": 10}`),
			})
			if err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}

	orders := relay.SenderFunc("order", func(ctx context.Context, m relay.Message) error {
		fmt.Println("deliver", m.Key, string(m.Payload))
		return nil
	})
	r, err := relay.New(pool, relay.DefaultConfig(), orders)
	if err != nil {
		log.Fatal(err)
	}
	n, err := r.Run(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("processed", n)
	// Output:
	// deliver order-1 {"total": 10}
	// deliver order-2 {"total": 10}
	// processed 2
}

// RunIfElected is the pass under the election, and the seam through which a
// service proves, in its own integration test, that the relay sends nothing
// while another replica holds the election. Here the other replica is a
// session that takes the lock exactly as the JVM relay does.
func ExampleRelay_RunIfElected() {
	ctx := context.Background()
	pool := connect(ctx)
	defer pool.Close()
	if err := relay.CreateTable(ctx, pool, relay.TableDefault); err != nil {
		log.Fatal(err)
	}
	if _, err := relay.Enqueue(ctx, pool, relay.TableDefault, relay.Outgoing{
		Type: "order", Key: "order-1", Payload: []byte(`{}`),
	}); err != nil {
		log.Fatal(err)
	}

	cfg := relay.DefaultConfig()
	cfg.AppName = "billing"
	orders := relay.SenderFunc("order", func(ctx context.Context, m relay.Message) error {
		fmt.Println("deliver", m.Key)
		return nil
	})
	r, err := relay.New(pool, cfg, orders)
	if err != nil {
		log.Fatal(err)
	}

	// Another replica (here, a plain session) holds the election of "billing".
	other, err := pool.Acquire(ctx)
	if err != nil {
		log.Fatal(err)
	}
	var held bool
	if err := other.QueryRow(ctx, "SELECT pg_try_advisory_lock(hashtext('billing_relay_m2m'))").Scan(&held); err != nil || !held {
		log.Fatal("the other replica must hold the election: ", err)
	}

	ran, err := r.RunIfElected(ctx)
	fmt.Println("while the other replica holds it: ran", ran, err)

	if _, err := other.Exec(ctx, "SELECT pg_advisory_unlock(hashtext('billing_relay_m2m'))"); err != nil {
		log.Fatal(err)
	}
	other.Release()

	ran, err = r.RunIfElected(ctx)
	fmt.Println("once it let go: ran", ran, err)
	// Output:
	// while the other replica holds it: ran false <nil>
	// deliver order-1
	// once it let go: ran true <nil>
}

// Start runs the periodic pass in the background, under the election; Stop
// lets the pass in flight finish its messages and release the election. A
// service starts the relay with a context that its shutdown signal does not
// cancel, and calls Stop with a bounded one.
func ExampleRelay_Start() {
	ctx := context.Background()
	pool := connect(ctx)
	defer pool.Close()
	if err := relay.CreateTable(ctx, pool, relay.TableDefault); err != nil {
		log.Fatal(err)
	}

	delivered := make(chan string)
	orders := relay.SenderFunc("order", func(ctx context.Context, m relay.Message) error {
		delivered <- m.Key
		return nil
	})
	cfg := relay.DefaultConfig()
	cfg.AppName = "billing"
	cfg.Interval = 100 * time.Millisecond
	r, err := relay.New(pool, cfg, orders)
	if err != nil {
		log.Fatal(err)
	}
	if err := r.Start(ctx); err != nil {
		log.Fatal(err)
	}

	for _, key := range []string{"order-1", "order-2"} {
		if _, err := relay.Enqueue(ctx, pool, relay.TableDefault, relay.Outgoing{
			Type: "order", Key: key, Payload: []byte(`{}`),
		}); err != nil {
			log.Fatal(err)
		}
		fmt.Println("delivered", <-delivered)
	}

	// On SIGTERM: stop within the grace period the platform gives.
	stopCtx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := r.Stop(stopCtx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("stopped; sent", r.Stats().Sent)
	// Output:
	// delivered order-1
	// delivered order-2
	// stopped; sent 2
}

// Any job that must run on one replica of N can use the same guard: here a
// nightly report that every replica schedules, and only one writes. The
// second replica tries while the first still runs it, and coalesces.
func ExamplePostgresGuard_TryRun() {
	ctx := context.Background()
	pool := connect(ctx) // replica 1's pool
	defer pool.Close()
	pool2 := connectReplica(ctx) // replica 2's pool
	defer pool2.Close()
	replica1 := relay.NewPostgresGuard(pool)
	replica2 := relay.NewPostgresGuard(pool2)

	report := func(ctx context.Context) error {
		fmt.Println("replica 1 writes the nightly report")
		// Meanwhile replica 2's scheduler fires too.
		ran, err := replica2.TryRun(ctx, "billing_nightly_report", func(ctx context.Context) error {
			fmt.Println("replica 2 writes the nightly report")
			return nil
		})
		fmt.Println("replica 2 ran:", ran, err)
		return nil
	}
	ran, err := replica1.TryRun(ctx, "billing_nightly_report", report)
	fmt.Println("replica 1 ran:", ran, err)
	// Output:
	// replica 1 writes the nightly report
	// replica 2 ran: false <nil>
	// replica 1 ran: true <nil>
}
