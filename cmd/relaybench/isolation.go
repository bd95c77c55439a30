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
	"github.com/xadm/relay/internal/testkit/pgserver"
	"github.com/xadm/relay/internal/tools/benchkit"
)

// The isolation scenario: one relay, sick types x… and healthy types y…,
// Concurrency 4, SendTimeout 2s (-isolation-timeout). The sick types'
// receivers are sick in one of the ways below; the healthy types' messages
// are written meanwhile at -isolation-rate each for -isolation-duration, each
// by Enqueue in its own transaction. It reports, per case, the healthy
// types' commit → Send delays, then heals the sick types and reports how
// long their backlog took to drain, how many of their messages reached the
// receiver more than once, whether each key kept its order, and the
// goroutines before and after the stuck Sends returned.
//
//	go run ./cmd/relaybench -scenarios isolation
//
// Target (issues 34 and 45): the healthy types' worst delay ≤ 3s in each
// case; the sick types all delivered once they heal, none lost, per-key
// order kept; goroutines back (±30).

var (
	isolationRate     = flag.Int("isolation-rate", 5, "messages per second of each healthy type of the isolation scenario")
	isolationDuration = flag.Duration("isolation-duration", 20*time.Second, "how long the healthy types are written in each isolation case")
	isolationTimeout  = flag.Duration("isolation-timeout", 2*time.Second, "SendTimeout of the isolation scenario")
	isolationBatch    = flag.Int("isolation-batch", 100, "BatchSize of the isolation scenario (the backlogs are multiples of it)")
)

// isolationCase is one way the sick types' receivers are sick.
type isolationCase struct {
	name string
	sick []sickType
	// healthy is how many healthy types are written (y, or y0, y1, …).
	healthy int
}

// sickType is one sick type: rows of how many keys it has waiting (rows,
// spread over keys), and its receiver while sick; release ends the sickness
// of the Sends still in it (those that ignore their context).
type sickType struct {
	rows, keys int
	send       func(ctx context.Context, release <-chan struct{}) error
}

func hangs(ctx context.Context, _ <-chan struct{}) error {
	<-ctx.Done()
	return context.Cause(ctx)
}

func ignoresFor(d time.Duration) func(context.Context, <-chan struct{}) error {
	return func(_ context.Context, release <-chan struct{}) error {
		select {
		case <-time.After(d):
		case <-release:
		}
		return errors.New("answered late")
	}
}

func neverReturns(_ context.Context, release <-chan struct{}) error {
	<-release // ignores its context, until the case ends
	return errors.New("answered at last")
}

