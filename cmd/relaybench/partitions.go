package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/xadm/relay"
	"github.com/xadm/relay/internal/benchkit"
)

// ---- partitions: the scale of a partitioned election, and its guard's cost ----

var (
	partitionRows = flag.Int("partition-rows", 4000, "rows of each run of the partitions scenario")
	partitionKeys = flag.Int("partition-keys", 4000, "distinct natural keys of those rows")
)

const (
	partitionsTable    = "relaybench_partitions"
	partitionsReplicas = 4
	partitionsN        = 16
	partitionsConc     = 4
	partitionsDelay    = 20 * time.Millisecond
)

// orderedSender waits delay, as a destination answering in delay would, and
// counts what a receiver would see wrong: a message sent again, or a key's
// message after a later one of the same key.
type orderedSender struct {
	delay time.Duration

	mu        sync.Mutex
	sent      map[int64]bool
	last      map[string]int64
	repeats   int
	disorders int
}

func (s *orderedSender) Type() string { return benchType }

func (s *orderedSender) Send(ctx context.Context, m relay.Message) error {
	s.mu.Lock()
	if s.sent[m.ID] {
		s.repeats++
	}
	if m.ID < s.last[m.Key] {
		s.disorders++
	}
	s.sent[m.ID] = true
	s.last[m.Key] = max(s.last[m.Key], m.ID)
	s.mu.Unlock()
	return sender{delay: s.delay}.Send(ctx, m)
}

// runPartitions measures, in one run, 1 replica with Concurrency 4 against 4
// replicas with Partitions 16 and Concurrency 4 each, both delivering to a
// destination that answers in 20 ms; then the cost of an empty pass of a
// partitioned member against today's single-key elected pass.
func runPartitions(ctx context.Context, url string, admin *pgxpool.Pool) error {
	fmt.Printf("\npartitions: %d rows over %d keys, a destination answering in %s, Concurrency %d per replica (%d runs each, interleaved)\n",
		*partitionRows, *partitionKeys, partitionsDelay, partitionsConc, *repeat)
	var single, parted []float64
	var settles []time.Duration
	for range *repeat {
		rate, _, err := partitionsOnce(ctx, url, admin, 1, 1)
		if err != nil {
			return fmt.Errorf("1 replica: %w", err)
		}
		single = append(single, rate)
		rate, settle, err := partitionsOnce(ctx, url, admin, partitionsReplicas, partitionsN)
		if err != nil {
			return fmt.Errorf("%d replicas: %w", partitionsReplicas, err)
		}
		parted = append(parted, rate)
		settles = append(settles, settle)
	}
	ratio := benchkit.Median(parted) / benchkit.Median(single)
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "replicas\tPartitions\tmsg/s (median)\truns\t")
	fmt.Fprintf(w, "1\t1\t%.0f\t%s\t\n", benchkit.Median(single), runsText(single))
	fmt.Fprintf(w, "%d\t%d\t%.0f\t%s\t\n", partitionsReplicas, partitionsN, benchkit.Median(parted), runsText(parted))
	w.Flush()
	fmt.Printf("partitions: %d replicas = %.2f× 1 replica (target ≥ 3.5×: %s); shares settled %s after the %d replicas started (median)\n",
		partitionsReplicas, ratio, verdictOf(ratio >= 3.5), benchkit.Quantile(settles, 0.5).Round(time.Millisecond), partitionsReplicas)
	if err := partitionsGuard(ctx, url, admin); err != nil {
		return fmt.Errorf("guard: %w", err)
	}
	return nil
}

func verdictOf(ok bool) string {
	if ok {
		return "PASS"
	}
	return "FAIL"
}

// partitionsOnce starts replicas, waits until each holds its share of the
// partitions, writes the rows in one statement and returns their rate, from
// before that statement to the last outcome, and how long the shares took to
// settle.
func partitionsOnce(ctx context.Context, url string, admin *pgxpool.Pool, replicas, partitions int) (float64, time.Duration, error) {
	if err := freshTable(ctx, admin, partitionsTable, 0, "PENDING"); err != nil {
		return 0, 0, err
	}
	// The rows' commit wakes every replica at once, as Enqueue's would.
	if err := relay.CreateWakeTrigger(ctx, admin, partitionsTable); err != nil {
		return 0, 0, err
	}
	n := *partitionRows
	obs := benchkit.NewDrainObserver(int64(n))
	dest := &orderedSender{delay: partitionsDelay, sent: map[int64]bool{}, last: map[string]int64{}}
	var relays []*relay.Relay
	var pools []*pgxpool.Pool
	defer func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, r := range relays {
			_ = r.Stop(stopCtx)
		}
		for _, p := range pools { // once the relays gave their connections back
			p.Close()
		}
	}()
	begin := time.Now()
	for range replicas {
		// Each replica its own pool, as in its own process: the membership's
		// session, the select, the workers' and the listener's.
		pool, err := benchkit.Pool(ctx, url, "relaybench", partitionsConc+4)
		if err != nil {
			return 0, 0, err
		}
		pools = append(pools, pool)
		cfg := relay.DefaultConfig()
		cfg.AppName = benchApp + "_partitions"
		cfg.Table = partitionsTable
		cfg.Concurrency = partitionsConc
		cfg.Partitions = partitions
		cfg.Logger = slog.New(slog.DiscardHandler)
		cfg.Observer = obs
		r, err := relay.New(pool, cfg, dest)
		if err != nil {
			return 0, 0, err
		}
		if err := r.Start(ctx); err != nil {
			return 0, 0, err
		}
		relays = append(relays, r)
	}
	var settle time.Duration
	if partitions > 1 {
		share := partitions / replicas
		deadline := time.Now().Add(30 * time.Second)
		for {
			settled := true
			for _, r := range relays {
				settled = settled && len(r.Stats().Partitions) == share
			}
			if settled {
				break
			}
			if time.Now().After(deadline) {
				return 0, 0, errors.New("the partitions did not settle in 30s")
			}
			time.Sleep(5 * time.Millisecond)
		}
		settle = time.Since(begin)
	}
	start := time.Now()
	if _, err := admin.Exec(ctx, `INSERT INTO `+pgx.Identifier{partitionsTable}.Sanitize()+` (type, natural_key, payload)
		SELECT $1, 'key-' || (i % $3), jsonb_build_object('n', i) FROM generate_series(1, $2) i`, benchType, n, *partitionKeys); err != nil {
		return 0, 0, err
	}
	timeout := time.Duration(n)*time.Second/20 + 30*time.Second
	select {
	case <-obs.Done():
	case <-time.After(timeout):
		return 0, 0, fmt.Errorf("only %d of %d messages sent after %s (last pass error: %v)", obs.Sent.Load(), n, timeout, obs.Err())
	case <-ctx.Done():
		return 0, 0, ctx.Err()
	}
	elapsed := obs.Last().Sub(start)
	dest.mu.Lock()
	defer dest.mu.Unlock()
	if dest.repeats != 0 || dest.disorders != 0 || obs.Failed.Load() != 0 {
		return 0, 0, fmt.Errorf("%d repeats, %d out of key order and %d failures, want none", dest.repeats, dest.disorders, obs.Failed.Load())
	}
	return float64(n) / elapsed.Seconds(), settle, nil
}

