package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/xadm/relay"
	"github.com/xadm/relay/internal/store"
	"github.com/xadm/relay/internal/testkit/pgserver"
	"github.com/xadm/relay/internal/tools/benchkit"
)

// ---- partitions: the scale of a partitioned election, and its guard's cost ----

var (
	partitionRows         = flag.Int("partition-rows", 4000, "rows of each run of the partitions scenario")
	partitionKeys         = flag.Int("partition-keys", 4000, "distinct natural keys of those rows")
	partitionReplicas     = flag.Int("partition-replicas", 4, "partitioned replicas of the partitions scenario, each with its own pool")
	partitionCount        = flag.Int("partitions", 16, "their Config.Partitions")
	partitionConc         = flag.Int("partition-concurrency", 4, "Config.Concurrency of each replica, and of the one replica measured beside them")
	partitionDelay        = flag.Duration("partition-delay", 20*time.Millisecond, "how long the destination takes to answer each message")
	partitionIdle         = flag.Int("partition-idle-passes", 8, "idle passes of each replica over which the idle fleet's round trips are counted; 0 skips it")
	partitionIdleReplicas = flag.String("partition-idle-replicas", "", "sizes of the idle fleets measured, comma-separated; default 1 and -partition-replicas")
)

const (
	partitionsTable = "relaybench_partitions"
	// partitionsSettle is how soon after their start the replicas are to hold
	// their shares (issue 37).
	partitionsSettle = 5 * time.Second
)

// partitionsScale is the share of a perfect scale-up the replicas are to
// reach: 3.5× at 4 replicas (issue 12), 14× at 16 (issue 37).
const partitionsScale = 0.875

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

// runPartitions measures, in interleaved rounds, 1 replica against
// -partition-replicas replicas with -partitions Partitions, each with
// -partition-concurrency and a destination answering in -partition-delay;
// then what an idle fleet of those replicas costs the server, and the cost of
// an empty pass of a partitioned member against a single-key one.
func runPartitions(ctx context.Context, url string, admin *pgxpool.Pool) error {
	replicas, parts := *partitionReplicas, *partitionCount
	if replicas < 1 || parts < 2 {
		return fmt.Errorf("-partition-replicas %d and -partitions %d: want at least 1 replica and 2 partitions", replicas, parts)
	}
	fmt.Printf("\npartitions: %d rows over %d keys, a destination answering in %s, Concurrency %d per replica (%d runs each, interleaved)\n",
		*partitionRows, *partitionKeys, *partitionDelay, *partitionConc, *repeat)
	var single, parted, ratios, ideals []float64
	var settles []time.Duration
	for range *repeat {
		one, err := partitionsOnce(ctx, url, admin, 1, 1)
		if err != nil {
			return fmt.Errorf("1 replica: %w", err)
		}
		single = append(single, one.rate)
		many, err := partitionsOnce(ctx, url, admin, replicas, parts)
		if err != nil {
			return fmt.Errorf("%d replicas: %w", replicas, err)
		}
		parted = append(parted, many.rate)
		settles = append(settles, many.settle)
		ratios = append(ratios, many.rate/one.rate)
		ideals = append(ideals, many.ideal)
	}
	target := partitionsScale * float64(replicas)
	ratio := benchkit.Median(ratios)
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "replicas\tPartitions\tmsg/s (median)\truns\t")
	fmt.Fprintf(w, "1\t1\t%.0f\t%s\t\n", benchkit.Median(single), runsText(single))
	fmt.Fprintf(w, "%d\t%d\t%.0f\t%s\t\n", replicas, parts, benchkit.Median(parted), runsText(parted))
	w.Flush()
	fmt.Printf("partitions: %d replicas = %.2f× 1 replica (median of the rounds' ratios %s; target ≥ %.1f×: %s); "+
		"the hash's spread of the rows allows %.2f× (rows / the most one replica held)\n",
		replicas, ratio, ratiosText(ratios), target, verdictOf(ratio >= target), benchkit.Median(ideals))
	fmt.Printf("partitions: shares settled %s after the %d replicas' start (median; runs %s; target ≤ %s: %s)\n",
		benchkit.Quantile(settles, 0.5).Round(time.Millisecond), replicas, durationsText(settles), partitionsSettle,
		verdictOf(slices.Max(settles) <= partitionsSettle))
	if *partitionIdle > 0 {
		if err := partitionsIdle(ctx, url, admin, parts); err != nil {
			return fmt.Errorf("idle fleet: %w", err)
		}
	}
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