func takes(d time.Duration) func(context.Context, <-chan struct{}) error {
	return func(ctx context.Context, _ <-chan struct{}) error {
		select {
		case <-time.After(d):
			return nil
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
}

func refuses(context.Context, <-chan struct{}) error { return errors.New("503 Service Unavailable") }

// oneSick is a case of one sick type of rows rows over keys keys.
func oneSick(name string, rows, keys int, send func(context.Context, <-chan struct{}) error) isolationCase {
	return isolationCase{name: name, sick: []sickType{{rows: rows, keys: keys, send: send}}, healthy: 1}
}

func isolationCases() []isolationCase {
	b := *isolationBatch
	manySick := isolationCase{name: "10 of 12 types sick: 4 hang, 3 take 1s, 3 refuse (40 keys each); 2 healthy", healthy: 2}
	for i := range 10 {
		send := hangs
		switch {
		case i >= 7:
			send = refuses
		case i >= 4:
			send = takes(time.Second)
		}
		manySick.sick = append(manySick.sick, sickType{rows: 40, keys: 40, send: send})
	}
	return []isolationCase{
		oneSick("x blocks until its context ends (40 keys)", 40, 40, hangs),
		oneSick("x ignores its context for 20s (20 keys)", 20, 20, ignoresFor(20*time.Second)),
		oneSick("x takes 1s per message (200 keys)", 200, 200, takes(time.Second)),
		oneSick(fmt.Sprintf("x takes 1s per message, backlog 10× BatchSize (%d rows)", 10*b), 10*b, 10*b, takes(time.Second)),
		oneSick(fmt.Sprintf("x takes 1s per message, backlog 100× BatchSize (%d rows)", 100*b), 100*b, 100*b, takes(time.Second)),
		oneSick("x's Sends never return, ignoring their context (300 keys)", 300, 300, neverReturns),
		manySick,
	}
}

func runIsolation(ctx context.Context, srv *pgserver.Server) error {
	fmt.Printf("\nisolation: sick types x… and healthy types y…, Concurrency 4, BatchSize %d, SendTimeout %s; each y at %d msg/s for %s while the x are sick\n",
		*isolationBatch, *isolationTimeout, *isolationRate, *isolationDuration)
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "case\ty sent\ty p50\ty p99\ty max\tx drained after heal\tx twice\tx order\tgoroutines start/end\tverdict\t")
	for _, c := range isolationCases() {
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
	fmt.Println("target (issues 34, 45): the healthy types' worst delay ≤ 3s; the sick ones all delivered after they heal, in order per key; goroutines back (±30)")
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

// names are n types' names: prefix alone for one, prefix0, prefix1, … for more.
func names(prefix string, n int) []string {
	if n == 1 {
		return []string{prefix}
	}
	ns := make([]string, n)
	for i := range ns {
		ns[i] = fmt.Sprint(prefix, i)
	}
	return ns
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
	xs, ys := names("x", len(c.sick)), names("y", c.healthy)
	for i, st := range c.sick {
		if _, err := pool.Exec(ctx, "INSERT INTO "+table+" (type, natural_key, payload) SELECT $1, $1 || '-' || (g % $3), '{}' FROM generate_series(1, $2) g",
			xs[i], st.rows, st.keys); err != nil {
			return res, err
		}
	}
	res.goroutinesStart = runtime.NumGoroutine()

	var healed atomic.Bool
	release := make(chan struct{})
	var xmu sync.Mutex
	xGot := map[string][]int64{}
	var senders []relay.Sender
	for i, st := range c.sick {
		senders = append(senders, relay.SenderFunc(xs[i], func(ctx context.Context, m relay.Message) error {
			if !healed.Load() {
				if err := st.send(ctx, release); err != nil {
					return err
				}
			}
			xmu.Lock()
			xGot[m.Key] = append(xGot[m.Key], m.ID)
			xmu.Unlock()
			return nil
		}))
	}
	var ymu sync.Mutex
	committed := map[int64]time.Time{}
	sentAt := map[int64]time.Time{}
	for _, y := range ys {
		senders = append(senders, relay.SenderFunc(y, func(_ context.Context, m relay.Message) error {
			now := time.Now()
			ymu.Lock()
			if _, ok := sentAt[m.ID]; !ok {
				sentAt[m.ID] = now
			}
			ymu.Unlock()
			return nil
		}))
	}
	cfg := relay.DefaultConfig()
	cfg.AppName, cfg.Table = "relaybench_isolation", table
	cfg.Concurrency = 4
	cfg.BatchSize = *isolationBatch
	cfg.SendTimeout = *isolationTimeout
	cfg.Logger = slog.New(slog.DiscardHandler)
	r, err := relay.New(pool, cfg, senders...)
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

	// The healthy types, written at a steady rate each while the x are sick.
	tick := time.NewTicker(time.Second / time.Duration(*isolationRate*len(ys)))
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
		y := ys[i%len(ys)]
		tx, err := pool.Begin(ctx)
		if err != nil {
			return res, err
		}
		id, err := relay.Enqueue(ctx, tx, table, relay.Outgoing{Type: y, Key: fmt.Sprint(y, "-", i%50), Payload: []byte(`{}`)})
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

	// The x heal: how long until their backlog is delivered.
	healed.Store(true)
	close(release)
	healedAt := time.Now()
	for {
		var left int
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+table+" WHERE type LIKE 'x%' AND status <> 'SENT'").Scan(&left); err != nil {
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
		res.ordered = res.ordered && slices.IsSorted(ids)
		seen := map[int64]bool{}
		for _, id := range ids {
			if seen[id] {
				res.xTwice++
			}
			seen[id] = true
		}
	}
	xmu.Unlock()
	// The goroutines of the x's sick Sends have all returned (release): give
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
