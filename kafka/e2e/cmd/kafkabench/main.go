// Command kafkabench measures how fast the relay delivers an outbox backlog to
// Kafka through the kafka package's Sender, beside a no-op sink in the same
// run:
//
//	cd kafka/e2e && go run ./cmd/kafkabench      # 20,000 rows, BatchSize 1000, 3 rounds: about a minute
//	go run ./cmd/kafkabench -rows 5000 -rounds 1 -concurrency 4
//
// It uses the server in DATABASE_URL if that is set, and otherwise starts a
// throwaway local cluster with PostgreSQL's durability defaults
// (pgserver.Options.Durable), as cmd/relaybench does. Kafka is kfake, the
// in-process Kafka of franz-go (3 brokers), sharing this process's CPU with
// the relay: a real cluster costs a network round trip more per produce
// request, and takes the broker's CPU off the relay's machine.
//
// Each round loads -rows PENDING rows (one key each, unless -keys says how
// many keys they share) into a fresh table, with BatchSize -batch, and drains
// them with direct passes (Relay.Run until every row is processed) to one of
// three destinations:
//
//	no-op sink           a Sender whose Send returns nil: the relay's own cost, the baseline
//	kafka (batch)        the kafka.Sender as it is, a relay.BatchSender: the engine may hand
//	                     it a whole batch in one SendBatch call
//	kafka (per message)  the same Sender wrapped so that only Send shows: one synchronous
//	                     produce, one broker round trip, per message
//
// each with the default outcomes (one short transaction per message) and with
// GroupOutcomes = -batch. Every destination and outcome mode runs once per
// round, in turn; the table shows the median rate of the rounds, its ratio to
// the no-op sink of the same outcome mode, and how the engine called the
// sender (Send or SendBatch, and how many messages per SendBatch), which says
// whether the engine in this build uses SendBatch at all.
//
// The targets: kafka (batch) with grouped outcomes at ≥ 0.7× the
// no-op sink, and ≥ 5× kafka (per message).
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
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/xadm/relay"
	"github.com/xadm/relay/internal/testkit/pgserver"
	"github.com/xadm/relay/internal/tools/benchkit"
	"github.com/xadm/relay/kafka"
)

var (
	drainFlags  = benchkit.RegisterDrainFlags(nil, 20000, 1000, 3) // -batch is also GroupOutcomes of the grouped runs
	rowsFlag    = drainFlags.Rows
	batchFlag   = drainFlags.Batch
	roundsFlag  = drainFlags.Rounds
	concFlag    = drainFlags.Concurrency
	keysFlag    = flag.Int("keys", 0, "distinct natural keys among the rows; 0: one per row")
	partsFlag   = flag.Int("partitions", 8, "partitions of each topic")
	payloadFlag = flag.Int("payload", 100, "bytes of padding in each message's JSON payload")
)

const msgType = "bench"

func main() {
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "kafkabench:", err)
		os.Exit(1)
	}
}

// destination is where a drain delivers.
type destination struct {
	name   string
	sender func(b *bench, topic string) (relay.Sender, func(), error)
}

var destinations = []destination{
	{"no-op sink", func(*bench, string) (relay.Sender, func(), error) {
		return benchkit.Noop(msgType), func() {}, nil
	}},
	{"kafka (batch)", func(b *bench, topic string) (relay.Sender, func(), error) {
		s, err := b.kafkaSender(topic)
		if err != nil {
			return nil, nil, err
		}
		return benchkit.Counted(s, &b.calls), s.Close, nil
	}},
	{"kafka (per message)", func(b *bench, topic string) (relay.Sender, func(), error) {
		s, err := b.kafkaSender(topic)
		if err != nil {
			return nil, nil, err
		}
		return benchkit.PerMessage(benchkit.Counted(s, &b.calls)), s.Close, nil
	}},
}

// outcomeModes are the values of Config.GroupOutcomes measured; -1 stands for -batch.
var outcomeModes = []struct {
	name  string
	group int
}{{"default", 0}, {"grouped", -1}}

// bench is one run's servers and counters.
type bench struct {
	srv     *pgserver.Server
	cluster *kfake.Cluster
	pool    *pgxpool.Pool
	calls   benchkit.Calls // how the engine called the Kafka sender during one drain
	tables  int
}

func (b *bench) kafkaSender(topic string) (*kafka.Sender, error) {
	return kafka.NewSender(kafka.Config{Type: msgType, Topic: topic, Brokers: b.cluster.ListenAddrs()})
}

// result is one drain's figures.
type result struct {
	rate  float64 // messages per second
	calls string
}

