// Command soak runs several replicas of one app's relay against one outbox
// table while a producer writes messages and a fault injector kills the
// replicas' database sessions at random (the election's holder and others),
// and the receiver fails for seconds at a time, then drains and reports what
// the destination saw: rows written, delivered, duplicates with their cause,
// order breaks and lost rows, which must be none.
//
//	go run ./cmd/soak -duration 60s -replicas 4 -rate 200
//
// It gets a throwaway PostgreSQL of its own (the server at DATABASE_URL if that
// is set, else a container or the local binaries: see internal/testkit/pgserver) and a
// table and app name of its own, and delivers through [relay.HTTPSender] to an
// HTTP receiver of its own on 127.0.0.1, which counts the deliveries of each
// message by its Relay-Message-Id header.
//
// It is bounded: it writes and injects faults for -duration (at most 30m),
// then drains for at most -drain, stops the replicas with a bounded context
// and prints the report. It exits 1 when a row was lost (written, never
// delivered) or left undelivered, a duplicate has no fault to explain it, a
// key's order was broken, or a stopped replica left the election held; 2
// when it could not run.
//
// A duplicate is explained when the previous delivery of the message was in
// flight at a fault on the replica that made it: the fault came within -window
// of that send (a pooled session killed while idle is found dead on its next
// use, up to a second later), and the relay's own log says why when it can
// ("outcome not recorded", "send interrupted"). With -kill-every 0 there are no
// faults and every duplicate is unexplained: the guard must deliver each row
// exactly once.
//
// The producer writes two types, order and ledger, each to a path of its own
// on the receiver; of the -keys keys, order writes the first two thirds and
// ledger the last two, so that the middle third gets both. Every
// -outage-every (8s) the receiver fails for -outage-for (3s), answering 503
// to order alone (ledger drains meanwhile), to ledger alone, then to both,
// in turn: the replicas pause the failing types (PauseAfter 5, the default)
// and resume them with a probe. MaxAttempts is a million: no message may die
// of an outage. The run fails when the outages paused no type.
//
// With -partitions N (Config.Partitions) the replicas deliver at once, each
// the keys of the partitions it holds; a fault on the election's holder is
// then one on any member's session. Either way the receiver checks each
// key's order, across both types: a message received after a later one of
// its key is a failure, faults or not, unless it is a re-delivery of a
// message received before (at-least-once re-delivers what was in flight at a
// fault; its first delivery kept the order).
//
//	go run ./cmd/soak -duration 60s -replicas 4 -partitions 16 -roll-every 5s
//
// go test ./cmd/soak runs a short soak (TestSoak).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/xadm/relay/internal/testkit/pgserver"
)

// options are the command's flags.
type options struct {
	duration    time.Duration
	replicas    int
	rate        int
	killEvery   time.Duration
	rollEvery   time.Duration
	outageEvery time.Duration
	outageFor   time.Duration
	concurrency int
	batch       int
	interval    time.Duration
	sendDelay   time.Duration
	keys        int
	drain       time.Duration
	window      time.Duration
	seed        uint64
	logPath     string
	quiet       bool
	clusterLock bool
	partitions  int
}