func ratiosText(xs []float64) string {
	var parts []string
	for _, x := range xs {
		parts = append(parts, fmt.Sprintf("%.2f", x))
	}
	return strings.Join(parts, " ")
}

func durationsText(ds []time.Duration) string {
	var parts []string
	for _, d := range ds {
		parts = append(parts, d.Round(time.Millisecond).String())
	}
	return strings.Join(parts, " ")
}

// partitionsRun is what one run of the partitions scenario measured: the
// rate, how long the shares took to settle after the replicas' start, and
// the rate the hash's spread of the rows over the replicas allows at most,
// as a multiple of one replica's: rows over the most rows one replica held.
type partitionsRun struct {
	rate   float64
	settle time.Duration
	ideal  float64
}

// fleetSettled reports whether every one of the n partitions is held by
// exactly one of relays, none holding more than ceil(n / replicas) or fewer
// than floor.
func fleetSettled(relays []*relay.Relay, n int) bool {
	count := make([]int, n)
	lo, hi := n/len(relays), (n+len(relays)-1)/len(relays)
	for _, r := range relays {
		parts := r.Stats().Partitions
		if len(parts) < lo || len(parts) > hi {
			return false
		}
		for _, p := range parts {
			count[p]++
		}
	}
	return !slices.ContainsFunc(count, func(c int) bool { return c != 1 })
}

// startFleet starts replicas relays of one app on table, each with a pool of
// its own to url, as in its own process, and returns them with a stop that
// stops them and closes their pools.
func startFleet(ctx context.Context, url, table string, replicas int, configure func(*relay.Config), s relay.Sender) ([]*relay.Relay, func(), error) {
	var relays []*relay.Relay
	var pools []*pgxpool.Pool
	stop := func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		var wg sync.WaitGroup
		for _, r := range relays {
			wg.Go(func() { _ = r.Stop(stopCtx) })
		}
		wg.Wait()
		for _, p := range pools { // once the relays gave their connections back
			p.Close()
		}
	}
	for range replicas {
		// The membership's session, the select, the workers' and the listener's.
		pool, err := benchkit.Pool(ctx, url, "relaybench", int32(*partitionConc+4))
		if err != nil {
			stop()
			return nil, nil, err
		}
		pools = append(pools, pool)
		cfg := relay.DefaultConfig()
		cfg.AppName = benchApp + "_partitions"
		cfg.Table = table
		cfg.Concurrency = *partitionConc
		cfg.Logger = slog.New(slog.DiscardHandler)
		configure(&cfg)
		r, err := relay.New(pool, cfg, s)
		if err == nil {
			err = r.Start(ctx)
		}
		if err != nil {
			stop()
			return nil, nil, err
		}
		relays = append(relays, r)
	}
	return relays, stop, nil
}

