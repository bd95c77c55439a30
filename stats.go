package relay

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/xadm/relay/internal/loop"
	"github.com/xadm/relay/internal/pass"
	"github.com/xadm/relay/internal/relaytype"
)

// Stats is a snapshot of what a [Relay] did since [New], as [Relay.Stats] returns it.
type Stats struct {
	PassesElected   int64 // passes that ran: elected, or direct ([Relay.Run], ClusterLock off)
	PassesCoalesced int64 // passes skipped because another session held the election
	PassesFailed    int64 // passes that ended in an error, whether or not they ran (see LastPassErr)
	Sent            int64 // messages delivered and recorded SENT
	Failed          int64 // failed attempts recorded ERROR below the ceiling (they will be retried)
	Dead            int64 // failed attempts that left the row dead (at the ceiling, or a [Permanent] error)

	LastPassAt  time.Time // when the last pass (run or coalesced) ended; zero before the first
	LastPassErr error     // the last pass's error, nil if it succeeded

	// Lag is the age, when the last pass read it, of the oldest row that pass
	// found deliverable: how far behind the relay is. 0 when it found none.
	Lag time.Duration

	// Partitions are the partitions this replica holds, in order, with
	// Config.Partitions > 1; nil when it holds none, or is not partitioned.
	Partitions []int

	// Paused are the message types this relay has paused ([Config.PauseAfter]),
	// in the order of their names; nil when none is.
	Paused []PausedType

	// Yielded are the message types this started relay has a sender for and
	// does not deliver, because live relays of another app already deliver
	// them on its table (one type, one app); nil when none is.
	Yielded []YieldedType

	// Stuck are, per type, this relay's abandoned Sends still running: Sends
	// that ignored their context past SendTimeout, given up by the relay and
	// not returned yet; nil when none runs.
	Stuck []StuckSends

	// Retention is this relay's last run of the retention job
	// ([Config.Retention]); nil when it ran none.
	Retention *RetentionRun
}

// StuckSends are one type's abandoned Sends still running on a relay: Sends
// that ignored their context, which the relay gave up on (their rows were
// marked failed) and whose goroutines have not returned yet.
type StuckSends struct {
	Type  string
	Sends int       // how many run now
	Since time.Time // since when the oldest of them runs
}

// PausedType is a message type a relay has paused ([Config.PauseAfter]): its
// rows wait, with their status and attempts untouched, while the relay's
// other types go on (docs/decisions/0040-isolation.md).
type PausedType struct {
	Type   string
	Reason string    // why: the last failure, or the abandoned Sends still running
	Since  time.Time // when the first pause of this run of pauses began
	Until  time.Time // when one of its messages is next sent as a probe
	// Probing says the pause has ended and a message is being sent as a
	// probe: its success resumes the type.
	Probing bool
}

// stuckSends are this relay's abandoned Sends still running, per type, for
// Stats.Stuck (internal/pass, stuck.go); the presence descriptor's "stuck",
// which Admin, relayctl status and the metrics read, says the same
// (internal/session, Presence.Follow).
func (r *Relay) stuckSends() []StuckSends {
	var st []StuckSends
	for _, s := range r.runner.Lanes().Stuck() {
		st = append(st, StuckSends{Type: s.Type, Sends: s.Sends, Since: s.Since})
	}
	return st
}

// pausedTypes is what the runner's lanes say is paused, as [PausedType].
func pausedTypes(ps []relaytype.PausedType) []PausedType {
	if len(ps) == 0 {
		return nil
	}
	out := make([]PausedType, len(ps))
	for i, p := range ps {
		out[i] = PausedType(p)
	}
	return out
}

// Observer receives each pass's and each message's outcome, to export metrics
// (Prometheus, OpenTelemetry) without the relay depending on either. Its
// methods are called synchronously from the pass, possibly from several
// goroutines at once when Concurrency > 1: they must be quick and safe for
// concurrent use.
type Observer interface {
	// PassDone is called after every pass, elected, direct or coalesced.
	PassDone(p PassReport)
	// MessageDone is called after each message whose outcome was recorded.
	MessageDone(m MessageReport)
}

// PassReport is one pass's outcome.
type PassReport struct {
	Ran       bool          // the pass ran: it won the election, or it was a direct pass
	Coalesced bool          // another session held the election and nothing ran
	Sent      int           // messages recorded SENT
	Failed    int           // messages recorded ERROR below the ceiling
	Dead      int           // messages recorded dead
	Duration  time.Duration // how long the pass took, election included
	Lag       time.Duration // see [Stats.Lag]
	Err       error         // the pass's error, if any

	// OutcomesWaiting is the most outcomes that waited at once, during the
	// pass, to be written: messages sent whose outcome was not yet recorded
	// (none is left waiting when the pass ends). It is what a crash at that
	// moment would have re-delivered beyond the sends in flight; its bound is
	// Config.GroupOutcomes' (docs/decisions/0037-adaptive-outcomes.md).
	OutcomesWaiting int
}

