// Package benchkit is what the repository's measuring tools share: the
// statement-counting pgx tracer, the observer that notes when a drain is
// done, pools, the sender wrappers that show how the engine called a sender,
// the drain benchmarks' common flags, and medians and quantiles. Its users
// are cmd/relaybench, cmd/soak, natsjs/cmd/natsbench,
// kafka/e2e/cmd/kafkabench and the root package's benchmarks and tests; the
// modules among them import it through their replace of the core.
package benchkit

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/xadm/relay"
	"github.com/xadm/relay/internal/testkit/pgtrace"
)

// Tracer is the statement-counting pgx tracer (internal/testkit/pgtrace),
// which the tests that bound round trips share.
type Tracer = pgtrace.Tracer

// Pool opens a pool of at most maxConns connections to url, its sessions
// named name (application_name; "" keeps the URL's), then changed by each
// of configure.
func Pool(ctx context.Context, url, name string, maxConns int32, configure ...func(*pgxpool.Config)) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	pc.MaxConns = maxConns
	if name != "" {
		pc.ConnConfig.RuntimeParams["application_name"] = name
	}
	for _, c := range configure {
		c(pc)
	}
	return pgxpool.NewWithConfig(ctx, pc)
}

// Traced is a Pool option that sets the connections' tracer.
func Traced(t pgx.QueryTracer) func(*pgxpool.Config) {
	return func(pc *pgxpool.Config) { pc.ConnConfig.Tracer = t }
}

// DrainObserver is a relay.Observer that notes when the target-th message was
// recorded SENT, and counts the others.
type DrainObserver struct {
	target int64
	Sent   atomic.Int64
	Failed atomic.Int64 // messages recorded ERROR or dead
	last   atomic.Int64 // unix nanos of the target-th SENT outcome
	done   chan struct{}

	mu      sync.Mutex
	passErr error
}

// NewDrainObserver waits for target messages SENT; 0 only counts.
func NewDrainObserver(target int64) *DrainObserver {
	return &DrainObserver{target: target, done: make(chan struct{})}
}

func (o *DrainObserver) PassDone(p relay.PassReport) {
	if p.Err != nil {
		o.mu.Lock()
		o.passErr = p.Err
		o.mu.Unlock()
	}
}

func (o *DrainObserver) MessageDone(m relay.MessageReport) {
	if m.Outcome != relay.OutcomeSent {
		o.Failed.Add(1)
		return
	}
	if o.Sent.Add(1) == o.target {
		o.last.Store(time.Now().UnixNano())
		close(o.done)
	}
}

// Done is closed when the target-th message was recorded SENT.
func (o *DrainObserver) Done() <-chan struct{} { return o.done }

// Last is when the target-th message was recorded SENT; zero before.
func (o *DrainObserver) Last() time.Time {
	if n := o.last.Load(); n != 0 {
		return time.Unix(0, n)
	}
	return time.Time{}
}

// Err is the error of the last pass that failed, if any.
func (o *DrainObserver) Err() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.passErr
}

// Drain starts r, whose Observer is obs, and waits until obs saw its target
// recorded SENT, for as long as 50 messages a second and 30s more take, then
// stops r (waiting 30s at most for the pass in flight).
func Drain(ctx context.Context, r *relay.Relay, obs *DrainObserver) error {
	if err := r.Start(ctx); err != nil {
		return err
	}
	timeout := time.Duration(obs.target)*time.Second/50 + 30*time.Second // a floor of 50 msg/s
	var waitErr error
	select {
	case <-obs.Done():
	case <-time.After(timeout):
		waitErr = fmt.Errorf("only %d of %d messages sent after %s (%d failed; last pass error: %v)",
			obs.Sent.Load(), obs.target, timeout, obs.Failed.Load(), obs.Err())
	case <-ctx.Done():
		waitErr = ctx.Err()
	}
	stopCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := r.Stop(stopCtx); err != nil && waitErr == nil {
		waitErr = err
	}
	return waitErr
}

// Calls counts how the engine called a sender.
type Calls struct{ Sends, Batches, Batched atomic.Int64 }