// partitionsOnce starts replicas, waits until each holds its share of the
// partitions, writes the rows in one statement and returns their rate, from
// before that statement to the last outcome, and how long the shares took to
// settle. Every row must reach the destination once, each key's in id order.
func partitionsOnce(ctx context.Context, url string, admin *pgxpool.Pool, replicas, partitions int) (partitionsRun, error) {
	var run partitionsRun
	if err := freshTable(ctx, admin, partitionsTable, 0, "PENDING"); err != nil {
		return run, err
	}
	// The rows' commit wakes every replica at once, as Enqueue's would.
	if err := relay.CreateWakeTrigger(ctx, admin, partitionsTable); err != nil {
		return run, err
	}
	n := *partitionRows
	// A warm-up delivery first: each replica's workers open their writers'
	// connections, which a fleet that has delivered before holds in its
	// pools. Cold, 16 replicas open 48 backends when the rows come, at once.
	warm := replicas * *partitionConc * 8
	obs := benchkit.NewDrainObserver(int64(warm + n))
	dest := &orderedSender{delay: *partitionDelay, sent: map[int64]bool{}, last: map[string]int64{}}
	begin := time.Now()
	relays, stop, err := startFleet(ctx, url, partitionsTable, replicas, func(cfg *relay.Config) {
		cfg.Partitions = partitions
		cfg.Observer = obs
	}, dest)
	if err != nil {
		return run, err
	}
	defer stop()
	if partitions > 1 {
		deadline := time.Now().Add(60 * time.Second)
		for !fleetSettled(relays, partitions) {
			if time.Now().After(deadline) {
				return run, errors.New("the partitions did not settle in 60s")
			}
			time.Sleep(5 * time.Millisecond)
		}
		run.settle = time.Since(begin)
	}
	insert := `INSERT INTO ` + pgx.Identifier{partitionsTable}.Sanitize() + ` (type, natural_key, payload)
		SELECT $1, $4 || (i % $3), jsonb_build_object('n', i) FROM generate_series(1, $2) i`
	if _, err := admin.Exec(ctx, insert, benchType, warm, warm, "warm-"); err != nil {
		return run, err
	}
	for deadline := time.Now().Add(60 * time.Second); obs.Sent.Load() < int64(warm); {
		if time.Now().After(deadline) {
			return run, fmt.Errorf("the warm-up: %d of %d messages sent after 60s (last pass error: %v)", obs.Sent.Load(), warm, obs.Err())
		}
		time.Sleep(5 * time.Millisecond)
	}
	var before []int64
	for _, r := range relays {
		before = append(before, r.Stats().Sent)
	}
	// The clock starts at the commit, when the replicas can see the rows.
	if _, err := admin.Exec(ctx, insert, benchType, n, *partitionKeys, "key-"); err != nil {
		return run, err
	}
	start := time.Now()
	timeout := time.Duration(n)*time.Second/20 + 30*time.Second
	select {
	case <-obs.Done():
	case <-time.After(timeout):
		return run, fmt.Errorf("only %d of %d messages sent after %s (last pass error: %v)", obs.Sent.Load(), n, timeout, obs.Err())
	case <-ctx.Done():
		return run, ctx.Err()
	}
	elapsed := obs.Last().Sub(start)
	most := int64(0)
	for i, r := range relays {
		most = max(most, r.Stats().Sent-before[i])
	}
	dest.mu.Lock()
	defer dest.mu.Unlock()
	if dest.repeats != 0 || dest.disorders != 0 || obs.Failed.Load() != 0 || len(dest.sent) != warm+n {
		return run, fmt.Errorf("%d of %d rows reached the destination, %d repeats, %d out of key order and %d failures: want every row once, in key order",
			len(dest.sent), warm+n, dest.repeats, dest.disorders, obs.Failed.Load())
	}
	run.rate = float64(n) / elapsed.Seconds()
	run.ideal = float64(n) / float64(most)
	return run, nil
}

