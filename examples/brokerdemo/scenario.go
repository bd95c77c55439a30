package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/xadm/relay"
)

// appName is the app the demo's replicas belong to: one election for all three.
const appName = "relay-brokerdemo"

// params shape one run of the scenario.
type params struct {
	messages    int           // rows written
	txSize      int           // rows per producer transaction
	writeFor    time.Duration // the writes are spread over this long
	replicas    int           // relays running at once, each with its own pool and client
	rolls       int           // replicas stopped and replaced, one at a time, while writing
	concurrency int           // Config.Concurrency of each replica
	interval    time.Duration // Config.Interval of each replica
	deadline    time.Duration // the most a run may take to deliver everything after the last write
}

func defaultParams(messages int) params {
	return params{messages: messages, txSize: 10, writeFor: 5 * time.Second, replicas: 3, rolls: 6,
		concurrency: 4, interval: 50 * time.Millisecond, deadline: 30 * time.Second}
}

func (p params) rollEvery() time.Duration { return p.writeFor / time.Duration(p.rolls+1) }

// scenario is one run: a fresh table, a fresh destination, N replicas.
type scenario struct {
	guarded bool // Config.ClusterLock
	table   string
	to      string
	p       params
	dbURL   string
	out     io.Writer
	logger  *slog.Logger

	admin   *pgxpool.Pool // the service's own pool, through which it writes its messages
	dest    destination
	written atomic.Int64
	handed  atomic.Int64 // messages given to the senders, by every replica
}

// result is what a run did, as the consumer and the table tell it.
type result struct {
	guarded  bool
	to       string
	written  int
	counts   counts
	lost     int
	notSent  int
	recorded int64 // SENT outcomes the relays recorded
	handed   int64 // messages the relays handed to their senders, copies included
	took     time.Duration
	pods     []podStats
}

// ok reports whether the run lost nothing and, for a guarded run, delivered no
// duplicate that a retry does not explain.
func (r result) ok() bool {
	return r.lost == 0 && r.notSent == 0 && r.counts.distinct == r.written && (!r.guarded || r.counts.unexplained == 0)
}

func (r result) report(out io.Writer) {
	c := r.counts
	fmt.Fprintf(out, "  written     %6d messages, in transactions of 10\n", r.written)
	fmt.Fprintf(out, "  delivered   %6d distinct messages, as the consumer counted them by Relay-Message-Id (%d copies)\n", c.distinct, c.copies)
	fmt.Fprintf(out, "  duplicates  %6d copies of a message already consumed (%d of them a retry after a recorded failure)\n", c.duplicates, c.duplicates-c.unexplained)
	switch d := r.handed - int64(r.counts.copies); {
	case d <= 0:
	case r.to == "nats":
		fmt.Fprintf(out, "  discarded   %6d copies the relays published (%d in all) that the stream dropped as duplicates (Nats-Msg-Id)\n", d, r.handed)
	default:
		fmt.Fprintf(out, "  failed      %6d sends that reached no consumer and were retried (%d handed to the senders in all)\n", d, r.handed)
	}
	fmt.Fprintf(out, "  lost        %6d written but never consumed\n", r.lost)
	fmt.Fprintf(out, "  recorded    %6d SENT by the relays (sum of Stats().Sent); rows not SENT in the table: %d\n", r.recorded, r.notSent)
	fmt.Fprintf(out, "  throughput  %6.0f msg/s, the writer's pace, in %.1fs\n", float64(c.distinct)/r.took.Seconds(), r.took.Seconds())
	for _, p := range r.pods {
		fmt.Fprintf(out, "  %s  %d starts  passes: %4d run, %4d coalesced  sent %5d\n", p.name, p.starts, p.PassesElected, p.PassesCoalesced, p.Sent)
	}
}

