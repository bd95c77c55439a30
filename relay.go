package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Timings of the pass.
const (
	// outcomeTimeout bounds the short transaction that records one outcome. It
	// runs even when the pass was cancelled: the send already happened.
	outcomeTimeout = 10 * time.Second
	// fetchTimeout bounds the select of a batch, connection included, so an
	// unreachable database fails the pass instead of hanging the ticker.
	fetchTimeout = 30 * time.Second
	// failureLogEvery is the longest a failing streak goes without an Error line.
	failureLogEvery = 5 * time.Minute
	// lastErrorMax is how much of a sender's error last_error keeps.
	lastErrorMax = 2000
)

// Relay delivers the outbound rows of one outbox table through its senders.
// Build it with [New]; it is safe for concurrent use, and its passes never
// overlap within one process.
type Relay struct {
	pool     *pgxpool.Pool
	cfg      Config
	logger   *slog.Logger
	repo     *repository
	senders  map[string]Sender
	types    []string
	guard    Guard
	key      string
	observer Observer
	stats    counters

	// sendTimedOut is the cause of a send's context when SendTimeout elapses,
	// built once rather than for every message.
	sendTimedOut error

	// pass is a one-slot semaphore: one pass of this relay at a time.
	pass chan struct{}

	mu     sync.Mutex
	ticker *ticker

	streakMu     sync.Mutex
	streak       int       // passes failed in a row, for the log's backoff
	streakLogged time.Time // when a failure of the streak was last logged at Error
}

