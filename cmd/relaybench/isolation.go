package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/xadm/relay"
	"github.com/xadm/relay/internal/benchkit"
	"github.com/xadm/relay/internal/pgserver"
)

// The isolation scenario: one relay, types x and y, Concurrency 4, SendTimeout
// 2s (-isolation-timeout). x's receiver is sick in one of three ways; y's
// messages are written meanwhile at -isolation-rate for -isolation-duration,
// each by Enqueue in its own transaction. It reports, per case, y's commit →
// Send delays, then heals x and reports how long x's backlog took to drain,
// how many x messages reached the receiver more than once, whether each key
// kept its order, and the goroutines before and after x's stuck Sends returned.
//
//	go run ./cmd/relaybench -scenarios isolation
//
// Cases: 40 keys of x whose receiver blocks until its context ends; 20 keys
// of x whose receiver ignores its context for 20s; 200 keys of x that take 1s
// each. Target (issue 34): y's worst delay ≤ 3s in each case; x all delivered
// once it heals, none lost, per-key order kept; goroutines back (±30).

var (
	isolationRate     = flag.Int("isolation-rate", 5, "y messages per second of the isolation scenario")
	isolationDuration = flag.Duration("isolation-duration", 20*time.Second, "how long y is written in each isolation case")
	isolationTimeout  = flag.Duration("isolation-timeout", 2*time.Second, "SendTimeout of the isolation scenario")
)

// isolationCase is one way x's receiver is sick.
type isolationCase struct {
	name string
	keys int
	// send is x's receiver while sick; release ends the sickness of the
	// Sends still in it (those that ignore their context).
	send func(ctx context.Context, release <-chan struct{}) error
}

var isolationCases = []isolationCase{
	{"x blocks until its context ends (40 keys)", 40, func(ctx context.Context, _ <-chan struct{}) error {
		<-ctx.Done()
		return context.Cause(ctx)
	}},
	{"x ignores its context for 20s (20 keys)", 20, func(_ context.Context, release <-chan struct{}) error {
		select {
		case <-time.After(20 * time.Second):
		case <-release:
		}
		return errors.New("answered after 20s")
	}},
	{"x takes 1s per message (200 keys)", 200, func(ctx context.Context, _ <-chan struct{}) error {
		select {
		case <-time.After(time.Second):
			return nil
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}},
}

func runIsolation(ctx context.Context, srv *pgserver.Server) error {
	fmt.Printf("\nisolation: types x and y, Concurrency 4, SendTimeout %s; y at %d msg/s for %s while x is sick\n",
		*isolationTimeout, *isolationRate, *isolationDuration)
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "case\ty sent\ty p50\ty p99\ty max\tx drained after heal\tx twice\tx order\tgoroutines start/end\tverdict\t")
	for _, c := range isolationCases {
		res, err := isolationOnce(ctx, srv.URL, c)
		if err != nil {
			return fmt.Errorf("%s: %w", c.name, err)
		}
		ok := res.ySent == res.yWritten && slices.Max(res.delays) <= 3*time.Second && res.xLeft == 0 && res.ordered &&
			res.goroutinesEnd <= res.goroutinesStart+30
		fmt.Fprintf(w, "%s\t%d/%d\t%s\t%s\t%s\t%s (%d left)\t%d\t%v\t%d/%d\t%s\t\n", c.name, res.ySent, res.yWritten,
			ms(benchkit.Quantile(res.delays, 0.5)), ms(benchkit.Quantile(res.delays, 0.99)), ms(slices.Max(res.delays)),
			res.xDrain.Round(100*time.Millisecond), res.xLeft, res.xTwice, res.ordered, res.goroutinesStart, res.goroutinesEnd, verdictOf(ok))
	}
	w.Flush()
	fmt.Println("target (issue 34): y's worst delay ≤ 3s; x all delivered after it heals, in order per key; goroutines back (±30)")
	return nil
}

type isolationResult struct {
	yWritten, ySent                int
	delays                         []time.Duration
	xDrain                         time.Duration
	xLeft, xTwice                  int
	ordered                        bool
	goroutinesStart, goroutinesEnd int
}

