// Command demo shows the relay's instance election at work, with one command
// and nothing to set up:
//
//	go run ./examples/demo
//
// It gets a throwaway PostgreSQL by itself (DATABASE_URL if set, else the
// local PostgreSQL binaries), starts an HTTP receiver on 127.0.0.1 that counts
// the deliveries of each message, and runs three replicas of one app in this process,
// each with its own pool, as three pods would. It writes messages in
// transactions while it rolls the replicas one at a time, then reports what the
// receiver counted.
//
// It runs that scenario twice: with the election (ClusterLock = true, the
// default), where the receiver must see every message exactly once, and with
// the escape hatch (ClusterLock = false), where the replicas drain the same
// rows at the same time and the duplicates of decision 0035 come back.
//
// It exits 0 only if the guarded run delivered every message, none twice; 1
// otherwise, and on Ctrl-C, after cleaning up what it started.
//
// The scenario is internal/tools/demo's, which examples/brokerdemo runs too, with
// a broker for destination.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/xadm/relay/internal/testkit/pgserver"
	"github.com/xadm/relay/internal/tools/demo"
)

// receiverDelay is what each request costs the receiver.
const receiverDelay = 2 * time.Millisecond

func main() {
	os.Exit(run())
}

func run() int {
	messages := flag.Int("messages", 3000, "messages to write in each run")
	flag.Parse()
	if *messages < 1 {
		fmt.Fprintln(os.Stderr, "-messages must be at least 1")
		return 2
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	context.AfterFunc(ctx, stop) // a second Ctrl-C kills at once

	out := demo.NewProgress(os.Stdout)
	begin := time.Now()
	results, err := runDemo(ctx, out, *messages)
	switch {
	case ctx.Err() != nil:
		out.Printf("\ninterrupted; everything the demo started is stopped")
		return 1
	case err != nil:
		out.Printf("\ndemo failed: %v", err)
		return 1
	}

	guarded, unguarded := results[0], results[1]
	ok := guarded.OK() && guarded.Counts.Duplicates == 0
	if ok {
		out.Printf("\nWith the election, the receiver saw every message exactly once through %d rolls.", guarded.Rolls)
	} else {
		out.Printf("\nWith the election, the receiver saw %d duplicates, and %d messages never arrived.",
			guarded.Counts.Duplicates, guarded.Lost)
	}
	if d := unguarded.Counts.Duplicates; d > 0 {
		out.Printf("Without it (ClusterLock = false), it saw %d duplicate deliveries for %d messages:", d, unguarded.Written)
		out.Printf("the avoidable duplication that decision 0035 removes.")
	} else {
		out.Printf("Without it (ClusterLock = false) it saw no duplicate this time: the replicas happened not to overlap.")
	}
	verdict := "PASS"
	if !ok {
		verdict = "FAIL: the guarded run duplicated or lost messages"
	}
	out.Printf("\n%s (%.1fs in all)", verdict, time.Since(begin).Seconds())
	if !ok {
		return 1
	}
	return 0
}

// runDemo starts the database and runs both scenarios.
func runDemo(ctx context.Context, out *demo.Progress, messages int) ([]demo.Result, error) {
	out.Printf("Starting a throwaway PostgreSQL (DATABASE_URL, else the local binaries)…")
	t0 := time.Now()
	server, err := pgserver.Start(ctx, "DATABASE_URL")
	if err != nil {
		return nil, err
	}
	defer func() {
		if serr := server.Stop(); serr != nil {
			out.Printf("stopping PostgreSQL: %v", serr)
		}
	}()
	out.Printf("PostgreSQL ready (%s) in %.1fs.", server.Kind, time.Since(t0).Seconds())

	// Relay errors go to the output, above the live line; warnings are the
	// expected noise of the unguarded run (outcomes a second replica could not record).
	logger := slog.New(demo.Hushed(ctx, slog.NewTextHandler(out, &slog.HandlerOptions{Level: slog.LevelError})))
	return demo.Run(ctx, demo.Options{
		App:       "relay-demo", // one election key, "relay-demo_relay_m2m", for all three
		Tables:    "relay_demo",
		Title:     fmt.Sprintf("a receiver that spends %s on each", receiverDelay),
		Start:     demo.StartHTTP(receiverDelay),
		Dropped:   "reached no receiver and were retried",
		Params:    demo.DefaultParams(messages),
		DBURL:     server.URL,
		Out:       out,
		Logger:    logger,
		Unguarded: true,
	})
}
