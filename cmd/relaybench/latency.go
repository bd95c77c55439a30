package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/xadm/relay"
	"github.com/xadm/relay/internal/testkit/pgserver"
	"github.com/xadm/relay/internal/tools/benchkit"
)

// The latency scenario: how long from a producer's commit to the moment the
// relay calls Send, with wake-ups on commit and with polling alone, in one run.
//
//	go run ./cmd/relaybench -scenarios latency
//
// Three replicas (-latency-replicas) of one app run with the default configuration (Interval 1s):
// one is elected at a time, the others stand by; with -latency-partitions above 1 they
// all deliver, each its partitions, once their shares settled. A producer commits one row per
// transaction at a steady -latency-rate for -latency-duration. The latency of a
// message is the time its Send was first called minus the time its producer's
// Commit returned. Rounds: with wake-ups (Enqueue notifies), with polling only
// (WakeOnCommit false), and with wake-ups on but a producer that does not
// notify (plain SQL, as the JVM writes), which the Interval's poll delivers.
//
// The notify-cost scenario: the producers' commit rate with 8 concurrent
// producers, each committing one Enqueue per transaction for
// -notify-duration, with wake-ups (Enqueue's NOTIFY) and without
// (WithoutWakeUp), alternated over -repeat rounds; and the same for a
// plain-SQL producer with and without WakeTriggerSQL's trigger.

var (
	latencyRate     = flag.Int("latency-rate", 200, "messages per second of the latency scenario's producer")
	latencyDuration = flag.Duration("latency-duration", 30*time.Second, "how long the latency scenario's producer writes, per round")
	notifyDuration  = flag.Duration("notify-duration", 5*time.Second, "how long each notify-cost run lasts")
	latencyReplicas = flag.Int("latency-replicas", 3, "replicas of the latency scenario's app (one elected, the others standbys)")
	latencyParts    = flag.Int("latency-partitions", 1, "Config.Partitions of the latency scenario's replicas (above 1: all deliver, each its partitions)")
	latencyDump     = flag.String("latency-dump", "", "write each message of the wake-on-commit round to this file, in commit order: "+
		"its place, its id and its latency in ms (where the slow ones lie in time; each round overwrites it)")
)

// latencyRound is one way of waking the relay.
type latencyRound struct {
	name   string
	wake   bool // WakeOnCommit
	notify bool // the producer notifies (Enqueue), else plain SQL
}

var latencyRounds = []latencyRound{
	{"wake on commit (Enqueue)", true, true},
	{"polling only (WakeOnCommit=false)", false, true},
	{"no NOTIFY (plain SQL), wake-ups on", true, false},
}

func runLatency(ctx context.Context, srv *pgserver.Server) error {
	how := "1 elected at a time"
	if *latencyParts > 1 {
		how = fmt.Sprintf("Partitions %d", *latencyParts)
	}
	fmt.Printf("\nlatency: commit → Send, %d msg/s for %s per round, %d replicas (%s), Interval 1s\n",
		*latencyRate, *latencyDuration, *latencyReplicas, how)
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "round\tmessages\tp50\tp90\tp99\tmax\t")
	for _, round := range latencyRounds {
		lat, err := latencyOnce(ctx, srv.URL, round)
		if err != nil {
			return fmt.Errorf("%s: %w", round.name, err)
		}
		fmt.Fprintf(w, "%s\t%d\t%s\t%s\t%s\t%s\t\n", round.name, len(lat),
			ms(benchkit.Quantile(lat, 0.50)), ms(benchkit.Quantile(lat, 0.90)), ms(benchkit.Quantile(lat, 0.99)), ms(slices.Max(lat)))
	}
	w.Flush()
	fmt.Println("targets (issue 11): wake on commit p50 ≤ 5 ms, p99 ≤ 50 ms; without a NOTIFY, within one Interval")
	return nil
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond)) }

