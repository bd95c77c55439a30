// Command natsbench measures how fast the relay delivers a backlog to NATS
// JetStream through natsjs, beside a no-op sink in the same run:
//
//	cd natsjs && go run ./cmd/natsbench                 # 20,000 rows, 3 rounds, about a minute
//	go run ./cmd/natsbench -rows 50000 -rounds 5 -storage memory
//	go run ./cmd/natsbench -rtt 1ms                     # as across a network: 1ms more per round trip
//
// It uses the PostgreSQL in DATABASE_URL if that is set, and otherwise starts a
// throwaway local cluster with PostgreSQL's durability defaults (as
// cmd/relaybench does), and an embedded nats-server with JetStream in this
// process (file storage in a temporary directory, unless -storage memory).
//
// Each run loads -rows PENDING rows (one natural key each) into a fresh outbox
// table and drains them through the periodic tick (Start … Stop, the path
// production uses) with BatchSize -batch, into one of three destinations:
//
//	no-op      a relay.Sender whose Send returns nil: the relay's own ceiling
//	nats       the natsjs.Sender as it is, a relay.BatchSender: when the engine
//	           hands it whole batches, one round trip per batch
//	nats-sync  the same sender wrapped so that only Send shows: one publish and
//	           one acknowledgement per message
//
// each with the default outcomes (one short transaction per message) and with
// GroupOutcomes = -group. Its rate is rows over the time from Start to the last
// recorded outcome; every run checks that all rows are SENT and that the stream
// holds one message per row. The table shows the median of -rounds rounds
// (the runs of a round are interleaved, so drift hits them alike), each rate's
// ratio to the no-op sink with the same outcomes, and nats' ratio to nats-sync.
// The targets of issue 10: nats ≥ 0.7 × no-op with grouped outcomes at
// BatchSize 1000, and nats ≥ 5 × nats-sync.
//
// With -rtt, the relay reaches the server through a proxy that delays every
// byte by half that much each way, as a network between them would: one
// round trip per message then weighs what it weighs in production.
//
// The last line says whether the engine called SendBatch: while it calls Send
// only, "nats" is per-message too and equals "nats-sync".
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/xadm/relay"
	"github.com/xadm/relay/internal/testkit/pgserver"
	"github.com/xadm/relay/internal/tools/benchkit"
	"github.com/xadm/relay/natsjs"
)

var (
	drainFlags  = benchkit.RegisterDrainFlags(nil, 20_000, 1000, 3)
	rowsFlag    = drainFlags.Rows
	batchFlag   = drainFlags.Batch
	roundsFlag  = drainFlags.Rounds
	concFlag    = drainFlags.Concurrency
	groupFlag   = flag.Int("group", 1000, "Config.GroupOutcomes of the grouped runs")
	storageFlag = flag.String("storage", "file", "JetStream storage of the stream: file or memory")
	rttFlag     = flag.Duration("rtt", 0, "round-trip time added between the relay and the server, as a network would (0: none, the server is in-process)")
)

const benchType = "bench"

func main() {
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "natsbench:", err)
		os.Exit(1)
	}
}

// destination is where a run delivers.
type destination struct {
	name  string
	label string
}

var destinations = []destination{
	{"no-op", "no-op sink"},
	{"nats", "nats (BatchSender)"},
	{"nats-sync", "nats per-message sync"},
}

// outcomes is how a run records outcomes.
type outcomes struct {
	name  string
	group int
}