func run(ctx context.Context) error {
	if err := drainFlags.Check(); err != nil {
		return err
	}
	if *keysFlag < 0 || *partsFlag < 1 || *payloadFlag < 0 {
		return errors.New("-partitions must be at least 1; -keys and -payload at least 0")
	}
	sctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	srv, err := pgserver.StartWith(sctx, "DATABASE_URL", pgserver.Options{Durable: true})
	cancel()
	if err != nil {
		return err
	}
	defer srv.Stop()
	cluster, err := kfake.NewCluster()
	if err != nil {
		return err
	}
	defer cluster.Close()
	pool, err := benchkit.Pool(ctx, srv.URL, "kafkabench", int32(*concFlag+4))
	if err != nil {
		return err
	}
	defer pool.Close()
	b := &bench{srv: srv, cluster: cluster, pool: pool}

	keys := "one per row"
	if *keysFlag > 0 {
		keys = fmt.Sprint(*keysFlag)
	}
	fmt.Printf("kafkabench: %d rows (keys: %s, payload ~%d bytes), BatchSize %d, Concurrency %d, median of %d rounds\n",
		*rowsFlag, keys, *payloadFlag+20, *batchFlag, *concFlag, *roundsFlag)
	fmt.Printf("PostgreSQL: %s server; Kafka: kfake in-process, 3 brokers, %d partitions; %s, %d CPUs\n\n",
		srv.Kind, *partsFlag, runtime.Version(), runtime.NumCPU())

	rates := map[[2]int][]float64{} // [mode, destination] → rate of each round
	lastCalls := map[[2]int]string{}
	for round := range *roundsFlag {
		for mi, mode := range outcomeModes {
			for di, d := range destinations {
				res, err := b.drain(ctx, d, mode.group)
				if err != nil {
					return fmt.Errorf("round %d, %s, %s outcomes: %w", round+1, d.name, mode.name, err)
				}
				k := [2]int{mi, di}
				rates[k] = append(rates[k], res.rate)
				lastCalls[k] = res.calls
				fmt.Fprintf(os.Stderr, "round %d  %-8s %-20s %8.0f msg/s  %s\n", round+1, mode.name, d.name, res.rate, res.calls)
			}
		}
	}
	fmt.Fprintln(os.Stderr)

	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "outcomes\tdestination\tmsg/s\t× no-op sink\tthe engine called")
	medians := map[[2]int]float64{}
	for mi, mode := range outcomeModes {
		name := mode.name
		if mode.group < 0 {
			name = fmt.Sprintf("GroupOutcomes %d", *batchFlag)
		}
		for di, d := range destinations {
			k := [2]int{mi, di}
			medians[k] = benchkit.Median(rates[k])
			fmt.Fprintf(tw, "%s\t%s\t%.0f\t%.2f\t%s\n", name, d.name, medians[k], medians[k]/medians[[2]int{mi, 0}], lastCalls[k])
		}
	}
	tw.Flush()

	// The sender alone, without the relay: what SendBatch gives once the
	// engine hands it whole batches, whatever this build's engine does.
	var direct [2][]float64
	for range *roundsFlag {
		for i, batched := range []bool{true, false} {
			rate, err := b.senderAlone(ctx, batched)
			if err != nil {
				return fmt.Errorf("the sender alone: %w", err)
			}
			direct[i] = append(direct[i], rate)
		}
	}
	fmt.Printf("\nthe sender alone, no relay (%d messages): SendBatch of %d: %.0f msg/s; Send, one at a time: %.0f msg/s (%.1f×)\n",
		*rowsFlag, *batchFlag, benchkit.Median(direct[0]), benchkit.Median(direct[1]), benchkit.Median(direct[0])/benchkit.Median(direct[1]))

	fmt.Println()
	for mi, mode := range outcomeModes {
		batch, perMsg, sink := medians[[2]int{mi, 1}], medians[[2]int{mi, 2}], medians[[2]int{mi, 0}]
		fmt.Printf("%-8s outcomes: kafka (batch) = %.2f× the no-op sink, %.2f× kafka (per message)\n",
			mode.name, batch/sink, batch/perMsg)
	}
	g := len(outcomeModes) - 1
	batch, perMsg, sink := medians[[2]int{g, 1}], medians[[2]int{g, 2}], medians[[2]int{g, 0}]
	fmt.Printf("targets (grouped outcomes): ≥ 0.70× the no-op sink: %s; ≥ 5× per message: %s\n",
		verdict(batch >= 0.7*sink), verdict(batch >= 5*perMsg))
	return nil
}

