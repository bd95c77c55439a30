package main

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/xadm/relay"
)

// appName is the app the demo's replicas belong to: one election key,
// "relay-demo_relay_m2m", for all three.
const appName = "relay-demo"

// params shape one run of the scenario.
type params struct {
	messages    int           // rows written
	txSize      int           // rows per producer transaction
	writeFor    time.Duration // the writes are spread over this long
	replicas    int           // relays running at once, each with its own pool
	rolls       int           // replicas stopped and replaced, one at a time, while writing
	concurrency int           // Config.Concurrency of each replica
	interval    time.Duration // Config.Interval of each replica
	delay       time.Duration // what each request costs the receiver
	deadline    time.Duration // the most a run may take to deliver everything after the last write
}

// scenario is one run: a fresh table, a fresh receiver, N replicas.
type scenario struct {
	name    string
	guarded bool // Config.ClusterLock
	table   string
	p       params
	dbURL   string
	admin   *pgxpool.Pool // the service's own pool, through which it writes its messages
	rc      *receiver
	out     *progress
	logger  *slog.Logger

	written atomic.Int64
	pods    []*pod
}

// result is what a run did, as the receiver and the table tell it.
type result struct {
	written int
	counts  counts
	lost    int
	notSent int
	rolls   int
	took    time.Duration // from the first write to the last new delivery
	catchUp time.Duration // from the last write to the last new delivery
	pods    []podStats
}

type podStats struct {
	name   string
	starts int
	relay.Stats
}

// run writes the messages while rolling the replicas, waits until every row is
// SENT and every key received, and stops everything it started.
func (s *scenario) run(ctx context.Context) (res result, err error) {
	ctx, cancel := context.WithCancel(ctx) // ends the producer on an early return
	defer cancel()
	if err := s.prepareTable(ctx); err != nil {
		return res, err
	}
	if s.rc, err = startReceiver(s.p.delay); err != nil {
		return res, fmt.Errorf("start the receiver: %w", err)
	}
	defer s.rc.close()

	for i := range s.p.replicas {
		p := &pod{name: fmt.Sprintf("pod-%d", i+1)}
		s.pods = append(s.pods, p)
		defer p.stop() // a no-op for a pod stopped already
		if err := p.start(ctx, s); err != nil {
			return res, err
		}
	}

	start := time.Now()
	produced := make(chan error, 1)
	var lastWrite atomic.Int64
	go func() {
		err := s.produce(ctx)
		lastWrite.Store(time.Now().UnixNano())
		produced <- err
	}()

	status := time.NewTicker(100 * time.Millisecond)
	defer status.Stop()
	rollEvery := s.p.writeFor / time.Duration(s.p.rolls+1)
	nextRoll := start.Add(rollEvery)
	var (
		writing  = true
		deadline time.Time
	)
	for done := false; !done; {
		select {
		case <-ctx.Done():
			s.out.finish(s.status(start, res.rolls))
			return res, ctx.Err()
		case err := <-produced:
			if err != nil {
				return res, fmt.Errorf("write the messages: %w", err)
			}
			writing = false
			deadline = time.Now().Add(s.p.deadline)
		case now := <-status.C:
			if writing && res.rolls < s.p.rolls && now.After(nextRoll) {
				if err := s.roll(ctx, s.pods[res.rolls%len(s.pods)]); err != nil {
					return res, err
				}
				res.rolls++
				nextRoll = nextRoll.Add(rollEvery)
			}
			s.out.update(s.status(start, res.rolls))
			if writing {
				continue
			}
			if s.rc.counts().distinct >= int(s.written.Load()) {
				n, err := s.count(ctx, "status <> 'SENT'")
				if err != nil {
					return res, err
				}
				done = n == 0
			}
			if !done && now.After(deadline) {
				// Report what arrived: the verdict counts the rest as lost.
				s.out.printf("  gave up waiting: not everything was delivered %s after the last write", s.p.deadline)
				done = true
			}
		}
	}
	s.out.finish(s.status(start, res.rolls))

	for _, p := range s.pods {
		if err := p.stop(); err != nil {
			return res, err
		}
		res.pods = append(res.pods, p.snapshot())
	}
	res.written = int(s.written.Load())
	res.counts = s.rc.counts()
	res.took = res.counts.lastNew.Sub(start)
	res.catchUp = max(res.counts.lastNew.Sub(time.Unix(0, lastWrite.Load())), 0)
	if res.lost, err = s.lost(ctx); err != nil {
		return res, err
	}
	if res.notSent, err = s.count(ctx, "status <> 'SENT'"); err != nil {
		return res, err
	}
	return res, nil
}

// prepareTable creates the run's table afresh, as relay.CreateTable does at a service's start.
func (s *scenario) prepareTable(ctx context.Context) error {
	if err := s.dropTable(ctx); err != nil {
		return err
	}
	if err := relay.CreateTable(ctx, s.admin, s.table); err != nil {
		return fmt.Errorf("create the table: %w", err)
	}
	return nil
}

func (s *scenario) dropTable(ctx context.Context) error {
	_, err := s.admin.Exec(ctx, "DROP TABLE IF EXISTS "+pgx.Identifier{s.table}.Sanitize())
	return err
}

