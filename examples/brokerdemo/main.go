// Command brokerdemo is examples/demo with a broker for destination: three
// replicas of one app deliver an outbox to Kafka or NATS JetStream while they
// are rolled one at a time, and a consumer counts what arrived.
//
//	cd examples/brokerdemo
//	go run . -to kafka    # franz-go's kfake, an in-process Kafka
//	go run . -to nats     # an embedded nats-server with JetStream
//	go run . -to http     # an HTTP receiver, as examples/demo
//
// It gets a throwaway PostgreSQL as examples/demo does (DATABASE_URL if set,
// else the local PostgreSQL binaries) and starts the broker in this process: nothing to set up. Each
// replica has its own pool and its own client of the broker, as a pod has.
// The consumer reads the topic or the stream and counts the copies of each
// message by its Relay-Message-Id.
//
// It runs the scenario twice: with the election (ClusterLock = true, the
// default), and with the escape hatch (ClusterLock = false), where the
// replicas deliver the same rows at the same time. With NATS the second run
// shows JetStream's duplicate window at work: the relays publish copies, and
// the stream, deduplicating by Nats-Msg-Id, keeps one.
//
// It exits 0 only if the guarded run lost nothing and delivered no duplicate
// that a retry does not explain (a copy with a higher Relay-Attempt: the relay
// recorded a failure, a timeout say, of a send that had reached the broker);
// 1 otherwise, and on Ctrl-C, after stopping what it started.
//
// The scenario is internal/tools/demo's, which examples/demo runs too; this module
// adds the destinations that need a broker.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/xadm/relay/internal/testkit/pgserver"
	"github.com/xadm/relay/internal/tools/demo"
)

func main() { os.Exit(run()) }

func run() int {
	to := flag.String("to", "kafka", "the destination: kafka, nats or http")
	messages := flag.Int("messages", 3000, "messages to write in each run")
	flag.Parse()
	if _, ok := destinations[*to]; !ok {
		fmt.Fprintf(os.Stderr, "-to %q: want kafka, nats or http\n", *to)
		return 2
	}
	if *messages < 1 {
		fmt.Fprintln(os.Stderr, "-messages must be at least 1")
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	context.AfterFunc(ctx, stop) // a second Ctrl-C kills at once

	begin := time.Now()
	fmt.Println("Starting a throwaway PostgreSQL (DATABASE_URL, else the local binaries)…")
	server, err := pgserver.Start(ctx, "DATABASE_URL")
	if err != nil {
		fmt.Println(err)
		return 1
	}
	defer func() {
		if err := server.Stop(); err != nil {
			fmt.Println("stopping PostgreSQL:", err)
		}
	}()
	fmt.Printf("PostgreSQL ready (%s).\n", server.Kind)

	results, err := runDemo(ctx, os.Stdout, server.URL, *to, demo.DefaultParams(*messages), true)
	switch {
	case ctx.Err() != nil:
		fmt.Println("\ninterrupted; everything the demo started is stopped")
		return 1
	case err != nil:
		fmt.Printf("\ndemo failed: %v\n", err)
		return 1
	}
	guarded := results[0]
	verdict := "PASS"
	if !guarded.OK() {
		verdict = "FAIL: the guarded run lost messages or delivered a duplicate that no retry explains"
	}
	fmt.Printf("\n%s (%.1fs in all)\n", verdict, time.Since(begin).Seconds())
	if !guarded.OK() {
		return 1
	}
	return 0
}

// runDemo runs the guarded scenario, then the unguarded one if unguarded is
// set, each on a fresh table and a fresh destination of kind to, and prints
// their reports to w.
func runDemo(ctx context.Context, w io.Writer, dbURL, to string, p demo.Params, unguarded bool) ([]demo.Result, error) {
	out := demo.NewProgress(w)
	d := destinations[to]
	return demo.Run(ctx, demo.Options{
		App:       "relay-brokerdemo",
		Tables:    "relay_brokerdemo",
		Title:     d.title,
		Start:     d.start,
		Dropped:   d.dropped,
		Params:    p,
		DBURL:     dbURL,
		Out:       out,
		Logger:    slog.New(demo.Hushed(ctx, slog.NewTextHandler(out, &slog.HandlerOptions{Level: slog.LevelError}))),
		Unguarded: unguarded,
	})
}