// latencyOnce runs one round and returns each message's latency.
func latencyOnce(ctx context.Context, url string, round latencyRound) ([]time.Duration, error) {
	const table = "relaybench_latency"
	admin, err := benchkit.Pool(ctx, url, "relaybench", 4)
	if err != nil {
		return nil, err
	}
	defer admin.Close()
	if err := freshTable(ctx, admin, table, 0, "PENDING"); err != nil {
		return nil, err
	}

	var mu sync.Mutex
	sent := map[int64]time.Time{}
	cfg := relay.DefaultConfig()
	cfg.AppName, cfg.Table = "relaybench_latency", table
	cfg.WakeOnCommit = round.wake
	cfg.Partitions = *latencyParts
	cfg.Logger = slog.New(slog.DiscardHandler)
	var relays []*relay.Relay
	for i := range *latencyReplicas {
		pool, err := benchkit.Pool(ctx, url, fmt.Sprintf("relaybench-latency-r%d", i), 6)
		if err != nil {
			return nil, err
		}
		defer pool.Close()
		r, err := relay.New(pool, cfg, relay.SenderFunc(benchType, func(_ context.Context, m relay.Message) error {
			now := time.Now()
			mu.Lock()
			if _, ok := sent[m.ID]; !ok {
				sent[m.ID] = now
			}
			mu.Unlock()
			return nil
		}))
		if err != nil {
			return nil, err
		}
		if err := r.Start(context.WithoutCancel(ctx)); err != nil {
			return nil, err
		}
		relays = append(relays, r)
	}
	defer func() {
		for _, r := range relays {
			stopCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_ = r.Stop(stopCtx)
			cancel()
		}
	}()
	time.Sleep(2 * time.Second) // every replica past its first passes and listening
	for deadline := time.Now().Add(60 * time.Second); *latencyParts > 1 && !fleetSettled(relays, *latencyParts); {
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("the partitions did not settle in 60s")
		}
		time.Sleep(5 * time.Millisecond)
	}

	producer, err := benchkit.Pool(ctx, url, "relaybench", 2)
	if err != nil {
		return nil, err
	}
	defer producer.Close()
	committed := map[int64]time.Time{}
	tick := time.NewTicker(time.Second / time.Duration(*latencyRate))
	defer tick.Stop()
	end := time.Now().Add(*latencyDuration)
	insert := `INSERT INTO ` + table + ` (type, natural_key, payload) VALUES ($1, $2, '{}') RETURNING id`
	for i := 0; time.Now().Before(end); i++ {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-tick.C:
		}
		var id int64
		err := pgx.BeginFunc(ctx, producer, func(tx pgx.Tx) error {
			if round.notify {
				var err error
				id, err = relay.Enqueue(ctx, tx, table, relay.Outgoing{Type: benchType, Key: fmt.Sprint("k", i), Payload: []byte(`{}`)})
				return err
			}
			return tx.QueryRow(ctx, insert, benchType, fmt.Sprint("k", i)).Scan(&id)
		})
		if err != nil {
			return nil, err
		}
		committed[id] = time.Now()
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		mu.Lock()
		n := len(sent)
		mu.Unlock()
		if n >= len(committed) {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%d of %d messages delivered after 30s", n, len(committed))
		}
		time.Sleep(10 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	lat := make([]time.Duration, 0, len(committed))
	for id, at := range committed {
		lat = append(lat, max(sent[id].Sub(at), 0))
	}
	if *latencyDump != "" && round.wake && round.notify {
		if err := dumpLatencies(*latencyDump, committed, sent); err != nil {
			return nil, err
		}
	}
	return lat, nil
}