func run(ctx context.Context) error {
	if err := drainFlags.Check(); err != nil {
		return err
	}
	if *groupFlag < 0 {
		return fmt.Errorf("-group must not be negative, got %d", *groupFlag)
	}
	storage := jetstream.FileStorage
	switch *storageFlag {
	case "file":
	case "memory":
		storage = jetstream.MemoryStorage
	default:
		return fmt.Errorf("-storage %q: want file or memory", *storageFlag)
	}

	sctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	pg, err := pgserver.StartWith(sctx, "DATABASE_URL", pgserver.Options{Durable: true})
	cancel()
	if err != nil {
		return err
	}
	defer pg.Stop()

	ns, err := startNATS()
	if err != nil {
		return err
	}
	defer func() {
		ns.Shutdown()
		ns.WaitForShutdown()
	}()
	url := ns.ClientURL()
	if *rttFlag > 0 {
		proxy, err := startLatencyProxy(ns.Addr().String(), *rttFlag/2)
		if err != nil {
			return err
		}
		defer proxy.Close()
		url = "nats://" + proxy.Addr()
	}
	nc, err := nats.Connect(url)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(time.Minute))
	if err != nil {
		return err
	}
	sender, err := natsjs.New(js, natsjs.Config{Type: benchType})
	if err != nil {
		return err
	}
	var calls benchkit.Calls // how the engine called the sender
	counted := benchkit.Counted(sender, &calls)

	rtt, err := measureRTT(nc)
	if err != nil {
		return err
	}

	fmt.Printf("natsbench: %d rows per run, BatchSize %d, Concurrency %d, %d rounds (medians); %s, %d CPUs\n",
		*rowsFlag, *batchFlag, *concFlag, *roundsFlag, runtime.Version(), runtime.NumCPU())
	fmt.Printf("PostgreSQL: %s (durable settings unless DATABASE_URL); nats-server %s embedded, JetStream %s storage; added round trip %s, measured %s (median PING/PONG)\n\n",
		pg.Kind, server.VERSION, *storageFlag, *rttFlag, rtt.Round(time.Microsecond))

	if err := senderAlone(ctx, js, storage, sender); err != nil {
		return err
	}

	modes := []outcomes{{"default", 0}, {fmt.Sprintf("group %d", *groupFlag), *groupFlag}}
	rates := make(map[string][]float64)
	seq := 0
	for round := range *roundsFlag {
		for _, o := range modes {
			for _, d := range destinations {
				seq++
				var s relay.Sender
				switch d.name {
				case "no-op":
					s = benchkit.Noop(benchType)
				case "nats":
					s = counted
				case "nats-sync":
					s = benchkit.PerMessage(sender)
				}
				rate, err := drain(ctx, pg.URL, js, storage, fmt.Sprintf("natsbench_%d", seq), o.group, d.name != "no-op", s)
				if err != nil {
					return fmt.Errorf("round %d, %s, %s: %w", round+1, o.name, d.name, err)
				}
				key := o.name + "/" + d.name
				rates[key] = append(rates[key], rate)
				fmt.Fprintf(os.Stderr, "round %d  %-10s %-10s %9.0f msg/s\n", round+1, o.name, d.name, rate)
			}
		}
	}
	fmt.Fprintln(os.Stderr)

	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "outcomes\tdestination\tmsg/s\t× no-op\t× nats-sync\truns (msg/s)\t")
	for _, o := range modes {
		noop := benchkit.Median(rates[o.name+"/no-op"])
		sync := benchkit.Median(rates[o.name+"/nats-sync"])
		for _, d := range destinations {
			rs := rates[o.name+"/"+d.name]
			m := benchkit.Median(rs)
			vsSync := ""
			if d.name != "no-op" {
				vsSync = fmt.Sprintf("%.2f", m/sync)
			}
			runs := make([]string, len(rs))
			for i, r := range rs {
				runs[i] = fmt.Sprintf("%.0f", r)
			}
			fmt.Fprintf(tw, "%s\t%s\t%.0f\t%.2f\t%s\t%s\t\n", o.name, d.label, m, m/noop, vsSync, strings.Join(runs, " "))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	g := modes[1].name
	fmt.Printf("\ntargets (issue 10): nats ≥ 0.70 × no-op with %s: %.2f; nats ≥ 5 × nats-sync: %.2f\n",
		g, benchkit.Median(rates[g+"/nats"])/benchkit.Median(rates[g+"/no-op"]), benchkit.Median(rates[g+"/nats"])/benchkit.Median(rates[g+"/nats-sync"]))
	batches, msgs, sends := calls.Batches.Load(), calls.Batched.Load(), calls.Sends.Load()
	if batches > 0 {
		fmt.Printf("the engine called SendBatch %d times (%.0f messages a call on average) and Send %d times\n",
			batches, float64(msgs)/float64(batches), sends)
	} else {
		fmt.Printf("the engine called Send only (%d times), never SendBatch: \"nats\" was per-message too, as \"nats-sync\"\n", sends)
	}
	return nil
}

// senderAlone prints the sender's own rates, without database or relay:
// -rows messages through SendBatch in calls of -batch, and through Send one at
// a time, medians of -rounds. It is what the relay's rates tend to once the
// engine hands the sender whole batches.
func senderAlone(ctx context.Context, js jetstream.JetStream, storage jetstream.StorageType, s *natsjs.Sender) error {
	n, batch := *rowsFlag, *batchFlag
	var batched, single []float64
	id := int64(0)
	for range *roundsFlag {
		for _, mode := range []string{"batch", "single"} {
			if err := js.DeleteStream(ctx, "BENCH"); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
				return err
			}
			if _, err := js.CreateStream(ctx, jetstream.StreamConfig{
				Name: "BENCH", Subjects: []string{natsjs.SubjectPrefixDefault + ".>"}, Storage: storage, Duplicates: 2 * time.Minute,
			}); err != nil {
				return err
			}
			ms := make([]relay.Message, n)
			for i := range ms {
				id++
				ms[i] = relay.Message{ID: id, Type: benchType, Key: fmt.Sprintf("key-%d", i),
					Payload: fmt.Appendf(nil, `{"n": %d, "text": "%s"}`, i, strings.Repeat("x", 64))}
			}
			rate, err := benchkit.SenderAlone(ctx, s, ms, batch, mode == "batch")
			if err != nil {
				return fmt.Errorf("sender alone, %s: %w", mode, err)
			}
			if mode == "batch" {
				batched = append(batched, rate)
			} else {
				single = append(single, rate)
			}
		}
	}
	b, one := benchkit.Median(batched), benchkit.Median(single)
	fmt.Printf("sender alone (no database): SendBatch of %d: %.0f msg/s; Send one at a time: %.0f msg/s; ratio %.1f\n\n",
		batch, b, one, b/one)
	return nil
}