func parseFlags(args []string) (options, error) {
	var o options
	fs := flag.NewFlagSet("soak", flag.ContinueOnError)
	fs.DurationVar(&o.duration, "duration", 60*time.Second, "how long to write messages and inject faults (at most 30m)")
	fs.IntVar(&o.replicas, "replicas", 4, "relay replicas of the one app, each with its own pool (1-32)")
	fs.IntVar(&o.rate, "rate", 200, "messages written per second (1-5000)")
	fs.DurationVar(&o.killEvery, "kill-every", 2*time.Second, "mean time between two killed sessions; 0 injects no fault")
	fs.DurationVar(&o.rollEvery, "roll-every", 0, "also restart one replica (graceful Stop, fresh pool) this often; 0 never")
	fs.DurationVar(&o.outageEvery, "outage-every", 8*time.Second, "make the receiver fail (503) this often, in turn order, ledger, then both; 0 never")
	fs.DurationVar(&o.outageFor, "outage-for", 3*time.Second, "how long each outage of the receiver lasts")
	fs.IntVar(&o.concurrency, "concurrency", 2, "Config.Concurrency of each replica")
	fs.IntVar(&o.batch, "batch", 50, "Config.BatchSize of each replica")
	fs.DurationVar(&o.interval, "interval", 50*time.Millisecond, "Config.Interval of each replica")
	fs.DurationVar(&o.sendDelay, "send-delay", 2*time.Millisecond, "what each request costs the receiver")
	fs.IntVar(&o.keys, "keys", 500, "distinct natural keys the producer writes")
	fs.DurationVar(&o.drain, "drain", 30*time.Second, "the most to wait, after writing stops, for every row to be delivered")
	fs.DurationVar(&o.window, "window", 2*time.Second, "how close to a send a fault on its replica must be to explain its duplicate")
	fs.Uint64Var(&o.seed, "seed", 0, "seed of the fault injector and the producer's keys; 0 picks one")
	fs.StringVar(&o.logPath, "log", "", "write the relays' logs (JSON, Debug and up) to this file; by default they are only counted")
	fs.BoolVar(&o.quiet, "q", false, "no progress lines on stderr")
	fs.BoolVar(&o.clusterLock, "cluster-lock", true, "Config.ClusterLock; false shows the avoidable duplicates the election removes (and fails)")
	fs.IntVar(&o.partitions, "partitions", 1, "Config.Partitions of each replica: above 1, the replicas deliver at once, each its partitions' keys")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	var errs []error
	check := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf(format, args...))
		}
	}
	check(o.duration > 0 && o.duration <= 30*time.Minute, "-duration must be in (0, 30m], got %s", o.duration)
	check(o.replicas >= 1 && o.replicas <= 32, "-replicas must be between 1 and 32, got %d", o.replicas)
	check(o.rate >= 1 && o.rate <= 5000, "-rate must be between 1 and 5000, got %d", o.rate)
	check(o.killEvery == 0 || o.killEvery >= 50*time.Millisecond, "-kill-every must be 0 or at least 50ms, got %s", o.killEvery)
	check(o.rollEvery == 0 || o.rollEvery >= 100*time.Millisecond, "-roll-every must be 0 or at least 100ms, got %s", o.rollEvery)
	check(o.outageEvery == 0 || o.outageEvery >= 100*time.Millisecond, "-outage-every must be 0 or at least 100ms, got %s", o.outageEvery)
	check(o.outageFor > 0 && o.outageFor <= time.Minute, "-outage-for must be in (0, 1m], got %s", o.outageFor)
	check(o.concurrency >= 1 && o.concurrency <= 64, "-concurrency must be between 1 and 64, got %d", o.concurrency)
	check(o.batch >= 1 && o.batch <= 1000, "-batch must be between 1 and 1000, got %d", o.batch)
	check(o.interval > 0 && o.interval <= time.Minute, "-interval must be in (0, 1m], got %s", o.interval)
	check(o.sendDelay >= 0 && o.sendDelay <= time.Second, "-send-delay must be in [0, 1s], got %s", o.sendDelay)
	check(o.keys >= 1, "-keys must be at least 1, got %d", o.keys)
	check(o.drain > 0 && o.drain <= 10*time.Minute, "-drain must be in (0, 10m], got %s", o.drain)
	check(o.window >= 0, "-window must not be negative, got %s", o.window)
	check(o.partitions >= 1 && o.partitions <= 4096, "-partitions must be between 1 and 4096, got %d", o.partitions)
	check(o.partitions == 1 || o.clusterLock, "-partitions above 1 needs -cluster-lock (the partitions are elections)")
	if o.seed == 0 {
		o.seed = rand.Uint64()
	}
	return o, errors.Join(errs...)
}

func main() {
	o, err := parseFlags(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(2)
	}
	os.Exit(run(o))
}

// run runs the soak and prints its report; it returns the exit code.
func run(o options) int {
	// Bounded whatever happens: writing, draining, stopping, with room to spare.
	ctx, cancel := context.WithTimeout(context.Background(), o.duration+o.drain+2*time.Minute)
	defer cancel()
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()

	startCtx, cancelStart := context.WithTimeout(ctx, 2*time.Minute)
	srv, err := pgserver.Start(startCtx, "DATABASE_URL")
	cancelStart()
	if err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		return 2
	}
	defer srv.Stop()

	rep, err := soakOn(ctx, o, srv)
	if err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		return 2
	}
	rep.print(os.Stdout)
	if !rep.ok() {
		return 1
	}
	return 0
}

// soakOn runs one soak on srv and returns its report; an error says it
// could not run.
func soakOn(ctx context.Context, o options, srv *pgserver.Server) (*report, error) {
	s, err := newSoak(ctx, o, srv)
	if err != nil {
		return nil, err
	}
	defer s.close()
	return s.run(ctx)
}