// dumpLatencies writes each message's place in commit order, its id and its
// latency in milliseconds, one a line.
func dumpLatencies(path string, committed, sent map[int64]time.Time) error {
	ids := make([]int64, 0, len(committed))
	for id := range committed {
		ids = append(ids, id)
	}
	slices.Sort(ids) // one producer, one row a transaction: id order is commit order
	var b strings.Builder
	for i, id := range ids {
		fmt.Fprintf(&b, "%d %d %.3f\n", i, id, float64(max(sent[id].Sub(committed[id]), 0))/float64(time.Millisecond))
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

// notifyVariant is one way producers write in the notify-cost scenario.
type notifyVariant struct {
	name    string
	trigger bool                                              // the table has the wake-up trigger
	write   func(ctx context.Context, tx pgx.Tx, i int) error // one message
}

func runNotifyCost(ctx context.Context, srv *pgserver.Server) error {
	const table = "relaybench_notify"
	admin, err := benchkit.Pool(ctx, srv.URL, "relaybench", 4)
	if err != nil {
		return err
	}
	defer admin.Close()
	enqueue := func(opts ...relay.EnqueueOption) func(ctx context.Context, tx pgx.Tx, i int) error {
		return func(ctx context.Context, tx pgx.Tx, i int) error {
			_, err := relay.Enqueue(ctx, tx, table, relay.Outgoing{Type: benchType, Key: fmt.Sprint("k", i), Payload: []byte(`{}`)}, opts...)
			return err
		}
	}
	plain := func(ctx context.Context, tx pgx.Tx, i int) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+table+` (type, natural_key, payload) VALUES ($1, $2, '{}')`, benchType, fmt.Sprint("k", i))
		return err
	}
	variants := []notifyVariant{
		{"Enqueue, WithoutWakeUp", false, enqueue(relay.WithoutWakeUp())},
		{"Enqueue (wakes the relay)", false, enqueue()},
		{"plain INSERT, no trigger", false, plain},
		{"plain INSERT, WakeTriggerSQL's trigger", true, plain},
	}
	rates := make([][]float64, len(variants))
	for range *repeat {
		for i, v := range variants {
			if err := freshTable(ctx, admin, table, 0, "PENDING"); err != nil {
				return err
			}
			if v.trigger {
				if err := relay.CreateWakeTrigger(ctx, admin, table); err != nil {
					return err
				}
			}
			if _, err := admin.Exec(ctx, "CHECKPOINT"); err != nil {
				return err
			}
			rate, err := producersRate(ctx, srv.URL, 8, *notifyDuration, v.write)
			if err != nil {
				return fmt.Errorf("%s: %w", v.name, err)
			}
			rates[i] = append(rates[i], rate)
		}
	}
	fmt.Printf("\nnotify cost: commits/s of 8 concurrent producers, one message per transaction, %s per run, medians of %d\n",
		*notifyDuration, *repeat)
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "producers\tcommits/s (median)\truns\tratio\t")
	for i, v := range variants {
		ratio := ""
		if i%2 == 1 {
			ratio = fmt.Sprintf("%.2f× the line above", benchkit.Median(rates[i])/benchkit.Median(rates[i-1]))
		}
		fmt.Fprintf(w, "%s\t%.0f\t%s\t%s\t\n", v.name, benchkit.Median(rates[i]), runsText(rates[i]), ratio)
	}
	w.Flush()
	fmt.Println("target (issue 11): wake-ups on ≥ 0.9× off")
	return nil
}

func runsText(xs []float64) string {
	s := ""
	for i, x := range xs {
		if i > 0 {
			s += " "
		}
		s += fmt.Sprintf("%.0f", x)
	}
	return s
}

// producersRate runs n producers committing one write per transaction for d
// and returns their commits per second.
func producersRate(ctx context.Context, url string, n int, d time.Duration, write func(ctx context.Context, tx pgx.Tx, i int) error) (float64, error) {
	pool, err := benchkit.Pool(ctx, url, "relaybench", int32(n))
	if err != nil {
		return 0, err
	}
	defer pool.Close()
	return producersRateOn(ctx, pool, n, d, write)
}

// producersRateOn is producersRate on connections of pool.
func producersRateOn(ctx context.Context, pool *pgxpool.Pool, n int, d time.Duration, write func(ctx context.Context, tx pgx.Tx, i int) error) (float64, error) {
	var commits atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	start := time.Now()
	end := start.Add(d)
	for p := range n {
		wg.Go(func() {
			for i := p; time.Now().Before(end); i += n {
				if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return write(ctx, tx, i) }); err != nil {
					firstErr.CompareAndSwap(nil, err)
					return
				}
				commits.Add(1)
			}
		})
	}
	wg.Wait()
	if err, _ := firstErr.Load().(error); err != nil {
		return 0, err
	}
	return float64(commits.Load()) / time.Since(start).Seconds(), nil
}