// measureRTT is the median of 21 PING/PONG round trips to the server.
func measureRTT(nc *nats.Conn) (time.Duration, error) {
	var rtts []float64
	for range 21 {
		d, err := nc.RTT()
		if err != nil {
			return 0, err
		}
		rtts = append(rtts, float64(d))
	}
	return time.Duration(benchkit.Median(rtts)), nil
}

// startNATS starts an embedded JetStream server on a free port of 127.0.0.1.
func startNATS() (*server.Server, error) {
	dir, err := os.MkdirTemp("", "natsbench-")
	if err != nil {
		return nil, err
	}
	ns, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true, StoreDir: dir, NoLog: true, NoSigs: true,
	})
	if err != nil {
		return nil, err
	}
	go ns.Start()
	if !ns.ReadyForConnections(30 * time.Second) {
		ns.Shutdown()
		return nil, errors.New("the embedded NATS server did not accept connections within 30s")
	}
	return ns, nil
}

// drain loads a fresh table and delivers it through s, returning the rate.
func drain(ctx context.Context, url string, js jetstream.JetStream, storage jetstream.StorageType,
	table string, group int, toNATS bool, s relay.Sender) (float64, error) {
	n := *rowsFlag
	pool, err := benchkit.Pool(ctx, url, "natsbench", int32(*concFlag+2))
	if err != nil {
		return 0, err
	}
	defer pool.Close()
	t := pgx.Identifier{table}.Sanitize()
	if _, err := pool.Exec(ctx, `DROP TABLE IF EXISTS `+t); err != nil {
		return 0, err
	}
	defer pool.Exec(context.WithoutCancel(ctx), `DROP TABLE IF EXISTS `+t) //nolint:errcheck
	if err := relay.CreateTable(ctx, pool, table); err != nil {
		return 0, err
	}
	if _, err := pool.Exec(ctx, `INSERT INTO `+t+` (type, natural_key, payload)
		SELECT $2, 'key-' || i, jsonb_build_object('n', i, 'text', repeat('x', 64)) FROM generate_series(1, $1) i`,
		n, benchType); err != nil {
		return 0, err
	}
	if _, err := pool.Exec(ctx, `VACUUM ANALYZE `+t); err != nil {
		return 0, err
	}
	if toNATS {
		// A fresh stream per run: the same size of store for every run.
		if err := js.DeleteStream(ctx, "BENCH"); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			return 0, err
		}
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{
			Name: "BENCH", Subjects: []string{natsjs.SubjectPrefixDefault + ".>"}, Storage: storage, Duplicates: 2 * time.Minute,
		}); err != nil {
			return 0, err
		}
	}

	obs := benchkit.NewDrainObserver(int64(n))
	cfg := relay.DefaultConfig()
	cfg.AppName = table
	cfg.Table = table
	cfg.BatchSize = *batchFlag
	cfg.Concurrency = *concFlag
	cfg.GroupOutcomes = group
	cfg.Logger = slog.New(slog.DiscardHandler)
	cfg.Observer = obs
	r, err := relay.New(pool, cfg, s)
	if err != nil {
		return 0, err
	}
	start := time.Now()
	if err := benchkit.Drain(ctx, r, obs); err != nil {
		return 0, err
	}
	elapsed := obs.Last().Sub(start)

	var sent int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM `+t+` WHERE status = 'SENT'`).Scan(&sent); err != nil {
		return 0, err
	}
	if sent != n || obs.Failed.Load() != 0 {
		return 0, fmt.Errorf("%d rows SENT and %d failures, want %d and 0", sent, obs.Failed.Load(), n)
	}
	if toNATS {
		st, err := js.Stream(ctx, "BENCH")
		if err != nil {
			return 0, err
		}
		info, err := st.Info(ctx)
		if err != nil {
			return 0, err
		}
		if info.State.Msgs != uint64(n) {
			return 0, fmt.Errorf("the stream holds %d messages, want %d", info.State.Msgs, n)
		}
	}
	return float64(n) / elapsed.Seconds(), nil
}