// partitionsIdleFleet starts replicas partitioned replicas, with nothing to
// deliver, through a proxy that counts the round trips they ask of the
// server, and counts them over -partition-idle-passes idle passes of each
// replica after the shares settled: per replica and per Interval, and per
// pass. It then times an idle member's look at the election (the statements
// of its idle pass: the check of its partitions, the look at pg_locks and the
// presence keepalive, in one round trip), sent from another session while
// the fleet stands, whose pg_locks grows with the fleet.
func partitionsIdleFleet(ctx context.Context, url string, admin *pgxpool.Pool, replicas, partitions int) (idleFleet, error) {
	var res idleFleet
	const table = "relaybench_partitions_idle"
	if err := freshTable(ctx, admin, table, 0, "PENDING"); err != nil {
		return res, err
	}
	if err := relay.CreateWakeTrigger(ctx, admin, table); err != nil {
		return res, err
	}
	proxy, via, err := pgserver.ProxyURL(url)
	if err != nil {
		return res, err
	}
	defer proxy.Close()
	passes := make([]*passCount, replicas)
	i := 0
	cfg0 := relay.DefaultConfig()
	relays, stop, err := startFleet(ctx, via, table, replicas, func(cfg *relay.Config) {
		cfg.Partitions = partitions
		passes[i] = &passCount{}
		cfg.Observer = passes[i]
		i++
	}, sender{})
	if err != nil {
		return res, err
	}
	defer stop()
	deadline := time.Now().Add(60 * time.Second)
	for !fleetSettled(relays, partitions) {
		if time.Now().After(deadline) {
			return res, errors.New("the partitions did not settle in 60s")
		}
		time.Sleep(5 * time.Millisecond)
	}
	total := func() (n int64) {
		for _, p := range passes {
			n += p.n.Load()
		}
		return n
	}
	waitPasses := func(more int64) {
		var at []int64
		for _, p := range passes {
			at = append(at, p.n.Load()+more)
		}
		for {
			done := true
			for i, p := range passes {
				done = done && p.n.Load() >= at[i]
			}
			if done {
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	// Past the start: each session's first idle statements, which pgx
	// prepares (a round trip of their own, once per session).
	waitPasses(4)
	trips0, passes0, began := proxy.RoundTrips(), total(), time.Now()
	waitPasses(int64(*partitionIdle))
	res.trips, res.elapsed, res.passes = proxy.RoundTrips()-trips0, time.Since(began), total()-passes0
	res.perReplica = float64(res.trips) / float64(replicas) / (res.elapsed.Seconds() / cfg0.Interval.Seconds())

	// The idle look, as a member sends it, from a session of its own.
	tbl, err := store.NewTable(table, cfg0.RetryBackoff, time.Hour, false)
	if err != nil {
		return res, err
	}
	conn, err := admin.Acquire(ctx)
	if err != nil {
		return res, err
	}
	defer conn.Release()
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'`).Scan(&res.locks); err != nil {
		return res, err
	}
	key := benchApp + "_partitions" + relay.LockKeySuffix
	var times []time.Duration
	for i := range 220 {
		check := tbl.PartitionWork(cfg0.MaxAttempts, []string{benchType}, partitions, relays[0].Stats().Partitions)
		began := time.Now()
		look, _, err := store.IdleLookStatement(ctx, conn.Conn(), "", check, key, partitions)
		if err != nil {
			return res, fmt.Errorf("the idle look: %w", err)
		}
		if look.Members != replicas || look.Held != partitions {
			return res, fmt.Errorf("the idle look saw %d members holding %d partitions, want %d holding %d", look.Members, look.Held, replicas, partitions)
		}
		if i >= 20 { // past its preparation and the first plans
			times = append(times, time.Since(began))
		}
	}
	res.look = benchkit.Quantile(times, 0.5)
	_, err = admin.Exec(ctx, `DROP TABLE IF EXISTS `+table)
	return res, err
}

// idleFleet is what partitionsIdleFleet measured.
type idleFleet struct {
	trips, passes int64
	elapsed       time.Duration
	perReplica    float64       // round trips per replica per Interval
	locks         int64         // advisory locks in pg_locks while the fleet stands
	look          time.Duration // an idle look's round trip, median
}

// partitionsIdle measures idle fleets of each size of
// -partition-idle-replicas (partitionsIdleFleet).
func partitionsIdle(ctx context.Context, url string, admin *pgxpool.Pool, parts int) error {
	sizes := []int{1, *partitionReplicas}
	if *partitionIdleReplicas != "" {
		sizes = nil
		for f := range strings.SplitSeq(*partitionIdleReplicas, ",") {
			n, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || n < 1 {
				return fmt.Errorf("-partition-idle-replicas: %q is not a count of replicas", f)
			}
			sizes = append(sizes, n)
		}
	}
	interval := relay.DefaultConfig().Interval
	fmt.Printf("\npartitions idle: fleets with Partitions %d, Interval %s, nothing to deliver; round trips counted by a proxy over %d idle passes of each replica\n",
		parts, interval, *partitionIdle)
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "replicas\tround trips\tpasses\tseconds\tper replica per Interval\tper pass\tadvisory locks\tan idle look (median)\t")
	ok := true
	for _, n := range sizes {
		f, err := partitionsIdleFleet(ctx, url, admin, n, parts)
		if err != nil {
			return fmt.Errorf("%d replicas: %w", n, err)
		}
		ok = ok && f.perReplica <= 1
		fmt.Fprintf(w, "%d\t%d\t%d\t%.2f\t%.2f\t%.2f\t%d\t%s\t\n", n, f.trips, f.passes, f.elapsed.Seconds(), f.perReplica,
			float64(f.trips)/float64(f.passes), f.locks, f.look.Round(time.Microsecond))
	}
	w.Flush()
	fmt.Printf("partitions idle: ≤ 1 round trip per replica per Interval: %s\n", verdictOf(ok))
	return nil
}

// passCount is an Observer that counts passes.
type passCount struct{ n atomic.Int64 }

func (c *passCount) PassDone(relay.PassReport)       { c.n.Add(1) }
func (c *passCount) MessageDone(relay.MessageReport) {}

// partitionsGuard times empty passes, interleaved: today's single-key
// elected pass (RunIfElected: lock, select, unlock) and a partitioned
// member's (its rebalance and the select), the member holding all -partitions
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
	for _, p := range []int{1, *partitionCount} {
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