// Reset sets the counts to 0.
func (c *Calls) Reset() { c.Sends.Store(0); c.Batches.Store(0); c.Batched.Store(0) }

func (c *Calls) String() string {
	s := fmt.Sprintf("Send %d", c.Sends.Load())
	if n := c.Batches.Load(); n > 0 {
		s += fmt.Sprintf(", SendBatch %d (%.0f msgs each)", n, float64(c.Batched.Load())/float64(n))
	}
	return s
}

// Counted wraps s, a relay.BatchSender, so that c counts its calls.
func Counted(s relay.BatchSender, c *Calls) relay.BatchSender { return counted{s, c} }

type counted struct {
	relay.BatchSender
	c *Calls
}

func (s counted) Send(ctx context.Context, m relay.Message) error {
	s.c.Sends.Add(1)
	return s.BatchSender.Send(ctx, m)
}

func (s counted) SendBatch(ctx context.Context, ms []relay.Message) []error {
	s.c.Batches.Add(1)
	s.c.Batched.Add(int64(len(ms)))
	return s.BatchSender.SendBatch(ctx, ms)
}

// PerMessage hides s's SendBatch: the engine sees a plain relay.Sender.
func PerMessage(s relay.Sender) relay.Sender { return perMessage{s} }

type perMessage struct{ s relay.Sender }

func (p perMessage) Type() string                                    { return p.s.Type() }
func (p perMessage) Send(ctx context.Context, m relay.Message) error { return p.s.Send(ctx, m) }

// Noop is a sender of typ that delivers nothing and succeeds: the relay's
// own ceiling.
func Noop(typ string) relay.Sender {
	return relay.SenderFunc(typ, func(context.Context, relay.Message) error { return nil })
}

// SenderAlone sends ms straight through s, without database or relay, in
// SendBatch calls of batch messages, or one Send at a time unless batched,
// each call bounded by 30s, and returns the messages per second.
func SenderAlone(ctx context.Context, s relay.BatchSender, ms []relay.Message, batch int, batched bool) (float64, error) {
	start := time.Now()
	for lo := 0; lo < len(ms); lo += batch {
		chunk := ms[lo:min(lo+batch, len(ms))]
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		var errs []error
		if batched {
			errs = s.SendBatch(sctx, chunk)
		} else {
			for _, m := range chunk {
				errs = append(errs, s.Send(sctx, m))
			}
		}
		cancel()
		if err := errors.Join(errs...); err != nil {
			return 0, err
		}
	}
	return float64(len(ms)) / time.Since(start).Seconds(), nil
}

// DrainFlags are the flags the broker benchmarks share.
type DrainFlags struct {
	Rows, Batch, Rounds, Concurrency *int
}

// RegisterDrainFlags defines -rows, -batch, -rounds and -concurrency on fs
// (flag.CommandLine if nil) with these defaults.
func RegisterDrainFlags(fs *flag.FlagSet, rows, batch, rounds int) DrainFlags {
	if fs == nil {
		fs = flag.CommandLine
	}
	return DrainFlags{
		Rows:        fs.Int("rows", rows, "rows of the backlog each drain delivers"),
		Batch:       fs.Int("batch", batch, "Config.BatchSize"),
		Rounds:      fs.Int("rounds", rounds, "rounds; the table shows each figure's median"),
		Concurrency: fs.Int("concurrency", 1, "Config.Concurrency"),
	}
}

// Check says which flag is below 1, if one is.
func (f DrainFlags) Check() error {
	for _, v := range []struct {
		name string
		n    int
	}{{"rows", *f.Rows}, {"batch", *f.Batch}, {"rounds", *f.Rounds}, {"concurrency", *f.Concurrency}} {
		if v.n < 1 {
			return fmt.Errorf("-%s must be at least 1, got %d", v.name, v.n)
		}
	}
	return nil
}

// Median is the median of xs, 0 for none.
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// Quantile is the q-quantile of xs (0.5: the median, by the nearest rank
// above), the zero value for none.
func Quantile[T cmp.Ordered](xs []T, q float64) T {
	var zero T
	if len(xs) == 0 {
		return zero
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[min(int(q*float64(len(s))), len(s)-1)]
}