// produce writes the messages, txSize to a transaction, spread over writeFor,
// as a service writes them along with its business data.
func (s *scenario) produce(ctx context.Context) error {
	txs := (s.p.messages + s.p.txSize - 1) / s.p.txSize
	pace := time.NewTicker(s.p.writeFor / time.Duration(txs))
	defer pace.Stop()
	for i := 0; i < s.p.messages; i += s.p.txSize {
		n := min(s.p.txSize, s.p.messages-i)
		err := pgx.BeginFunc(ctx, s.admin, func(tx pgx.Tx) error {
			// The business data would be written here, in the same transaction.
			for j := i; j < i+n; j++ {
				if err := enqueue(ctx, tx, s.table, j); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
		s.written.Add(int64(n))
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-pace.C:
		}
	}
	return nil
}

// enqueue writes message i, of type "order" and natural key "order-<i>", in tx.
func enqueue(ctx context.Context, tx pgx.Tx, table string, i int) error {
	_, err := relay.Enqueue(ctx, tx, table, relay.Outgoing{
		Type:    "order",
		Key:     orderKey(i),
		Payload: fmt.Appendf(nil, `{"order": %d, "total_cents": %d}`, i, 1000+i%97),
	})
	return err
}

func orderKey(i int) string { return fmt.Sprintf("order-%05d", i) }

// roll replaces one replica, as a rolling deploy does: stop it gracefully (the
// pass in flight finishes its messages and releases the election), close its
// pool, start a fresh one.
func (s *scenario) roll(ctx context.Context, p *pod) error {
	t0 := time.Now()
	if err := p.stop(); err != nil {
		return err
	}
	stopped := time.Since(t0)
	if err := p.start(ctx, s); err != nil {
		return err
	}
	s.out.printf("  rolled %s: stopped gracefully in %.1fms, started again (start #%d)", p.name, float64(stopped.Microseconds())/1000, p.snapshot().starts)
	return nil
}

// status is the live line, short enough for an 80-column terminal.
func (s *scenario) status(start time.Time, rolls int) string {
	c := s.rc.counts()
	return fmt.Sprintf("  %-9s %4.1fs  written %4d/%d  delivered %4d  duplicates %4d  rolls %d/%d",
		s.name, time.Since(start).Seconds(), s.written.Load(), s.p.messages, c.distinct, c.duplicates, rolls, s.p.rolls)
}

// lost counts the rows written whose key the receiver never saw.
func (s *scenario) lost(ctx context.Context) (int, error) {
	rows, err := s.admin.Query(ctx, "SELECT natural_key FROM "+pgx.Identifier{s.table}.Sanitize())
	if err != nil {
		return 0, err
	}
	keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return 0, err
	}
	lost := 0
	for _, k := range keys {
		if !s.rc.received(k) {
			lost++
		}
	}
	return lost, nil
}

func (s *scenario) count(ctx context.Context, where string) (int, error) {
	var n int
	err := s.admin.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{s.table}.Sanitize()+" WHERE "+where).Scan(&n)
	return n, err
}

// pod is one replica of the service: its own pool and its own relay, as a pod
// of a deployment has. Rolling it replaces both.
type pod struct {
	name string

	mu     sync.Mutex
	starts int
	pool   *pgxpool.Pool
	r      *relay.Relay
	past   relay.Stats // totals of the relays this pod ran before the current one
}

func (p *pod) start(ctx context.Context, s *scenario) error {
	pc, err := pgxpool.ParseConfig(s.dbURL)
	if err != nil {
		return err
	}
	// The election holds one connection for the whole pass; each message in
	// flight records its outcome on another.
	pc.MaxConns = int32(s.p.concurrency) + 2
	pc.ConnConfig.RuntimeParams["application_name"] = appName + " " + p.name
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return fmt.Errorf("%s: %w", p.name, err)
	}

	cfg := relay.DefaultConfig()
	cfg.AppName = appName
	cfg.Table = s.table
	cfg.ClusterLock = s.guarded
	cfg.Interval = s.p.interval
	cfg.Concurrency = s.p.concurrency
	cfg.SendTimeout = 5 * time.Second
	cfg.Logger = s.logger.With(slog.String("pod", p.name))
	orders, err := relay.NewHTTPSender(relay.HTTPSenderConfig{
		Type: "order",
		URL:  relay.URLWithKey(s.rc.URL + "/orders"),
	})
	if err != nil {
		pool.Close()
		return err
	}
	r, err := relay.New(pool, cfg, orders)
	if err != nil {
		pool.Close()
		return fmt.Errorf("%s: %w", p.name, err)
	}
	// Start's ctx is not the demo's: Ctrl-C stops the relays gracefully, through stop.
	if err := r.Start(context.Background()); err != nil {
		pool.Close()
		return fmt.Errorf("%s: %w", p.name, err)
	}
	p.mu.Lock()
	p.pool, p.r = pool, r
	p.starts++
	p.mu.Unlock()
	return nil
}

// stop stops the pod's relay, waiting at most 5s for the pass in flight, and
// closes its pool. Stopping a stopped pod does nothing.
func (p *pod) stop() error {
	p.mu.Lock()
	r, pool := p.r, p.pool
	p.mu.Unlock()
	if r == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := r.Stop(ctx)
	pool.Close()

	st := r.Stats()
	p.mu.Lock()
	p.past = addStats(p.past, st)
	p.r, p.pool = nil, nil
	p.mu.Unlock()
	if err != nil {
		return fmt.Errorf("%s: %w", p.name, err)
	}
	return nil
}

// snapshot is the pod's totals over every relay it ran.
func (p *pod) snapshot() podStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.past
	if p.r != nil {
		st = addStats(st, p.r.Stats())
	}
	return podStats{name: p.name, starts: p.starts, Stats: st}
}

func addStats(a, b relay.Stats) relay.Stats {
	a.PassesElected += b.PassesElected
	a.PassesCoalesced += b.PassesCoalesced
	a.Sent += b.Sent
	a.Failed += b.Failed
	a.Dead += b.Dead
	return a
}