// passReport is what the Observer's PassDone is told of a pass that took
// took.
func passReport(res loop.Result, took time.Duration) PassReport {
	return PassReport{
		Ran:       res.Ran,
		Coalesced: res.Coalesced(),
		Sent:      res.Sent,
		Failed:    res.Failed,
		Dead:      res.Dead,
		Duration:  took,
		Lag:       res.Lag,
		Err:       res.Err,

		OutcomesWaiting: res.OutcomesWaiting,
	}
}

// MessageReport is one message's outcome.
type MessageReport struct {
	ID       int64
	Type     string
	Attempts int           // attempts after this one
	Outcome  Outcome       // OutcomeSent, OutcomeError or OutcomeDead
	Duration time.Duration // the send's duration
	Err      error         // the sender's error, nil when sent
}

// Outcome is what became of a message: [MessageReport.Outcome]. Its value is
// the status the row was left in ("SENT", "ERROR"), or "DEAD" for an ERROR row
// at the ceiling.
type Outcome string

// The outcomes of a message (internal/relaytype's, where the pass decides
// and records them).
const (
	OutcomeSent  = Outcome(relaytype.OutcomeSent)  // delivered and recorded SENT
	OutcomeError = Outcome(relaytype.OutcomeError) // failed, recorded ERROR below the ceiling: it is retried
	OutcomeDead  = Outcome(relaytype.OutcomeDead)  // failed at the ceiling, refused as permanent, or undeliverable: not retried
)

// report counts and observes one recorded outcome: the Observer's
// MessageDone.
func (r *Relay) report(p pass.Report) {
	r.stats.recorded(p.Outcome)
	if r.observer == nil {
		return
	}
	rep := MessageReport{ID: p.Row.ID, Type: p.Row.Type, Attempts: p.Attempts, Duration: p.Took, Err: p.Err, Outcome: Outcome(p.Outcome)}
	r.callObserver("MessageDone", func() { r.observer.MessageDone(rep) })
}

// counters are the relay's running totals behind Stats.
type counters struct {
	elected, coalesced, passFailed, sent, failed, dead atomic.Int64

	mu      sync.Mutex
	lastAt  time.Time
	lastErr error
	lag     time.Duration
}

// recorded counts one recorded outcome.
func (c *counters) recorded(o relaytype.Outcome) {
	switch o {
	case relaytype.OutcomeSent:
		c.sent.Add(1)
	case relaytype.OutcomeError:
		c.failed.Add(1)
	case relaytype.OutcomeDead:
		c.dead.Add(1)
	}
}

func (c *counters) passDone(p PassReport) {
	switch {
	case p.Ran:
		c.elected.Add(1)
	case p.Coalesced:
		c.coalesced.Add(1)
	}
	failed := p.Err != nil && !errors.Is(p.Err, context.Canceled) // a stop is not a failure
	if failed {
		c.passFailed.Add(1)
	}
	c.mu.Lock()
	c.lastAt = time.Now()
	c.lastErr = nil
	if failed {
		c.lastErr = p.Err
	}
	// A pass that failed before it read anything knows nothing new of the lag:
	// keep the last one rather than report "caught up" while the relay is stuck.
	if p.Ran && (p.Err == nil || p.Lag > 0) {
		c.lag = p.Lag
	}
	c.mu.Unlock()
}

func (c *counters) snapshot() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return Stats{
		PassesElected:   c.elected.Load(),
		PassesCoalesced: c.coalesced.Load(),
		PassesFailed:    c.passFailed.Load(),
		Sent:            c.sent.Load(),
		Failed:          c.failed.Load(),
		Dead:            c.dead.Load(),
		LastPassAt:      c.lastAt,
		LastPassErr:     c.lastErr,
		Lag:             c.lag,
	}
}

// RetentionRun is one run of the retention job ([Config.Retention]).
type RetentionRun struct {
	At      time.Time     // when it ended
	Deleted int64         // SENT rows it deleted
	Err     string        // why it failed; "" when it did not
	Age     time.Duration // the retention: it deleted the rows delivered longer ago
	Took    time.Duration // how long it ran
	Total   int64         // rows deleted by the runs of this relay since it started
}
