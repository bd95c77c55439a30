// Package demo is the scenario that examples/demo and examples/brokerdemo
// both run: N replicas of one app, each with its own pool and its own client
// of the destination, as N pods would have, deliver the messages a writer
// commits in transactions while the replicas are rolled one at a time; a
// Tally at the destination counts the copies of each message. It runs once
// with the election (ClusterLock = true) and, if asked, once with the escape
// hatch (ClusterLock = false), each on a fresh table and destination.
//
// The destinations that need a broker (Kafka, NATS) live in
// examples/brokerdemo, a module of its own; this package, in the core
// module, has only the HTTP receiver.
package demo

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/xadm/relay"
)

// OrderType is the type of the messages the scenario writes.
const OrderType = "order"

// Destination is where a run delivers, and what counts what arrived.
type Destination interface {
	// Sender returns a new sender of OrderType with its own client, for one
	// replica, and the function that closes it.
	Sender() (relay.Sender, func(), error)
	// Tally is what arrived.
	Tally() *Tally
	// Close stops the destination.
	Close()
}

// Params shape a run.
type Params struct {
	Messages    int           // messages written
	TxSize      int           // messages per transaction
	WriteFor    time.Duration // how long the writing is spread over
	Replicas    int           // relays running at once, each with its own pool and client
	Rolls       int           // replicas replaced while writing
	Concurrency int           // Config.Concurrency of each relay
	Interval    time.Duration // Config.Interval of each relay
	Deadline    time.Duration // how long after the last write a run waits for the rest
}

// DefaultParams are the demos' parameters for messages messages.
func DefaultParams(messages int) Params {
	return Params{Messages: messages, TxSize: 10, WriteFor: 5 * time.Second, Replicas: 3, Rolls: 6,
		Concurrency: 4, Interval: 50 * time.Millisecond, Deadline: 30 * time.Second}
}

// RollEvery is the time between two rolls.
func (p Params) RollEvery() time.Duration { return p.WriteFor / time.Duration(p.Rolls+1) }

// Options configure [Run].
type Options struct {
	App    string // the app the replicas belong to: one election for all
	Tables string // the runs' tables are Tables+"_guarded" and Tables+"_unguarded"
	Title  string // the destination, as the run's heading names it
	Start  func(ctx context.Context) (Destination, error)
	// Dropped says, in the report, what the copies handed to the senders but
	// never received became ("reached no consumer and were retried").
	Dropped   string
	Params    Params
	DBURL     string
	Out       *Progress
	Logger    *slog.Logger // the relays' logger
	Unguarded bool         // run the escape hatch after the guarded run
}

// Result is what a run did, as the destination and the table tell it.
type Result struct {
	Guarded  bool
	Written  int
	Counts   Counts
	Lost     int           // written but never received
	NotSent  int           // rows not SENT at the end
	Rolls    int           // replicas replaced
	Recorded int64         // SENT outcomes the relays recorded
	Handed   int64         // messages the relays handed to their senders, copies included
	Took     time.Duration // from the first write to the last new delivery
	CatchUp  time.Duration // from the last write to the last new delivery
	Pods     []PodStats
}

// PodStats are one replica's totals over every relay it ran.
type PodStats struct {
	Name   string
	Starts int
	relay.Stats
}

// OK reports whether the run lost nothing and, for a guarded run, delivered
// no duplicate that a retry does not explain.
func (r Result) OK() bool {
	return r.Lost == 0 && r.NotSent == 0 && r.Counts.Distinct == r.Written && (!r.Guarded || r.Counts.Unexplained == 0)
}

// Run runs the guarded scenario, then the unguarded one if o.Unguarded, and
// prints each one's report.
func Run(ctx context.Context, o Options) ([]Result, error) {
	p := o.Params
	runs := []struct {
		name, title string
		guarded     bool
	}{
		{"guarded", fmt.Sprintf("1. Guarded: %d replicas of app %q (ClusterLock = true) deliver %d messages\n   to %s; a replica is rolled every %s.",
			p.Replicas, o.App, p.Messages, o.Title, p.RollEvery().Round(time.Millisecond)), true},
		{"unguarded", "2. Unguarded: the same with ClusterLock = false (the escape hatch), on a fresh table.", false},
	}
	if !o.Unguarded {
		runs = runs[:1]
	}
	var results []Result
	for _, r := range runs {
		o.Out.Printf("\n%s", r.title)
		s := &scenario{o: o, name: r.name, guarded: r.guarded, table: o.Tables + "_" + r.name}
		res, err := s.run(ctx)
		if err != nil {
			return results, err
		}
		res.report(o.Out, o.Dropped)
		results = append(results, res)
	}
	return results, nil
}

