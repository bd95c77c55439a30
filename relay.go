package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"reflect"
	"slices"
	"strings"
	"sync"

	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/xadm/relay/internal/election"
	"github.com/xadm/relay/internal/loop"
	"github.com/xadm/relay/internal/pass"
	"github.com/xadm/relay/internal/session"
	"github.com/xadm/relay/internal/store"
)

// Timings of the pass.
const (
	// failureLogEvery is the longest a failing streak goes without an Error line.
	failureLogEvery = 5 * time.Minute
)

// ErrPoolExhausted says the relay's pool had no free connection within a few
// seconds: the service's own code holds them all, or the pool is smaller than
// Concurrency + 2. The pass sent nothing it could not record; it stopped, and
// the next one tries again.
var ErrPoolExhausted = store.ErrPoolExhausted

// ErrReadOnly says the server cannot write: a hot standby (after a failover,
// with a stale DNS name or a proxy that still points at the old primary), or a
// server with default_transaction_read_only on during a cutover. The relay
// sends nothing from such a server, since it could not record the outcome, and
// takes no election there, since a lock on a standby excludes nobody on the
// primary.
var ErrReadOnly = store.ErrReadOnly

// Relay delivers the outbound rows of one outbox table through its senders.
// Build it with [New]; it is safe for concurrent use, and its passes never
// overlap within one process.
type Relay struct {
	pool     *pgxpool.Pool
	maxConns int // the pool's, read once: pool.Config() copies the whole configuration
	cfg      Config
	logger   *slog.Logger
	repo     *store.Table
	tableID  pgx.Identifier
	senders  map[string]Sender
	types    []string
	sessions *session.SessionCheck // that the pool keeps its sessions, when the election takes its locks on it (internal/session)
	key      string
	observer Observer
	stats    counters

	// presence is what this relay says of itself while started
	// (internal/election).
	presence *session.Presence

	// election decides whether a pass runs, chosen once in New (election.go);
	// direct runs Run's passes.
	election, direct election.Election

	// passes run the passes, one at a time, and the started loop
	// (internal/loop).
	passes *loop.Passes

	// runner runs the passes' engine (internal/pass), and keeps what outlives
	// one: the types' lanes, the messages whose outcome could not be recorded.
	runner *pass.Runner
	// outbox is the table as the passes read and write it, and learn it
	// before the first (internal/store).
	outbox *store.Outbox

	mu   sync.Mutex
	loop *loop.Loop // the started loop; nil before Start

	ret retention // the retention job ([Config.Retention], retention.go)

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
		if s == nil || isNilPointer(reflect.ValueOf(s)) {
			return nil, fmt.Errorf("relay: sender %d is nil", i)
		}
		t, err := senderType(s)
		if err != nil {
			return nil, fmt.Errorf("relay: sender %d (%T): %w", i, s, err)
		}
		if strings.TrimSpace(t) == "" {
			return nil, fmt.Errorf("relay: sender %d (%T) has an empty type", i, s)
		}
		if _, dup := byType[t]; dup {
			return nil, fmt.Errorf("relay: two senders for type %q: each type has exactly one sender", t)
		}
		byType[t] = s
	}
	repo, err := store.NewTable(cfg.Table, cfg.RetryBackoff, retryBackoffMax, cfg.AsyncCommit)
	if err != nil {
		return nil, &FieldError{Field: "Table", msg: err.Error()}
	}
	tableID, _ := store.ParseTable(cfg.Table) // valid: NewTable checked it
	logger := cfg.Logger
	if logger == nil {
		logger = slog.Default()
	}
	// The adopter's handler runs under a recover: a panicking handler costs a
	// log line, never the relay (callbacks.go).
	logger = slog.New(newSafeHandler(logger.Handler())).With(slog.String("component", "relay"), slog.String("app", cfg.AppName))
	r := &Relay{
		pool:     pool,
		maxConns: int(pool.Config().MaxConns),
		cfg:      cfg,
		logger:   logger,
		repo:     repo,
		tableID:  tableID,
		senders:  byType,
		types:    slices.Sorted(maps.Keys(byType)),
		key:      cfg.lockKey(),
		observer: cfg.Observer,
	}
	r.presence = session.NewPresence(cfg.AppName, cfg.Table, cfg.MaxAttempts, cfg.Partitions, r.types)
	r.presence.SetOwnership(session.NewOwnership(cfg.AppName, cfg.Table, cfg.MaxAttempts, r.types, logger)) // ownership.go
	r.outbox = store.NewOutbox(pool, repo, store.OutboxConfig{Table: cfg.Table, MaxAttempts: cfg.MaxAttempts,
		BatchSize: cfg.BatchSize, BatchBytes: cfg.BatchBytes, Partitions: cfg.Partitions, Logger: logger,
		Yielded: r.presence.Ownership().YieldedTypes})
	r.runner = r.newRunner(byType)
	lanes := r.runner.Lanes()
	lanes.OnChange(r.presence.Follow(lanes)) // a lane's change, straight to presence: the session's next statement says it
	if r.election, err = r.chooseElection(cfg.Guard); err != nil {
		return nil, err
	}
	r.passes = r.newPasses()
	if n := int(pool.Config().MaxConns); cfg.Concurrency > n-2 {
		logger.Warn("relay: the pool is too small for Concurrency: each message in flight holds a connection for its outcome, "+
			"next to the election's and the select's; fewer messages will be in flight",
			slog.Int("concurrency", cfg.Concurrency), slog.Int("pool_max_conns", n), slog.Int("in_flight_at_most", r.workers()))
	}
	if !cfg.ClusterLock {
		logger.Warn("relay: ClusterLock is off: every replica of this app drains the same rows at the same time, " +
			"and each message they share is delivered more than once (decision 0035's avoidable duplication)")
	}
	if cfg.AppName == appNameDefault {
		logger.Warn("relay: AppName is the default \"app\": every service on this database that also kept the default "+
			"shares one election with this one; set AppName (RELAY_APP_NAME) to the service's name",
			slog.String("key", r.key))
	}
	return r, nil
}

