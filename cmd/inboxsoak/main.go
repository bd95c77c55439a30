// Command inboxsoak proves the relay and the inbox together, end to end,
// under faults: a producer writes messages of two types for a few hundred
// keys to an outbox in one PostgreSQL; relay replicas (processes of their
// own, under the election) deliver them by HTTP, through a proxy, to a
// receiver (a process of its own) built on two inboxes, which applies each
// to a second PostgreSQL:
//
//   - order (PUT /order/{key}) carries a key's whole state: the receiver
//     keeps each key's newest, with the inbox's stale-drop;
//   - ledger (PUT /ledger/{key}) carries an amount: the receiver adds it to
//     its key's sum, with the inbox's KeepStale, so that every message must
//     take effect exactly once and none may be dropped as stale.
//
// Of the -keys keys, order writes the first two thirds and ledger the last
// two: the middle third gets both, and a key's order is one across its
// types. Meanwhile it injects, in turn:
//
//   - the elected relay killed -9 mid-send, and a new replica started;
//   - order paused while ledger drains: the receiver answers 503 to order for
//     -fail-for (3s), long enough for the relays to pause the type (after
//     PauseAfter, 5, failures in a row; RetryBackoff is 0), and a burst of
//     -burst ledger messages is written midway, which drains meanwhile but
//     for its keys whose older order messages wait;
//   - the receiver killed -9 after its commit and before its answer;
//   - the connections between the relays and the receiver cut silently (no
//     FIN), what the relays sent on them delivered to the receiver later;
//   - the receiver failing: it answers 503 to every type for -fail-for;
//   - the receiver's database restarted (an immediate shutdown);
//   - a failover: the elected relay stopped gracefully, another takes over.
//
// Then it drains and checks: every message's effect exactly once; no order
// break: each key's effects, both types together, applied in id order (the
// receiver takes a key's row before it records an effect, so the effects'
// sequence is the order they were applied in); no order message answered
// stale without ever being applied; every order key's final state its
// newest message and every ledger key's sum the sum of its amounts; every
// row SENT; each fault injected, and the pause fault seen to pause order
// (the relays' "type paused" log lines). Beside them it counts the relay's
// re-deliveries, which still happen: the inbox answers them as duplicates or
// stale. On a failure it prints the timeline of the keys concerned: each
// message's write, row, effect and answers.
//
//	go run ./cmd/inboxsoak                      # 60s of faults
//	go run ./cmd/inboxsoak -duration 90s -log /tmp/soak.log -trace
//	go run ./cmd/inboxsoak -duration 10m -rate 300 -fault-every 2s
//
// With -purge-age the receiver's Scheduler purges order's inbox records
// older than that every second, so that a late re-delivery finds no record
// and the stale-drop alone keeps it from being applied again. Ledger's are
// never purged: with KeepStale its records alone keep a message to one
// effect.
//
// The outbox's PostgreSQL is DATABASE_URL if set, else a local cluster; the
// receiver's is always a local cluster of its own, which it restarts. It
// exits 0 when the run passes, 1 when it fails, 2 when it could not run.
// go test ./cmd/inboxsoak runs a short soak (TestInboxSoak).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/xadm/relay"
	"github.com/xadm/relay/internal/testkit/pgserver"
)

// options are the command's flags.
type options struct {
	duration    time.Duration
	rate        int
	keys        int
	replicas    int
	faultEvery  time.Duration
	failFor     time.Duration
	burst       int
	drain       time.Duration
	purgeAge    time.Duration
	answerDelay time.Duration
	seed        uint64
	logPath     string
	trace       bool
	quiet       bool
}

