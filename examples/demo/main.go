// Command demo shows the relay's instance election at work, with one command
// and nothing to set up:
//
//	go run ./examples/demo
//
// It gets a throwaway PostgreSQL by itself (DATABASE_URL if set, else the
// local PostgreSQL binaries), starts an HTTP receiver on 127.0.0.1 that counts the deliveries
// of each natural key, and runs three replicas of one app in this process,
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

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/xadm/relay/internal/pgserver"
)

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

	out := newProgress(os.Stdout)
	begin := time.Now()
	guarded, unguarded, err := demo(ctx, out, *messages)
	switch {
	case ctx.Err() != nil:
		out.printf("\ninterrupted; everything the demo started is stopped")
		return 1
	case err != nil:
		out.printf("\ndemo failed: %v", err)
		return 1
	}

	ok := guarded.counts.duplicates == 0 && guarded.lost == 0 && guarded.notSent == 0 &&
		guarded.counts.distinct == guarded.written
	if ok {
		out.printf("\nWith the election, the receiver saw every message exactly once through %d rolls.", guarded.rolls)
	} else {
		out.printf("\nWith the election, the receiver saw %d duplicates, and %d messages never arrived.",
			guarded.counts.duplicates, guarded.lost)
	}
	if d := unguarded.counts.duplicates; d > 0 {
		out.printf("Without it (ClusterLock = false), it saw %d duplicate deliveries for %d messages:", d, unguarded.written)
		out.printf("the avoidable duplication that decision 0035 removes.")
	} else {
		out.printf("Without it (ClusterLock = false) it saw no duplicate this time: the replicas happened not to overlap.")
	}
	verdict := "PASS"
	if !ok {
		verdict = "FAIL: the guarded run duplicated or lost messages"
	}
	out.printf("\n%s (%.1fs in all)", verdict, time.Since(begin).Seconds())
	if !ok {
		return 1
	}
	return 0
}

// demo starts the database and runs both scenarios.
func demo(ctx context.Context, out *progress, messages int) (guarded, unguarded result, err error) {
	out.printf("Starting a throwaway PostgreSQL (DATABASE_URL, else the local binaries)…")
	t0 := time.Now()
	server, err := pgserver.Start(ctx, "DATABASE_URL")
	if err != nil {
		return guarded, unguarded, err
	}
	defer func() {
		if serr := server.Stop(); serr != nil {
			out.printf("stopping PostgreSQL: %v", serr)
		}
	}()
	out.printf("PostgreSQL ready (%s) in %.1fs.", server.Kind, time.Since(t0).Seconds())

	admin, err := pgxpool.New(ctx, server.URL)
	if err != nil {
		return guarded, unguarded, err
	}
	defer admin.Close()

	p := params{
		messages:    messages,
		txSize:      10,
		writeFor:    5 * time.Second,
		replicas:    3,
		rolls:       6,
		concurrency: 4,
		interval:    50 * time.Millisecond,
		delay:       2 * time.Millisecond,
		deadline:    30 * time.Second,
	}
	// Relay errors go to the output, above the live line; warnings are the
	// expected noise of the unguarded run (outcomes a second replica could not record).
	logger := slog.New(hushed{slog.NewTextHandler(out, &slog.HandlerOptions{Level: slog.LevelError}), ctx})
	newScenario := func(name string, guardedRun bool, table string) *scenario {
		return &scenario{name: name, guarded: guardedRun, table: table, p: p, dbURL: server.URL,
			admin: admin, out: out, logger: logger}
	}

	out.printf("\n1. Guarded: %d replicas of app %q (ClusterLock = true) deliver %d messages", p.replicas, appName, p.messages)
	out.printf("   to a receiver that spends %s on each; a replica is rolled every %s.", p.delay, (p.writeFor / time.Duration(p.rolls+1)).Round(time.Millisecond))
	// A server the demo started goes away whole; in one given by DATABASE_URL, drop the demo's tables.
	cleanup := func(s *scenario) {
		if server.Kind == "env" {
			dropTable(s)
		}
	}
	s := newScenario("guarded", true, "relay_demo_guarded")
	defer cleanup(s)
	if guarded, err = s.run(ctx); err != nil {
		return guarded, unguarded, err
	}
	report(out, guarded)

	out.printf("\n2. Unguarded: the same with ClusterLock = false (the escape hatch), on a fresh table.")
	s = newScenario("unguarded", false, "relay_demo_unguarded")
	defer cleanup(s)
	if unguarded, err = s.run(ctx); err != nil {
		return guarded, unguarded, err
	}
	report(out, unguarded)
	return guarded, unguarded, nil
}

// dropTable removes a scenario's table.
func dropTable(s *scenario) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.dropTable(ctx); err != nil {
		s.out.printf("dropping %s: %v", s.table, err)
	}
}

// report prints one run's result.
func report(out *progress, r result) {
	c := r.counts
	out.printf("  written     %6d messages, in transactions of 10", r.written)
	out.printf("  delivered   %6d distinct keys, as the receiver counted them (%d PUTs)", c.distinct, c.requests)
	out.printf("  duplicates  %6d PUTs of a key already received", c.duplicates)
	out.printf("  lost        %6d written but never received", r.lost)
	var recorded int64
	for _, p := range r.pods {
		recorded += p.Sent
	}
	out.printf("  recorded    %6d SENT by the relays (sum of Stats().Sent); rows not SENT in the table: %d", recorded, r.notSent)
	out.printf("  throughput  %6.0f msg/s, the writer's pace: the last message arrived %dms after it was written",
		float64(c.distinct)/r.took.Seconds(), r.catchUp.Milliseconds())
	for _, p := range r.pods {
		out.printf("  %s  %d starts  passes: %4d run, %4d coalesced  sent %5d", p.name, p.starts,
			p.PassesElected, p.PassesCoalesced, p.Sent)
	}
}

// hushed drops log records once ctx is done: a Ctrl-C in a terminal reaches a
// local PostgreSQL too, and the relays' complaints about it say nothing new.
type hushed struct {
	slog.Handler
	ctx context.Context
}

func (h hushed) Enabled(ctx context.Context, l slog.Level) bool {
	return h.ctx.Err() == nil && h.Handler.Enabled(ctx, l)
}
func (h hushed) WithAttrs(as []slog.Attr) slog.Handler { return hushed{h.Handler.WithAttrs(as), h.ctx} }
func (h hushed) WithGroup(name string) slog.Handler    { return hushed{h.Handler.WithGroup(name), h.ctx} }