// scenario is one run: a fresh table, a fresh destination, N replicas.
type scenario struct {
	o       Options
	name    string
	guarded bool
	table   string
	admin   *pgxpool.Pool // the service's own pool, through which it writes its messages
	dest    Destination
	written atomic.Int64
	handed  atomic.Int64 // messages given to the senders, by every replica
}

// run writes the messages while rolling the replicas, waits until every row is
// SENT and every message received, and stops everything it started.
func (s *scenario) run(ctx context.Context) (res Result, err error) {
	ctx, cancel := context.WithCancel(ctx) // ends the producer on an early return
	defer cancel()
	p := s.o.Params
	res.Guarded = s.guarded
	if s.admin, err = pgxpool.New(ctx, s.o.DBURL); err != nil {
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
	// As a service does at its start.
	if err := relay.CreateTable(ctx, s.admin, s.table); err != nil {
		return res, fmt.Errorf("create the table: %w", err)
	}
	if s.dest, err = s.o.Start(ctx); err != nil {
		return res, fmt.Errorf("start the destination: %w", err)
	}
	defer s.dest.Close()

	pods := make([]*pod, p.Replicas)
	for i := range pods {
		pods[i] = &pod{name: fmt.Sprintf("pod-%d", i+1)}
		defer pods[i].stop() // a no-op for a pod stopped already
		if err := pods[i].start(ctx, s); err != nil {
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

	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	nextRoll := start.Add(p.RollEvery())
	writing := true
	var deadline time.Time
	for done := false; !done; {
		select {
		case <-ctx.Done():
			s.o.Out.Finish(s.status(start, res.Rolls))
			return res, ctx.Err()
		case err := <-produced:
			if err != nil {
				return res, fmt.Errorf("write the messages: %w", err)
			}
			writing, deadline = false, time.Now().Add(p.Deadline)
		case now := <-tick.C:
			if writing && res.Rolls < p.Rolls && now.After(nextRoll) {
				if err := s.roll(ctx, pods[res.Rolls%len(pods)]); err != nil {
					return res, err
				}
				res.Rolls++
				nextRoll = nextRoll.Add(p.RollEvery())
			}
			s.o.Out.Update(s.status(start, res.Rolls))
			if writing {
				continue
			}
			if s.dest.Tally().Counts().Distinct >= int(s.written.Load()) {
				n, err := s.count(ctx, "status <> 'SENT'")
				if err != nil {
					return res, err
				}
				done = n == 0
			}
			if !done && now.After(deadline) {
				// Report what arrived: the verdict counts the rest as lost.
				s.o.Out.Printf("  gave up waiting: not everything was delivered %s after the last write", p.Deadline)
				done = true
			}
		}
	}
	s.o.Out.Finish(s.status(start, res.Rolls))

	for _, p := range pods {
		if err := p.stop(); err != nil {
			return res, err
		}
		st := p.snapshot()
		res.Pods = append(res.Pods, st)
		res.Recorded += st.Sent
	}
	res.Written = int(s.written.Load())
	res.Counts = s.dest.Tally().Counts()
	res.Handed = s.handed.Load()
	res.Took = max(res.Counts.LastNew.Sub(start), 0)
	res.CatchUp = max(res.Counts.LastNew.Sub(time.Unix(0, lastWrite.Load())), 0)
	if res.Lost, err = s.lost(ctx); err != nil {
		return res, err
	}
	if res.NotSent, err = s.count(ctx, "status <> 'SENT'"); err != nil {
		return res, err
	}
	return res, nil
}

// produce writes the messages, TxSize to a transaction, spread over WriteFor,
// as a service writes them along with its business data.
func (s *scenario) produce(ctx context.Context) error {
	p := s.o.Params
	txs := (p.Messages + p.TxSize - 1) / p.TxSize
	pace := time.NewTicker(p.WriteFor / time.Duration(txs))
	defer pace.Stop()
	for i := 0; i < p.Messages; i += p.TxSize {
		n := min(p.TxSize, p.Messages-i)
		err := pgx.BeginFunc(ctx, s.admin, func(tx pgx.Tx) error {
			// The business data would be written here, in the same transaction.
			for j := i; j < i+n; j++ {
				_, err := relay.Enqueue(ctx, tx, s.table, relay.Outgoing{
					Type:    OrderType,
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

// roll replaces one replica, as a rolling deploy does: stop it gracefully (the
// pass in flight finishes its messages and releases the election), close its
// pool and client, start fresh ones.
func (s *scenario) roll(ctx context.Context, p *pod) error {
	t0 := time.Now()
	if err := p.stop(); err != nil {
		return err
	}
	stopped := time.Since(t0)
	if err := p.start(ctx, s); err != nil {
		return err
	}
	s.o.Out.Printf("  rolled %s: stopped gracefully in %.1fms, started again (start #%d)", p.name, float64(stopped.Microseconds())/1000, p.snapshot().Starts)
	return nil
}

// status is the live line, short enough for an 80-column terminal.
func (s *scenario) status(start time.Time, rolls int) string {
	c := s.dest.Tally().Counts()
	return fmt.Sprintf("  %-9s %4.1fs  written %4d/%d  delivered %4d  duplicates %4d  rolls %d/%d",
		s.name, time.Since(start).Seconds(), s.written.Load(), s.o.Params.Messages, c.Distinct, c.Duplicates, rolls, s.o.Params.Rolls)
}

// lost counts the rows written whose id the destination never received.
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
		if !s.dest.Tally().Received(id) {
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

// report prints one run's result; dropped says what the copies handed to the
// senders but never received became.
func (r Result) report(out *Progress, dropped string) {
	c := r.Counts
	out.Printf("  written     %6d messages, in transactions of 10", r.Written)
	out.Printf("  delivered   %6d distinct messages, as the destination counted them by Relay-Message-Id (%d copies)", c.Distinct, c.Copies)
	out.Printf("  duplicates  %6d copies of a message already received (%d of them a retry after a recorded failure)", c.Duplicates, c.Duplicates-c.Unexplained)
	if d := r.Handed - int64(c.Copies); d > 0 {
		out.Printf("  dropped     %6d copies the relays handed to their senders (%d in all) that %s", d, r.Handed, dropped)
	}
	out.Printf("  lost        %6d written but never received", r.Lost)
	out.Printf("  recorded    %6d SENT by the relays (sum of Stats().Sent); rows not SENT in the table: %d", r.Recorded, r.NotSent)
	out.Printf("  throughput  %6.0f msg/s, the writer's pace: the last message arrived %dms after it was written",
		float64(c.Distinct)/max(r.Took.Seconds(), 1e-3), r.CatchUp.Milliseconds())
	for _, p := range r.Pods {
		out.Printf("  %s  %d starts  passes: %4d run, %4d coalesced  sent %5d", p.Name, p.Starts, p.PassesElected, p.PassesCoalesced, p.Sent)
	}
}

// Hushed drops h's records once ctx is done: a Ctrl-C in a terminal reaches a
// local PostgreSQL too, and the relays' complaints about it say nothing new.
func Hushed(ctx context.Context, h slog.Handler) slog.Handler { return hushed{h, ctx} }

type hushed struct {
	slog.Handler
	ctx context.Context
}

func (h hushed) Enabled(ctx context.Context, l slog.Level) bool {
	return h.ctx.Err() == nil && h.Handler.Enabled(ctx, l)
}
func (h hushed) WithAttrs(as []slog.Attr) slog.Handler { return hushed{h.Handler.WithAttrs(as), h.ctx} }
func (h hushed) WithGroup(name string) slog.Handler    { return hushed{h.Handler.WithGroup(name), h.ctx} }