// Run runs one direct pass, without election: it selects a batch of at most
// BatchSize deliverable rows and delivers them. It is for tests and for "run
// now"; replicas that must not duplicate each other use [Relay.RunIfElected].
// It waits for a pass of this relay already in flight. It returns how many rows
// it processed (recorded sent or failed).
func (r *Relay) Run(ctx context.Context) (int, error) {
	res := r.passes.Pass(ctx, loop.Direct, loop.Opts{})
	return res.Processed(), res.Err
}

// RunIfElected runs the same pass as [Relay.Run] under the election for
// AppName + "_relay_m2m". It reports true when it ran (it won the election, or
// ClusterLock is off and it ran a direct pass) and false when it coalesced:
// another session, in this process or another (a JVM relay among them), held
// the election, and nothing was dispatched. Enabled does not apply to it.
//
// With Partitions > 1 it runs the pass for the partitions this replica holds,
// after taking free ones up to its share, and reports true when it held at
// least one. While the relay is started, its membership of the partitioned
// election lasts between passes; otherwise RunIfElected joins, passes and
// leaves.
//
// If the election is lost mid-pass, the pass stops before its next message and
// the error wraps [ErrElectionLost].
func (r *Relay) RunIfElected(ctx context.Context) (bool, error) {
	res := r.passes.Pass(ctx, loop.Elected, loop.Opts{})
	return res.Ran, res.Err
}

func (r *Relay) passDone(res loop.Result, start time.Time) {
	rep := passReport(res, time.Since(start))
	r.stats.passDone(rep)
	if r.observer != nil {
		r.callObserver("PassDone", func() { r.observer.PassDone(rep) })
	}
	attrs := []slog.Attr{
		slog.Bool("ran", res.Ran),
		slog.Int("sent", res.Sent),
		slog.Int("failed", res.Failed),
		slog.Int("dead", res.Dead),
		durationAttr("duration", rep.Duration),
	}
	ctx := context.Background()
	stopped := errors.Is(res.Err, context.Canceled)
	failed := res.Err != nil && !stopped
	// While the database is away every pass fails the same way: log the 1st,
	// 2nd, 4th, 8th… failure of a streak, and at least one every
	// failureLogEvery, the rest at Debug. A pass cut short by a stop neither
	// fails nor ends the streak.
	level := slog.LevelDebug
	r.streakMu.Lock()
	streak := r.streak
	switch {
	case failed:
		r.streak++
		streak = r.streak
		if r.sessions.Refused(res.Err) {
			break // the refusal was logged at Error once, when the pool was checked
		}
		if streak&(streak-1) == 0 || time.Since(r.streakLogged) >= failureLogEvery {
			level = slog.LevelError
			r.streakLogged = time.Now()
		}
	case !stopped:
		r.streak = 0
	}
	r.streakMu.Unlock()
	switch {
	case failed:
		r.logger.LogAttrs(ctx, level, "relay: pass failed",
			append(attrs, slog.Int("consecutive_failures", streak), slog.String("error", res.Err.Error()))...)
	case streak > 0 && !stopped:
		r.logger.LogAttrs(ctx, slog.LevelInfo, "relay: passes succeed again", append(attrs, slog.Int("after_failures", streak))...)
	case res.Processed() > 0:
		r.logger.LogAttrs(ctx, slog.LevelInfo, "relay: pass delivered", append(attrs, durationAttr("lag", res.Lag))...)
	}
}

// failing is how many passes in a row have failed, for the loop's backoff.
func (r *Relay) failing() int {
	r.streakMu.Lock()
	defer r.streakMu.Unlock()
	return r.streak
}

// durationAttr logs d as text ("1.5s"), which JSON handlers would otherwise
// write as an integer of nanoseconds.
func durationAttr(key string, d time.Duration) slog.Attr {
	return slog.String(key, d.Round(time.Microsecond).String())
}

// Stats returns a snapshot of what the relay did since New.
func (r *Relay) Stats() Stats {
	st := r.stats.snapshot()
	st.Partitions = r.election.Partitions() // as the membership publishes them (internal/election)
	st.Paused = pausedTypes(r.runner.Lanes().Paused())
	st.Yielded, st.Stuck, st.Retention = r.yielded(), r.stuckSends(), r.retentionRun()
	return st
}