func parseFlags(args []string) (options, error) {
	var o options
	fs := flag.NewFlagSet("inboxsoak", flag.ContinueOnError)
	fs.DurationVar(&o.duration, "duration", 60*time.Second, "how long to write messages and inject faults (at most 1h)")
	fs.IntVar(&o.rate, "rate", 200, "messages written per second (1-2000)")
	fs.IntVar(&o.keys, "keys", 300, "distinct natural keys the producer writes")
	fs.IntVar(&o.replicas, "replicas", 3, "relay replicas, each a process (1-8)")
	fs.DurationVar(&o.faultEvery, "fault-every", 2*time.Second, "time between two faults (at least 200ms)")
	fs.DurationVar(&o.failFor, "fail-for", 3*time.Second, "how long the receiver answers 503 in the faults that fail it (at least 500ms)")
	fs.IntVar(&o.burst, "burst", 300, "ledger messages written while order is paused, in one transaction")
	fs.DurationVar(&o.drain, "drain", 90*time.Second, "the most to wait, after writing stops, for every message to be applied")
	fs.DurationVar(&o.purgeAge, "purge-age", 0, "purge the inbox's records older than this every second; 0 never")
	fs.DurationVar(&o.answerDelay, "answer-delay", 5*time.Millisecond, "what the receiver does between its commit and its answer (at most 1s)")
	fs.Uint64Var(&o.seed, "seed", 0, "seed of the producer's keys and the first fault; 0 picks one")
	fs.StringVar(&o.logPath, "log", "", "write the children's logs to this file; by default only their tail is kept, for a failure")
	fs.BoolVar(&o.trace, "trace", false, "the children log each send and each request (to -log)")
	fs.BoolVar(&o.quiet, "q", false, "no progress lines")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	var errs []error
	check := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf(format, args...))
		}
	}
	check(o.duration > 0 && o.duration <= time.Hour, "-duration must be in (0, 1h], got %s", o.duration)
	check(o.rate >= 1 && o.rate <= 2000, "-rate must be between 1 and 2000, got %d", o.rate)
	check(o.keys >= 1, "-keys must be at least 1, got %d", o.keys)
	check(o.replicas >= 1 && o.replicas <= 8, "-replicas must be between 1 and 8, got %d", o.replicas)
	check(o.faultEvery >= 200*time.Millisecond, "-fault-every must be at least 200ms, got %s", o.faultEvery)
	check(o.failFor >= 500*time.Millisecond && o.failFor <= time.Minute, "-fail-for must be in [500ms, 1m], got %s", o.failFor)
	check(o.burst >= 0 && o.burst <= relay.EnqueueManyMax, "-burst must be between 0 and %d, got %d", relay.EnqueueManyMax, o.burst)
	check(o.drain > 0 && o.drain <= 10*time.Minute, "-drain must be in (0, 10m], got %s", o.drain)
	check(o.purgeAge >= 0, "-purge-age must not be negative, got %s", o.purgeAge)
	check(o.answerDelay >= 0 && o.answerDelay <= time.Second, "-answer-delay must be in [0, 1s], got %s", o.answerDelay)
	if o.seed == 0 {
		o.seed = rand.Uint64()
	}
	return o, errors.Join(errs...)
}

func main() {
	maybeChild()
	o, err := parseFlags(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "inboxsoak:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	out := io.Writer(os.Stderr)
	if o.quiet {
		out = io.Discard
	}
	rep, err := soakOnce(ctx, o, "DATABASE_URL", out)
	if err != nil {
		fmt.Fprintln(os.Stderr, "inboxsoak:", err)
		os.Exit(2)
	}
	rep.print(os.Stdout)
	if !rep.ok() {
		os.Exit(1)
	}
}

// soakOnce starts the two databases, runs one soak and returns its report.
// The outbox's database is envVar's URL if set; the receiver's is always a
// local cluster of its own.
func soakOnce(ctx context.Context, o options, envVar string, out io.Writer) (*report, error) {
	ctx, cancel := context.WithTimeout(ctx, o.duration+o.drain+3*time.Minute)
	defer cancel()
	startCtx, cancelStart := context.WithTimeout(ctx, 2*time.Minute)
	defer cancelStart()
	producer, err := pgserver.Start(startCtx, envVar)
	if err != nil {
		return nil, err
	}
	defer producer.Stop()
	receiver, err := pgserver.Start(startCtx, "")
	if err != nil {
		return nil, err
	}
	defer receiver.Stop()
	return soakOn(ctx, o, producer, receiver, out)
}

// soakOn runs one soak on the two servers.
func soakOn(ctx context.Context, o options, producer, receiver *pgserver.Server, out io.Writer) (*report, error) {
	s, err := newSoak(ctx, o, producer, receiver, out)
	if err != nil {
		return nil, err
	}
	defer s.close()
	if o.logPath != "" {
		f, err := os.Create(o.logPath)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		s.logs.mu.Lock()
		s.logs.file = f
		s.logs.mu.Unlock()
	}
	s.progress("soak %s: %d replicas, %d msg/s for %d keys, a fault every %s, seed %d", s.id, o.replicas, o.rate, o.keys, o.faultEvery, o.seed)
	rep, err := s.run(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w\nchildren's last logs:\n%s", err, s.logs)
	}
	if !rep.ok() {
		fmt.Fprintf(out, "children's last logs:\n%s\n", s.logs)
	}
	return rep, nil
}