func isolationOnce(ctx context.Context, url string, c isolationCase) (isolationResult, error) {
	var res isolationResult
	pool, err := benchkit.Pool(ctx, url, "relaybench_isolation", 12)
	if err != nil {
		return res, err
	}
	defer pool.Close()
	table := "isolation_bench"
	if _, err := pool.Exec(ctx, "DROP TABLE IF EXISTS "+table); err != nil {
		return res, err
	}
	if err := relay.CreateTable(ctx, pool, table); err != nil {
		return res, err
	}
	if err := relay.CreateWakeTrigger(ctx, pool, table); err != nil {
		return res, err
	}
	if _, err := pool.Exec(ctx, "INSERT INTO "+table+" (type, natural_key, payload) SELECT 'x', 'x' || g, '{}' FROM generate_series(1, $1) g",
		c.keys); err != nil {
		return res, err
	}
	res.goroutinesStart = runtime.NumGoroutine()

	var healed atomic.Bool
	release := make(chan struct{})
	var xmu sync.Mutex
	xGot := map[string][]int64{}
	x := relay.SenderFunc("x", func(ctx context.Context, m relay.Message) error {
		if !healed.Load() {
			if err := c.send(ctx, release); err != nil {
				return err
			}
		}
		xmu.Lock()
		xGot[m.Key] = append(xGot[m.Key], m.ID)
		xmu.Unlock()
		return nil
	})
	var ymu sync.Mutex
	committed := map[int64]time.Time{}
	sentAt := map[int64]time.Time{}
	y := relay.SenderFunc("y", func(_ context.Context, m relay.Message) error {
		now := time.Now()
		ymu.Lock()
		if _, ok := sentAt[m.ID]; !ok {
			sentAt[m.ID] = now
		}
		ymu.Unlock()
		return nil
	})
	cfg := relay.DefaultConfig()
	cfg.AppName, cfg.Table = "relaybench_isolation", table
	cfg.Concurrency = 4
	cfg.SendTimeout = *isolationTimeout
	cfg.Logger = slog.New(slog.DiscardHandler)
	r, err := relay.New(pool, cfg, x, y)
	if err != nil {
		return res, err
	}
	if err := r.Start(ctx); err != nil {
		return res, err
	}
	stopped := false
	defer func() {
		if !stopped {
			_ = r.Stop(context.Background())
		}
	}()

	// y, written at a steady rate while x is sick.
	tick := time.NewTicker(time.Second / time.Duration(*isolationRate))
	end := time.After(*isolationDuration)
write:
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return res, ctx.Err()
		case <-end:
			break write
		case <-tick.C:
		}
		tx, err := pool.Begin(ctx)
		if err != nil {
			return res, err
		}
		id, err := relay.Enqueue(ctx, tx, table, relay.Outgoing{Type: "y", Key: fmt.Sprint("y", i%50), Payload: []byte(`{}`)})
		if err == nil {
			err = tx.Commit(ctx)
		}
		if err != nil {
			_ = tx.Rollback(ctx)
			return res, err
		}
		ymu.Lock()
		committed[id] = time.Now()
		ymu.Unlock()
	}
	tick.Stop()
	// The last y messages get the target's 3s to be sent.
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		ymu.Lock()
		done := len(sentAt) >= len(committed)
		ymu.Unlock()
		if done {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	ymu.Lock()
	res.yWritten = len(committed)
	for id, at := range committed {
		if s, ok := sentAt[id]; ok {
			res.ySent++
			res.delays = append(res.delays, max(s.Sub(at), 0))
		} else {
			res.delays = append(res.delays, time.Since(at)) // not sent yet: at least this late
		}
	}
	ymu.Unlock()

	// x heals: how long until its backlog is delivered.
	healed.Store(true)
	close(release)
	healedAt := time.Now()
	for {
		var left int
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+table+" WHERE type = 'x' AND status <> 'SENT'").Scan(&left); err != nil {
			return res, err
		}
		res.xLeft, res.xDrain = left, time.Since(healedAt)
		if left == 0 || res.xDrain > 3*time.Minute {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	stopped = true
	if err := r.Stop(ctx); err != nil {
		return res, err
	}
	xmu.Lock()
	res.ordered = true
	for _, ids := range xGot {
		if len(ids) > 1 {
			res.xTwice += len(ids) - 1
		}
		res.ordered = res.ordered && slices.IsSorted(ids)
	}
	xmu.Unlock()
	// The goroutines of x's sick Sends have all returned (release): give
	// the runtime a moment to retire them.
	for range 100 {
		if res.goroutinesEnd = runtime.NumGoroutine(); res.goroutinesEnd <= res.goroutinesStart+30 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	_, _ = pool.Exec(ctx, "DROP TABLE IF EXISTS "+pgx.Identifier{table}.Sanitize())
	return res, nil
}