// New returns a relay that drains cfg.Table through senders, one per type.
// cfg must come from [DefaultConfig] or [ConfigFromEnv]; New refuses a Config
// built any other way, bad values (the error names the field), and nil senders,
// empty or duplicate types.
//
// With ClusterLock and no Guard, the relay elects with a [PostgresGuard] on
// pool, which holds one connection for the whole pass while the pass works on
// others: pool must allow at least 2 connections.
func New(pool *pgxpool.Pool, cfg Config, senders ...Sender) (*Relay, error) {
	if pool == nil {
		return nil, errors.New("relay: New needs a *pgxpool.Pool, got nil")
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if len(senders) == 0 {
		return nil, errors.New("relay: New needs at least one Sender: the relay drains only the types it has senders for")
	}
	byType := make(map[string]Sender, len(senders))
	for i, s := range senders {
		if s == nil {
			return nil, fmt.Errorf("relay: sender %d is nil", i)
		}
		t := s.Type()
		if strings.TrimSpace(t) == "" {
			return nil, fmt.Errorf("relay: sender %d (%T) has an empty type", i, s)
		}
		if _, dup := byType[t]; dup {
			return nil, fmt.Errorf("relay: two senders for type %q: each type has exactly one sender", t)
		}
		byType[t] = s
	}
	repo, err := newRepository(cfg.Table, cfg.RetryBackoff, cfg.AsyncCommit)
	if err != nil {
		return nil, &FieldError{Field: "Table", msg: err.Error()}
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.Default()
	}
	logger = logger.With(slog.String("component", "relay"), slog.String("app", cfg.AppName))
	r := &Relay{
		pool:     pool,
		cfg:      cfg,
		logger:   logger,
		repo:     repo,
		senders:  byType,
		types:    slices.Sorted(maps.Keys(byType)),
		guard:    cfg.Guard,
		key:      cfg.lockKey(),
		observer: cfg.Observer,
		pass:     make(chan struct{}, 1),

		sendTimedOut: fmt.Errorf("send timed out after %s", cfg.SendTimeout),
	}
	if r.guard == nil {
		g := NewPostgresGuard(pool)
		g.logger = logger
		r.guard = g
	}
	// The election would hold the pool's only connection while the pass waits
	// for another: fail now rather than at every pass.
	if g, ok := r.guard.(*PostgresGuard); ok && g.pool == pool && cfg.ClusterLock {
		if n := pool.Config().MaxConns; n < 2 {
			return nil, fmt.Errorf("relay: the pool allows %d connection; the election holds one for the whole pass "+
				"and the pass needs another: set pool_max_conns to at least 2", n)
		}
	}
	if !cfg.ClusterLock {
		logger.Warn("relay: ClusterLock is off: every replica of this app drains the same rows at the same time, " +
			"and each message they share is delivered more than once (decision 0035's avoidable duplication)")
	}
	return r, nil
}

// Run runs one direct pass, without election: it selects a batch of at most
// BatchSize deliverable rows and delivers them. It is for tests and for "run
// now"; replicas that must not duplicate each other use [Relay.RunIfElected].
// It waits for a pass of this relay already in flight. It returns how many rows
// it processed (recorded sent or failed).
func (r *Relay) Run(ctx context.Context) (int, error) {
	res := r.direct(ctx, nil)
	return res.processed(), res.err
}

// direct runs a pass without election, after waiting for a pass of this relay
// already in flight.
func (r *Relay) direct(ctx context.Context, o *passOpts) passResult {
	select {
	case r.pass <- struct{}{}:
	case <-ctx.Done():
		return passResult{err: ctx.Err()}
	}
	defer func() { <-r.pass }()
	start := time.Now()
	res := r.passes(ctx, o)
	res.ran = true
	r.passDone(res, start)
	return res
}

// RunIfElected runs the same pass as [Relay.Run] under the election for
// AppName + "_relay_m2m". It reports true when it ran (it won the election, or
// ClusterLock is off and it ran a direct pass) and false when it coalesced:
// another session, in this process or another (a JVM relay among them), held
// the election, and nothing was dispatched. Enabled does not apply to it.
//
// If the election is lost mid-pass, the pass stops before its next message and
// the error wraps [ErrElectionLost].
func (r *Relay) RunIfElected(ctx context.Context) (bool, error) {
	res, ran := r.runIfElected(ctx, nil)
	return ran, res.err
}

// passOpts tune the periodic pass; the direct and elected passes use none.
type passOpts struct {
	halt  <-chan struct{} // closed: start no new message or batch (graceful stop)
	drain bool            // take batches while they come back full
}

// runIfElected is RunIfElected, with the periodic tick's options.
func (r *Relay) runIfElected(ctx context.Context, o *passOpts) (passResult, bool) {
	if !r.cfg.ClusterLock {
		res := r.direct(ctx, o)
		return res, res.ran
	}
	select {
	case r.pass <- struct{}{}:
	default:
		// A pass of this relay is in flight: it holds the election, so this
		// one coalesces like any other loser.
		r.passDone(passResult{}, time.Now())
		return passResult{}, false
	}
	defer func() { <-r.pass }()
	start := time.Now()
	var res passResult
	ran, err := r.guard.TryRun(ctx, r.key, func(ctx context.Context) error {
		res = r.passes(ctx, o)
		return res.err
	})
	res.err = err
	res.ran = ran
	r.passDone(res, start)
	return res, ran
}

// passes runs one batch, or, when the periodic pass drains, batches for as
// long as [Relay.drain] says, under whatever election the caller holds.
func (r *Relay) passes(ctx context.Context, o *passOpts) passResult {
	if o != nil && o.drain {
		return r.drain(ctx, o)
	}
	return r.batch(ctx, o)
}

// drainMax bounds how long one election keeps draining a backlog before it
// lets go and the next tick elects again at once.
const drainMax = 10 * time.Second

func halted(ctx context.Context, o *passOpts) bool {
	if ctx.Err() != nil {
		return true
	}
	if o == nil || o.halt == nil {
		return false
	}
	select {
	case <-o.halt:
		return true
	default:
		return false
	}
}

// passResult is what a pass, or a batch of it, did.
type passResult struct {
	sent, failed, dead int
	lag                time.Duration
	backlog            bool // draining stopped at drainMax with rows left
	ran                bool // the pass ran: elected, or direct
	err                error
}

func (p *passResult) processed() int { return p.sent + p.failed + p.dead }

// coalesced says another session held the election: the pass neither ran nor failed.
func (p *passResult) coalesced() bool { return !p.ran && p.err == nil }

func (r *Relay) passDone(res passResult, start time.Time) {
	rep := PassReport{
		Ran:       res.ran,
		Coalesced: res.coalesced(),
		Sent:      res.sent,
		Failed:    res.failed,
		Dead:      res.dead,
		Duration:  time.Since(start),
		Lag:       res.lag,
		Err:       res.err,
	}
	r.stats.passDone(rep)
	if r.observer != nil {
		r.observer.PassDone(rep)
	}
	attrs := []slog.Attr{
		slog.Bool("ran", res.ran),
		slog.Int("sent", res.sent),
		slog.Int("failed", res.failed),
		slog.Int("dead", res.dead),
		slog.Duration("duration", rep.Duration),
	}
	ctx := context.Background()
	failed := res.err != nil && !errors.Is(res.err, context.Canceled)
	// While the database is away every pass fails the same way: log the 1st,
	// 2nd, 4th, 8th… failure of a streak, and at least one every
	// failureLogEvery, the rest at Debug.
	level := slog.LevelDebug
	r.streakMu.Lock()
	streak := r.streak
	if failed {
		r.streak++
		streak = r.streak
		if streak&(streak-1) == 0 || time.Since(r.streakLogged) >= failureLogEvery {
			level = slog.LevelError
			r.streakLogged = time.Now()
		}
	} else {
		r.streak = 0
	}
	r.streakMu.Unlock()
	switch {
	case failed:
		r.logger.LogAttrs(ctx, level, "relay: pass failed",
			append(attrs, slog.Int("consecutive_failures", streak), slog.String("error", res.err.Error()))...)
	case streak > 0:
		r.logger.LogAttrs(ctx, slog.LevelInfo, "relay: passes succeed again", append(attrs, slog.Int("after_failures", streak))...)
	case res.processed() > 0:
		r.logger.LogAttrs(ctx, slog.LevelInfo, "relay: pass delivered", append(attrs, slog.Duration("lag", res.lag))...)
	default:
		r.logger.LogAttrs(ctx, slog.LevelDebug, "relay: pass", attrs...)
	}
}

// Stats returns a snapshot of what the relay did since New.
func (r *Relay) Stats() Stats { return r.stats.snapshot() }

// batch selects one batch outside any transaction and delivers it, each outcome
// in its own short transaction. Messages of one natural key go in id order, one
// at a time; after one of them fails, the rest of that key wait for a later pass.
func (r *Relay) batch(ctx context.Context, o *passOpts) passResult {
	if halted(ctx, o) {
		return passResult{err: context.Cause(ctx)}
	}
	rows, err := r.fetch(ctx)
	if err != nil {
		return passResult{err: err}
	}
	var res passResult
	if len(rows) == 0 {
		return res
	}
	res.lag = max(time.Since(rows[0].CreatedAt), 0)

	groups := byKey(rows)
	rec := r.newRecorder(ctx, &res)
	var next atomic.Int64
	work := func() {
		for {
			i := int(next.Add(1)) - 1
			if i >= len(groups) {
				return
			}
			if _, stop := r.deliverKey(ctx, o, rec, groups[i]); stop {
				return
			}
		}
	}
	var wg sync.WaitGroup
	for range min(r.cfg.Concurrency, len(groups)) - 1 {
		wg.Go(work)
	}
	work()
	wg.Wait()
	if err := rec.flush(); err != nil {
		res.err = err
	} else if ctx.Err() != nil {
		res.err = context.Cause(ctx)
	}
	return res
}

// fetch selects one batch, outside any transaction.
func (r *Relay) fetch(ctx context.Context) ([]row, error) {
	fctx, cancel := context.WithTimeout(ctx, fetchTimeout)
	defer cancel()
	rows, err := r.repo.fetch(fctx, r.pool, r.cfg.MaxAttempts, r.types, r.cfg.BatchSize)
	if err != nil && fctx.Err() == nil {
		// Once more: a connection that died in a failover fails its first statement.
		rows, err = r.repo.fetch(fctx, r.pool, r.cfg.MaxAttempts, r.types, r.cfg.BatchSize)
	}
	if err != nil {
		if ctx.Err() != nil {
			err = context.Cause(ctx)
		}
		return nil, fmt.Errorf("relay: select a batch from %s: %w", r.cfg.Table, err)
	}
	return rows, nil
}

// deliverKey delivers the messages of one natural key, in id order, one at a
// time, and records each outcome. It stops at the first message that is not
// sent: the rest of that key wait for a later pass instead of overtaking it.
// It reports whether every message was sent, and whether the whole pass must
// stop (halted, or a recording failed).
func (r *Relay) deliverKey(ctx context.Context, o *passOpts, rec *recorder, group []*row) (allSent, stop bool) {
	for _, m := range group {
		if halted(ctx, o) || rec.errorOf() != nil {
			return false, true
		}
		d := r.deliver(ctx, m)
		if d.out == outcomeInterrupted {
			return false, true
		}
		if rec.add(d) != nil {
			return false, true
		}
		if d.out != outcomeSent {
			return false, false
		}
	}
	return true, false
}

// byKey splits a batch, in id order, into runs of one natural key each, in the
// order of each key's first id.
func byKey(rows []row) [][]*row {
	index := make(map[string]int, len(rows))
	groups := make([][]*row, 0, len(rows))
	for i := range rows {
		m := &rows[i]
		g, ok := index[m.Key]
		if !ok {
			g = len(groups)
			index[m.Key] = g
			groups = append(groups, nil)
		}
		groups[g] = append(groups[g], m)
	}
	return groups
}

// deliver sends one message and says what became of it; recording it is the
// recorder's job.
func (r *Relay) deliver(ctx context.Context, m *row) delivery {
	start := time.Now()
	err := r.send(ctx, r.senders[m.Type], m.Message)
	d := delivery{m: m, sendErr: err, took: time.Since(start)}
	switch {
	case err == nil:
		d.out = outcomeSent
	case ctx.Err() != nil:
		// Our own cancellation (stop, lost election) cut the send short: its
		// outcome is unknown, so the row stays as read and a later pass re-sends it.
		r.logger.LogAttrs(ctx, slog.LevelDebug, "relay: send interrupted",
			slog.Int64("id", m.ID), slog.String("type", m.Type), slog.String("error", err.Error()))
		d.out = outcomeInterrupted
	case IsPermanent(err) || m.Attempts+1 >= r.cfg.MaxAttempts:
		d.out = outcomeDead
	default:
		d.out = outcomeFailed
	}
	return d
}

// send calls s.Send under SendTimeout in its own goroutine, so that a panic
// becomes an error and a sender that ignores its context cannot hold the pass
// past SendTimeout: such a sender is abandoned, and the log says so.
func (r *Relay) send(ctx context.Context, s Sender, m Message) error {
	sctx, cancel := context.WithTimeoutCause(ctx, r.cfg.SendTimeout, r.sendTimedOut)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		defer func() {
			if p := recover(); p != nil {
				r.logger.LogAttrs(ctx, slog.LevelError, "relay: sender panicked",
					slog.Int64("id", m.ID), slog.String("type", m.Type), slog.Any("panic", p), slog.String("stack", string(debug.Stack())))
				done <- fmt.Errorf("sender panicked: %v", p)
			}
		}()
		done <- s.Send(sctx, m)
	}()
	select {
	case err := <-done:
		return err
	case <-sctx.Done():
		select {
		case err := <-done: // it answered just in time
			return err
		case <-time.After(sendGrace):
		}
		r.logger.LogAttrs(ctx, slog.LevelError, "relay: sender did not return after its context ended; abandoned",
			slog.Int64("id", m.ID), slog.String("type", m.Type))
		return context.Cause(sctx)
	}
}

// sendGrace is how long a sender whose context ended may take to return.
const sendGrace = 100 * time.Millisecond

// errorText is err's text as last_error keeps it: valid UTF-8, no NUL bytes
// (PostgreSQL text refuses them), at most lastErrorMax bytes.
func errorText(err error) string {
	s := strings.ToValidUTF8(err.Error(), "\uFFFD")
	s = strings.ReplaceAll(s, "\x00", "")
	if len(s) > lastErrorMax {
		s = s[:lastErrorMax]
		for !utf8.ValidString(s) {
			s = s[:len(s)-1]
		}
	}
	return s
}