func verdict(ok bool) string {
	if ok {
		return "met"
	}
	return "NOT met"
}

// drain loads a fresh backlog and delivers it to d, with GroupOutcomes group
// (-1: -batch), and returns the rate.
func (b *bench) drain(ctx context.Context, d destination, group int) (result, error) {
	b.tables++
	table := fmt.Sprintf("kafkabench_%d_%d", os.Getpid(), b.tables)
	topic := table
	if err := b.cluster.CreateTopic(topic, int32(*partsFlag), nil); err != nil {
		return result{}, err
	}
	if err := relay.CreateTable(ctx, b.pool, table); err != nil {
		return result{}, err
	}
	defer b.pool.Exec(context.WithoutCancel(ctx), "DROP TABLE "+pgx.Identifier{table}.Sanitize()) //nolint:errcheck // best effort
	key := "'key-' || g"
	if *keysFlag > 0 {
		key = fmt.Sprintf("'key-' || (g %% %d)", *keysFlag)
	}
	if _, err := b.pool.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (type, natural_key, payload)
		SELECT $1, %s, jsonb_build_object('n', g, 'pad', repeat('x', $2::int)) FROM generate_series(1, $3::int) g`,
		pgx.Identifier{table}.Sanitize(), key), msgType, *payloadFlag, *rowsFlag); err != nil {
		return result{}, err
	}
	if _, err := b.pool.Exec(ctx, "VACUUM ANALYZE "+pgx.Identifier{table}.Sanitize()); err != nil {
		return result{}, err
	}

	b.calls.Reset()
	s, closeSender, err := d.sender(b, topic)
	if err != nil {
		return result{}, err
	}
	defer closeSender()
	cfg := relay.DefaultConfig()
	cfg.AppName, cfg.Table = table, table
	cfg.BatchSize = *batchFlag
	cfg.Concurrency = *concFlag
	if group < 0 {
		group = *batchFlag
	}
	cfg.GroupOutcomes = group
	cfg.Logger = slog.New(slog.DiscardHandler)
	r, err := relay.New(b.pool, cfg, s)
	if err != nil {
		return result{}, err
	}

	start := time.Now()
	done := 0
	for done < *rowsFlag {
		n, err := r.Run(ctx)
		if err != nil {
			return result{}, err
		}
		if n == 0 {
			return result{}, fmt.Errorf("a pass found nothing to do after %d of %d rows", done, *rowsFlag)
		}
		done += n
	}
	elapsed := time.Since(start)
	res := result{rate: float64(*rowsFlag) / elapsed.Seconds(), calls: b.calls.String()}
	if d.name == destinations[0].name {
		res.calls = "Send (no-op)"
	}

	// Check what was measured: every row SENT, and one record per row.
	var sent int
	if err := b.pool.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{table}.Sanitize()+" WHERE status = 'SENT'").Scan(&sent); err != nil {
		return result{}, err
	}
	if sent != *rowsFlag {
		return result{}, fmt.Errorf("%d of %d rows SENT", sent, *rowsFlag)
	}
	if d.name != destinations[0].name {
		var records int64
		for _, p := range b.cluster.PartitionInfos(topic) {
			records += p.HighWatermark
		}
		if records != int64(*rowsFlag) {
			return result{}, fmt.Errorf("%d records on %s for %d rows", records, topic, *rowsFlag)
		}
	}
	if err := b.cluster.DeleteTopic(topic); err != nil {
		return result{}, err
	}
	return res, nil
}

// senderAlone produces -rows messages straight through a kafka.Sender, in
// SendBatch calls of -batch messages or one Send at a time, and returns the rate.
func (b *bench) senderAlone(ctx context.Context, batched bool) (float64, error) {
	b.tables++
	topic := fmt.Sprintf("kafkabench_%d_%d", os.Getpid(), b.tables)
	if err := b.cluster.CreateTopic(topic, int32(*partsFlag), nil); err != nil {
		return 0, err
	}
	defer b.cluster.DeleteTopic(topic) //nolint:errcheck // best effort
	s, err := b.kafkaSender(topic)
	if err != nil {
		return 0, err
	}
	defer s.Close()
	ms := make([]relay.Message, *rowsFlag)
	for i := range ms {
		ms[i] = relay.Message{ID: int64(i + 1), Type: msgType, Key: fmt.Sprint("key-", i),
			Payload: fmt.Appendf(nil, `{"n": %d, "pad": %q}`, i, make([]byte, *payloadFlag)), CreatedAt: time.Now()}
	}
	return benchkit.SenderAlone(ctx, s, ms, *batchFlag, batched)
}