// run writes the messages while rolling the replicas, waits until every row is
// SENT and every message consumed, and stops everything it started.
func (s *scenario) run(ctx context.Context) (res result, err error) {
	ctx, cancel := context.WithCancel(ctx) // ends the producer on an early return
	defer cancel()
	res.guarded, res.to = s.guarded, s.to
	if s.admin, err = pgxpool.New(ctx, s.dbURL); err != nil {
		return res, err
	}
	defer s.admin.Close()
	drop := "DROP TABLE IF EXISTS " + pgx.Identifier{s.table}.Sanitize()
	if _, err := s.admin.Exec(ctx, drop); err != nil {
		return res, err
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, _ = s.admin.Exec(dctx, drop)
	}()
	if err := relay.CreateTable(ctx, s.admin, s.table); err != nil {
		return res, fmt.Errorf("create the table: %w", err)
	}
	if s.dest, err = destinations[s.to].start(ctx); err != nil {
		return res, fmt.Errorf("start %s: %w", s.to, err)
	}
	defer s.dest.close()

	pods := make([]*pod, s.p.replicas)
	for i := range pods {
		pods[i] = &pod{name: fmt.Sprintf("pod-%d", i+1)}
		defer pods[i].stop() // a no-op for a pod stopped already
		if err := pods[i].start(ctx, s); err != nil {
			return res, err
		}
	}

	start := time.Now()
	produced := make(chan error, 1)
	go func() { produced <- s.produce(ctx) }()

	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	nextRoll, nextStatus := start.Add(s.p.rollEvery()), start.Add(time.Second)
	rolls, writing := 0, true
	var deadline time.Time
	for done := false; !done; {
		select {
		case <-ctx.Done():
			return res, ctx.Err()
		case err := <-produced:
			if err != nil {
				return res, fmt.Errorf("write the messages: %w", err)
			}
			writing, deadline = false, time.Now().Add(s.p.deadline)
		case now := <-tick.C:
			if writing && rolls < s.p.rolls && now.After(nextRoll) {
				p := pods[rolls%len(pods)]
				if err := p.stop(); err != nil {
					return res, err
				}
				if err := p.start(ctx, s); err != nil {
					return res, err
				}
				rolls++
				nextRoll = nextRoll.Add(s.p.rollEvery())
				fmt.Fprintf(s.out, "  rolled %s (start #%d)\n", p.name, p.snapshot().starts)
			}
			c := s.dest.tally().counts()
			if now.After(nextStatus) {
				nextStatus = nextStatus.Add(time.Second)
				fmt.Fprintf(s.out, "  %4.1fs  written %4d/%d  delivered %4d  duplicates %4d  rolls %d/%d\n",
					time.Since(start).Seconds(), s.written.Load(), s.p.messages, c.distinct, c.duplicates, rolls, s.p.rolls)
			}
			if writing {
				continue
			}
			if c.distinct >= int(s.written.Load()) {
				n, err := s.count(ctx, "status <> 'SENT'")
				if err != nil {
					return res, err
				}
				done = n == 0
			}
			if !done && now.After(deadline) {
				fmt.Fprintf(s.out, "  gave up waiting: not everything was delivered %s after the last write\n", s.p.deadline)
				done = true
			}
		}
	}
	res.took = time.Since(start)
	for _, p := range pods {
		if err := p.stop(); err != nil {
			return res, err
		}
		st := p.snapshot()
		res.pods = append(res.pods, st)
		res.recorded += st.Sent
	}
	res.written = int(s.written.Load())
	res.counts = s.dest.tally().counts()
	res.handed = s.handed.Load()
	if res.lost, err = s.lost(ctx); err != nil {
		return res, err
	}
	if res.notSent, err = s.count(ctx, "status <> 'SENT'"); err != nil {
		return res, err
	}
	return res, nil
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
				_, err := relay.Enqueue(ctx, tx, s.table, relay.Outgoing{
					Type:    "order",
					Key:     fmt.Sprintf("order-%05d", j),
					Payload: fmt.Appendf(nil, `{"order": %d, "total_cents": %d}`, j, 1000+j%97),
				})
				if err != nil {
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

// lost counts the rows written whose id the consumer never saw.
func (s *scenario) lost(ctx context.Context) (int, error) {
	rows, err := s.admin.Query(ctx, "SELECT id FROM "+pgx.Identifier{s.table}.Sanitize())
	if err != nil {
		return 0, err
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return 0, err
	}
	lost := 0
	for _, id := range ids {
		if !s.dest.tally().received(id) {
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

// pod is one replica of the service: its own pool, its own client of the
// destination and its own relay. Rolling it replaces all three.
type pod struct {
	name string

	mu     sync.Mutex
	starts int
	pool   *pgxpool.Pool
	closer func() // closes the pod's sender
	r      *relay.Relay
	past   relay.Stats // totals of the relays this pod ran before the current one
}

type podStats struct {
	name   string
	starts int
	relay.Stats
}

func (p *pod) start(ctx context.Context, s *scenario) error {
	pc, err := pgxpool.ParseConfig(s.dbURL)
	if err != nil {
		return err
	}
	pc.MaxConns = int32(s.p.concurrency) + 2
	pc.ConnConfig.RuntimeParams["application_name"] = appName + " " + p.name
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return fmt.Errorf("%s: %w", p.name, err)
	}
	sender, closer, err := s.dest.sender()
	if err != nil {
		pool.Close()
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
	r, err := relay.New(pool, cfg, counted(sender, &s.handed))
	if err == nil {
		// Not the demo's ctx: Ctrl-C stops the relays gracefully, through stop.
		err = r.Start(context.Background())
	}
	if err != nil {
		closer()
		pool.Close()
		return fmt.Errorf("%s: %w", p.name, err)
	}
	p.mu.Lock()
	p.pool, p.closer, p.r = pool, closer, r
	p.starts++
	p.mu.Unlock()
	return nil
}

// stop stops the pod's relay gracefully, waiting at most 5s for the pass in
// flight, then closes its sender and its pool. Stopping a stopped pod does nothing.
func (p *pod) stop() error {
	p.mu.Lock()
	r, pool, closer := p.r, p.pool, p.closer
	p.mu.Unlock()
	if r == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := r.Stop(ctx)
	closer()
	pool.Close()
	st := r.Stats()
	p.mu.Lock()
	p.past.PassesElected += st.PassesElected
	p.past.PassesCoalesced += st.PassesCoalesced
	p.past.Sent += st.Sent
	p.r, p.pool, p.closer = nil, nil, nil
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
		cur := p.r.Stats()
		st.PassesElected += cur.PassesElected
		st.PassesCoalesced += cur.PassesCoalesced
		st.Sent += cur.Sent
	}
	return podStats{name: p.name, starts: p.starts, Stats: st}
}

// counted wraps s so that n counts the messages the relay hands it, keeping
// s a relay.BatchSender if it is one.
func counted(s relay.Sender, n *atomic.Int64) relay.Sender {
	c := counting{s, n}
	if b, ok := s.(relay.BatchSender); ok {
		return countingBatch{c, b}
	}
	return c
}

type counting struct {
	relay.Sender
	n *atomic.Int64
}

func (c counting) Send(ctx context.Context, m relay.Message) error {
	c.n.Add(1)
	return c.Sender.Send(ctx, m)
}

type countingBatch struct {
	counting
	b relay.BatchSender
}

func (c countingBatch) SendBatch(ctx context.Context, ms []relay.Message) []error {
	c.n.Add(int64(len(ms)))
	return c.b.SendBatch(ctx, ms)
}
