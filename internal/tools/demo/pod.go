package demo

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/xadm/relay"
)

// pod is one replica of the service: its own pool, its own client of the
// destination and its own relay, as a pod of a deployment has. Rolling it
// replaces all three.
type pod struct {
	name string

	mu     sync.Mutex
	starts int
	pool   *pgxpool.Pool
	closer func() // closes the pod's sender
	r      *relay.Relay
	past   relay.Stats // totals of the relays this pod ran before the current one
}

func (p *pod) start(ctx context.Context, s *scenario) error {
	pc, err := pgxpool.ParseConfig(s.o.DBURL)
	if err != nil {
		return err
	}
	// The election holds one connection for the whole pass; each message in
	// flight records its outcome on another.
	pc.MaxConns = int32(s.o.Params.Concurrency) + 2
	pc.ConnConfig.RuntimeParams["application_name"] = s.o.App + " " + p.name
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return fmt.Errorf("%s: %w", p.name, err)
	}
	sender, closer, err := s.dest.Sender()
	if err != nil {
		pool.Close()
		return fmt.Errorf("%s: %w", p.name, err)
	}
	cfg := relay.DefaultConfig()
	cfg.AppName = s.o.App
	cfg.Table = s.table
	cfg.ClusterLock = s.guarded
	cfg.Interval = s.o.Params.Interval
	cfg.Concurrency = s.o.Params.Concurrency
	cfg.SendTimeout = 5 * time.Second
	cfg.Logger = s.o.Logger.With(slog.String("pod", p.name))
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
	p.past = addStats(p.past, st)
	p.r, p.pool, p.closer = nil, nil, nil
	p.mu.Unlock()
	if err != nil {
		return fmt.Errorf("%s: %w", p.name, err)
	}
	return nil
}

// snapshot is the pod's totals over every relay it ran.
func (p *pod) snapshot() PodStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.past
	if p.r != nil {
		st = addStats(st, p.r.Stats())
	}
	return PodStats{Name: p.name, Starts: p.starts, Stats: st}
}

func addStats(a, b relay.Stats) relay.Stats {
	a.PassesElected += b.PassesElected
	a.PassesCoalesced += b.PassesCoalesced
	a.Sent += b.Sent
	a.Failed += b.Failed
	a.Dead += b.Dead
	return a
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