// partitionsGuard times empty passes, interleaved: today's single-key
// elected pass (RunIfElected: lock, select, unlock) and a partitioned
// member's (its rebalance and the select), the member holding all 16
// partitions, and counts their round trips.
func partitionsGuard(ctx context.Context, url string, admin *pgxpool.Pool) error {
	const table = "relaybench_partitions_guard"
	if err := freshTable(ctx, admin, table, 0, "PENDING"); err != nil {
		return fmt.Errorf("create %s: %w", table, err)
	}
	type target struct {
		name  string
		trips *tripCounter
		relay *relay.Relay
		times []time.Duration
		per   counts
	}
	var targets []*target
	for _, p := range []int{1, partitionsN} {
		tc := &tripCounter{}
		pool, err := countingPool(ctx, url, tc)
		if err != nil {
			return fmt.Errorf("pool: %w", err)
		}
		defer pool.Close()
		cfg := relay.DefaultConfig()
		cfg.AppName = fmt.Sprintf("%s_pguard%d", benchApp, p)
		cfg.Table = table
		cfg.Partitions = p
		cfg.Logger = slog.New(slog.DiscardHandler)
		// A partitioned member is started but not Enabled: the loop never
		// passes, and the membership lasts between passes, as under the ticker.
		cfg.Enabled = p == 1
		r, err := relay.New(pool, cfg, sender{})
		if err != nil {
			return err
		}
		name := "single key (RunIfElected)"
		if p > 1 {
			if err := r.Start(ctx); err != nil {
				return fmt.Errorf("start the member: %w", err)
			}
			defer func() { _ = r.Stop(context.Background()) }()
			name = fmt.Sprintf("partitioned member, Partitions %d (RunIfElected)", p)
		}
		targets = append(targets, &target{name: name, trips: tc, relay: r})
	}
	pass := func(t *target) error {
		ran, err := t.relay.RunIfElected(ctx)
		if err == nil && !ran {
			err = errors.New("the pass did not run")
		}
		return err
	}
	for range 20 { // warm up: connections open, statements prepared, the member joined
		for _, t := range targets {
			if err := pass(t); err != nil {
				return fmt.Errorf("%s: %w", t.name, err)
			}
		}
	}
	var befores []counts
	for _, t := range targets {
		befores = append(befores, t.trips.snapshot())
	}
	for range *guardPasses {
		for _, t := range targets {
			start := time.Now()
			if err := pass(t); err != nil {
				return fmt.Errorf("%s: %w", t.name, err)
			}
			t.times = append(t.times, time.Since(start))
		}
	}
	n := int64(*guardPasses)
	for i, t := range targets {
		d := t.trips.snapshot().minus(befores[i])
		t.per = counts{d.queries / n, d.batches / n, d.prepares / n, d.writes / n}
	}
	fmt.Printf("\npartitions guard: an empty pass (%d passes each, interleaved, after 20 of warm-up)\n", *guardPasses)
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "pass\tround trips (socket writes)\tstatements\tbatches\tmedian\tp90\t")
	for _, t := range targets {
		fmt.Fprintf(w, "%s\t%d\t%d\t%d\t%s\t%s\t\n", t.name, t.per.writes, t.per.queries, t.per.batches,
			benchkit.Quantile(t.times, 0.5).Round(time.Microsecond), benchkit.Quantile(t.times, 0.9).Round(time.Microsecond))
	}
	w.Flush()
	ratio := float64(benchkit.Quantile(targets[1].times, 0.5)) / float64(benchkit.Quantile(targets[0].times, 0.5))
	fmt.Printf("partitions guard: partitioned / single key = %.2f× (target ≤ 2×: %s)\n", ratio, verdictOf(ratio <= 2))
	_, err := admin.Exec(ctx, `DROP TABLE IF EXISTS `+table+`, `+partitionsTable)
	return err
}
