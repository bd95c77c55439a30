package pass

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/xadm/relay/internal/relaytype"
	"github.com/xadm/relay/internal/store"
)

// Config is what a pass reads of the relay's configuration.
type Config struct {
	Table         string // as configured, for the operator's messages
	BatchSize     int
	MaxAttempts   int
	GroupOutcomes int
	PauseAfter    int
	Concurrency   int
	// Workers is how many workers a pass runs at most: Concurrency, unless
	// the pool is too small to give each its connection next to the
	// election's and the select's.
	Workers     int
	SendTimeout time.Duration
	Interval    time.Duration
	// PauseMax is the longest pause of a type (0: PauseMaxDefault).
	PauseMax time.Duration
	// StuckSendsMax bounds the relay's stuck Sends (0: StuckSendsMaxDefault;
	// stuck.go).
	StuckSendsMax int
}

// Sender delivers the messages of one type: the adopter's Sender, behind the
// relay's recover and its checks of what the Sender returns (a typed nil, an
// error whose Error panics), which make each error a *[SendError].
type Sender interface {
	Send(ctx context.Context, m store.Row) error
}

// BatchSender also delivers several messages of its type in one call, one
// error per message, in order.
type BatchSender interface {
	Sender
	SendBatch(ctx context.Context, ms []store.Row) []error
}

// SendError is a Sender's error as the relay made it safe: its text and its
// Permanent mark read once, under a recover. It unwraps to the original.
type SendError struct {
	Err       error
	Text      string
	Permanent bool
}

func (e *SendError) Error() string { return e.Text }
func (e *SendError) Unwrap() error { return e.Err }

// Outbox is the table as a pass reads and writes it (store.Outbox), and
// the one source of the connections its outcomes are written on.
type Outbox interface {
	// Fetch selects one batch, outside any transaction.
	Fetch(ctx context.Context, q Query) (store.Batch, error)
	// Acquire takes a pooled connection for the outcomes of a worker's
	// sends (or of the grouped recorder), within store.AcquireTimeout.
	Acquire(ctx context.Context) (store.Conn, error)
	// Starved reports whether no connection is free for a select.
	Starved() bool
	// Record writes outcomes: one in its own short transaction, several in
	// one statement, each fenced on the state the pass read. It returns the
	// ids of the rows that had moved on and were left alone.
	Record(ctx context.Context, db store.Querier, outs []store.Update) (stale map[int64]bool, err error)
	// RecordEach writes each outcome in its own transaction, in one round
	// trip; failed are the rows whose own statement failed.
	RecordEach(ctx context.Context, c store.Conn, outs []store.Update) (stale map[int64]bool, failed map[int64]error, err error)
	// States reads the current state of rows by id.
	States(ctx context.Context, db store.Querier, ids []int64) (map[int64]store.State, error)
	// ErrWidth is how many characters last_error holds; 0: as many as
	// LastErrorMax.
	ErrWidth() int
	// Relearn makes the outbox learn the table again before the next pass
	// (a value did not fit a column whose width changed).
	Relearn()
}

// Query is what one select asks for (store.Query).
type Query = store.Query

// Report is one recorded outcome, for the relay's counters and Observer.
type Report struct {
	Row      *store.Row
	Outcome  relaytype.Outcome
	Attempts int // the attempts column as written
	Took     time.Duration
	Err      error // the Sender's, nil when sent
}

// Deps are what a Runner takes from the relay that builds it.
type Deps struct {
	Outbox  Outbox            // the table, and the connections outcomes are written on
	Senders map[string]Sender // by type: the types the relay drains
	Logger  *slog.Logger
	// Report is told each recorded outcome, from the goroutine that recorded
	// it, when no lock of the pass is held.
	Report func(Report)
}

// Opts tune one pass. The zero value is Run's and RunIfElected's: one batch.
type Opts struct {
	Halt     <-chan struct{} // closed: start no new message or batch (graceful stop)
	Drain    bool            // take batches while they come back full
	DrainFor time.Duration   // how long at most; 0: DrainMax
	Parts    []int           // partitioned: deliver only these partitions
	// Wake is the loop's wake-ups: one that comes while the pass waits for
	// its last messages has it select again at once, beside their outcomes'
	// writes, instead of after the pass. nil: none.
	Wake <-chan struct{}
	// Keyed says the table has the key index: each lane has its share of a
	// batch, and selects may leave lanes out (sql/pass.sql). Without it, a
	// batch is the lowest ids of all lanes.
	Keyed bool
}

// DrainMax bounds how long one pass keeps draining a backlog before it lets
// go of the election; the loop then starts the next pass at once.
const DrainMax = 10 * time.Second

// Result is what a pass did.
type Result struct {
	relaytype.Counts               // the outcomes recorded, by kind
	Lag              time.Duration // the age of the first batch's oldest row
	OutcomesWaiting  int           // the most outcomes that waited to be written at once
	Backlog          bool          // draining stopped at DrainMax with rows left
	Woken            bool          // a wake-up came during the pass, and it selected again
	Err              error
}

// Runner runs a relay's passes, one at a time: the engine of each, and what
// outlives them, the types' lanes and the messages held back.
type Runner struct {
	cfg   Config
	deps  Deps
	types []string
	lanes *Lanes
	held  heldBack

	// sendTimedOut is the cause of a send's context when SendTimeout
	// elapses, built once rather than for every message.
	sendTimedOut error
}

// New returns the Runner of a relay that drains types.
func New(cfg Config, types []string, deps Deps) *Runner {
	return &Runner{cfg: cfg, deps: deps, types: types, lanes: newLanes(types, cfg, deps.Logger),
		sendTimedOut: fmt.Errorf("send timed out after %s", cfg.SendTimeout)}
}

// Lanes are the runner's lanes.
func (r *Runner) Lanes() *Lanes { return r.lanes }

// Run runs one pass's engine under whatever election the caller holds.
func (r *Runner) Run(ctx context.Context, o Opts) Result {
	e := r.newEngine(ctx, o, r.deps.Outbox)
	e.rec = r.newRecorder(ctx, &e.res)
	e.run()
	e.res.OutcomesWaiting = int(e.rec.waiting.peak.Load())
	return e.res
}

// ErrSenderExited is the outcome of a Send that ended its goroutine.
var ErrSenderExited = errors.New("sender ended its goroutine (runtime.Goexit, as t.FailNow does) instead of returning")
