package kafka_test

import (
	"context"
	"log"
	"os/signal"
	"syscall"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/xadm/relay"
	"github.com/xadm/relay/kafka"
)

// Example wires a Kafka sender into a service's relay: the messages of type
// "order.created" go to the topic "orders", keyed by their natural key.
func Example() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	pool, err := pgxpool.New(ctx, "postgres://app@db/app")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()

	orders, err := kafka.NewSender(kafka.Config{Type: "order.created", Topic: "orders", Brokers: []string{"kafka:9092"}})
	if err != nil {
		log.Fatal(err)
	}
	defer orders.Close()
	r, err := relay.New(pool, relay.DefaultConfig(), orders)
	if err != nil {
		log.Fatal(err)
	}

	if err := r.Start(ctx); err != nil {
		log.Fatal(err)
	}
	<-ctx.Done()
	if err := r.Stop(context.Background()); err != nil {
		log.Print(err)
	}
}
