package pass

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/xadm/relay/internal/relaytype"
)

// This file is isolation between message types (decision 0040). Each type
// the relay has a sender for is a lane, whose health outlives passes: open,
// paused until a time, or probing. A lane whose Sends fail PauseAfter times
// in a row, or whose stuck Send makes the relay reach its bound of them
// (stuck.go), is paused: its rows are neither selected nor sent, and keep
// their status and attempts. When the pause ends, one of its messages is sent as a probe, of
// another key than the last failed probe's; its success opens the lane, its failure pauses it
// again, for twice as long (up to PauseMax) — unless it failed fast and was the pause's first:
// then another key's probe goes at once, so that one bad key costs its type no pause. The
// engine (engine.go) shares its workers fairly between the lanes that have
// work, and leaves the paused ones out of its selects.

// laneState is a lane's health.
type laneState int32

const (
	laneOpen laneState = iota
	lanePaused
	laneProbing // the pause ended: one message goes as a probe
)

// How long a pause lasts: pauseFirst, doubling with each pause in a row, up
// to Config.PauseMax (PauseMaxDefault): a dead destination gets a probe that
// often, and one that came back is found within it.
const (
	pauseFirst      = 5 * time.Second
	PauseMaxDefault = 10 * time.Second
)

// StuckSendsMaxDefault is the default of Config.StuckSendsMax (stuck.go).
const StuckSendsMaxDefault = 100

// slowSend is how long a Send must take, or have run, for its lane to count
// as slow: the slow lanes leave the others their share of the workers
// (engine.share), so that they wait for no send of them.
const slowSend = 100 * time.Millisecond

// took notes how long one of l's Sends took.
func (l *lane) took(d time.Duration) {
	if slow := d >= slowSend; l != nil && slow != l.slow.Load() {
		l.slow.Store(slow)
	}
}

// lane is one message type's health, shared by the relay's passes.
type lane struct {
	typ        string
	index      int // in lanes.all
	pauseAfter int // Config.PauseAfter; 0: never
	pauseMax   time.Duration
	owner      *Lanes

	st       atomic.Int32 // state, for readers that take no lock
	stuck    atomic.Int32 // its Sends given up that have not returned yet (stuck.go)
	slow     atomic.Bool  // its last Send took slowSend or more
	lastSent atomic.Int64 // when a Send of it last succeeded, in UnixNano: a lane with recent work keeps its share of the workers

	mu       sync.Mutex
	state    laneState
	failures int  // failed Sends in a row
	pauses   int  // pauses in a row: the next lasts longer
	probe    bool // a probe is planned or in flight
	// avoid is the key whose probe failed last: the next probe is another
	// key's, when another may answer (avoided: one was passed over), so that
	// one bad key does not keep its type paused.
	avoid   string
	avoided bool
	// second says the pause's first probe failed fast (the destination
	// answered, or refused): another key's probe goes at once, and only its
	// failure pauses the lane again, with failed's reason. One bad key then
	// costs its type no pause beyond the one it was in.
	second bool
	failed string
	since  time.Time
	until  time.Time
	reason string
	// stuckSince is since when it has had stuck Sends without a break.
	stuckSince time.Time
}

// Lanes are a relay's lanes, one per type, in the order of its types.
type Lanes struct {
	all    []*lane
	byType map[string]*lane
	logger *slog.Logger
	stuck  *stuckSends
	// changed, when set, is told that a lane paused or opened.
	changed atomic.Pointer[func()]
}

func newLanes(types []string, cfg Config, logger *slog.Logger) *Lanes {
	ls := &Lanes{byType: make(map[string]*lane, len(types)), logger: logger,
		stuck: newStuckSends(cmp.Or(cfg.StuckSendsMax, StuckSendsMaxDefault), logger)}
	for i, typ := range types {
		l := &lane{typ: typ, index: i, pauseAfter: cfg.PauseAfter, pauseMax: cmp.Or(cfg.PauseMax, PauseMaxDefault), owner: ls}
		ls.all = append(ls.all, l)
		ls.byType[typ] = l
	}
	return ls
}

// dispatchable reports whether l's rows may be selected and sent now, and
// whether the next one goes as a probe. A pause that ended, while the relay
// runs fewer stuck Sends than its bound, turns into probing here.
func (l *lane) dispatchable(now time.Time) (ok, probe bool) {
	if laneState(l.st.Load()) == laneOpen {
		return true, false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.state == lanePaused && !now.Before(l.until) && !l.owner.stuck.full() {
		l.set(laneProbing)
	}
	switch l.state {
	case laneOpen:
		return true, false
	case laneProbing:
		return !l.probe, true
	}
	return false, false
}

// set sets l's state (l.mu held).
func (l *lane) set(s laneState) {
	l.state = s
	l.st.Store(int32(s))
}

// paused reports whether l is paused: a worker looks before each key.
func (l *lane) paused() bool { return laneState(l.st.Load()) == lanePaused }

// claimProbe claims l's one probe for a message of key; false when it is not
// probing, another message already is the probe, or the last probe failed
// on key (a pass that finds no other key probes it: passEnded).
func (l *lane) claimProbe(key string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.state != laneProbing || l.probe {
		return false
	}
	if key == l.avoid {
		l.avoided = true
		return false
	}
	l.probe = true
	return true
}

// passEnded is told at the end of each pass: a probing lane whose pass
// passed its last probe's key over and found no other probes that key next;
// for a second probe that found no other key, the first's failure pauses
// the lane.
func (l *lane) passEnded() {
	l.mu.Lock()
	paused := false
	if l.state == laneProbing && !l.probe && l.avoided {
		if l.second {
			l.second, paused = false, true
			l.pauseLocked(time.Now(), l.failed)
		} else {
			l.avoid = ""
		}
	}
	l.avoided = false
	l.mu.Unlock()
	l.said(false, paused)
}

// releaseProbe gives the claim back when the probe was not sent (its pass
// ended first): the next pass probes again.
func (l *lane) releaseProbe() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.probe = false
}

// observe takes the outcome of a Send of a message of key, which took took,
// into l's health: a success (or a Permanent refusal: the receiver answered)
// opens the lane, a failure counts, and pauses it after pauseAfter in a row;
// a probe's failure pauses it at once, unless it is the pause's first and
// was fast (below slowProbe): then another key's probe goes first.
func (l *lane) observe(out relaytype.Outcome, permanent bool, err error, key string, took, slowProbe time.Duration) {
	if l == nil {
		return
	}
	healthy := out.Delivered() || permanent
	if out.Delivered() {
		l.lastSent.Store(time.Now().UnixNano())
	}
	l.mu.Lock()
	if healthy && l.state == laneOpen && l.failures == 0 {
		l.mu.Unlock()
		return
	}
	var opened, paused bool
	now := time.Now()
	switch {
	case healthy:
		opened = l.state != laneOpen
		l.set(laneOpen)
		l.failures, l.pauses, l.probe, l.avoid, l.second = 0, 0, false, "", false
	case l.state == laneProbing && !l.second && took < slowProbe:
		l.failures++
		l.second, l.probe, l.avoid = true, false, key
		l.failed = "the probe failed: " + ErrorText(err, 200)
	case l.state == laneProbing:
		l.failures++
		reason := "the probe failed: " + ErrorText(err, 200)
		if l.second {
			reason = "the probes of two keys failed, the last: " + ErrorText(err, 200)
		}
		l.second = false
		l.pauseLocked(now, reason)
		l.avoid, paused = key, true
	case l.state == laneOpen:
		l.failures++
		if l.pauseAfter > 0 && l.failures >= l.pauseAfter {
			l.pauseLocked(now, fmt.Sprintf("%d sends in a row failed, the last: %s", l.failures, ErrorText(err, 200)))
			paused = true
		}
	}
	l.mu.Unlock()
	l.said(opened, paused)
}

// abandoned counts one of l's Sends given up while it runs on (add), or
// one that returned at last.
func (l *lane) abandoned(add bool) {
	l.mu.Lock()
	switch n := l.stuck.Load(); {
	case add && n == 0:
		l.stuckSince = time.Now()
		l.stuck.Add(1)
	case add:
		l.stuck.Add(1)
	default:
		l.stuck.Add(-1)
	}
	l.mu.Unlock()
	if f := l.owner.changed.Load(); f != nil {
		(*f)()
	}
}

// pauseStuck pauses l, unless it is paused: the relay runs its bound of
// stuck Sends (stuck.go).
func (l *lane) pauseStuck(reason string) {
	l.mu.Lock()
	paused := l.state != lanePaused
	if paused {
		l.pauseLocked(time.Now(), reason)
	}
	l.mu.Unlock()
	l.said(false, paused)
}

// pauseLocked pauses l (l.mu held).
func (l *lane) pauseLocked(now time.Time, reason string) {
	if l.state == laneOpen {
		l.since = now
	}
	l.pauses++
	d := l.pauseMax
	if l.pauses <= 8 && pauseFirst<<(l.pauses-1) < d {
		d = pauseFirst << (l.pauses - 1)
	}
	l.set(lanePaused)
	l.until, l.reason, l.probe = now.Add(d), reason, false
}

// said logs a change of l's state and tells the lanes' watcher.
func (l *lane) said(opened, paused bool) {
	if !opened && !paused {
		return
	}
	if p, ok := l.pausedType(); paused && ok {
		l.owner.logger.LogAttrs(context.Background(), slog.LevelWarn,
			"relay: type paused: its messages wait, untouched, while the other types go on; one is sent as a probe at resumes_at",
			slog.String("type", l.typ), slog.String("reason", p.Reason), slog.Time("resumes_at", p.Until),
			slog.Int("stuck_sends", int(l.stuck.Load())))
	} else if opened {
		l.owner.logger.LogAttrs(context.Background(), slog.LevelInfo, "relay: type resumed: a message was delivered",
			slog.String("type", l.typ))
	}
	if f := l.owner.changed.Load(); f != nil {
		(*f)()
	}
}

// pausedType is l as [relaytype.PausedType], and whether it is paused or probing.
func (l *lane) pausedType() (relaytype.PausedType, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.state == laneOpen {
		return relaytype.PausedType{}, false
	}
	return relaytype.PausedType{Type: l.typ, Reason: l.reason, Since: l.since, Until: l.until, Probing: l.state == laneProbing}, true
}

// Sendable lists the types whose rows may be sent now: not paused, or whose
// pause ended (the idle poll's).
func (ls *Lanes) Sendable() []string {
	types := make([]string, 0, len(ls.all))
	now := time.Now()
	for _, l := range ls.all {
		if ok, _ := l.dispatchable(now); ok {
			types = append(types, l.typ)
		}
	}
	return types
}

// Paused lists the lanes paused or probing now.
func (ls *Lanes) Paused() []relaytype.PausedType {
	var ps []relaytype.PausedType
	for _, l := range ls.all {
		if p, ok := l.pausedType(); ok {
			ps = append(ps, p)
		}
	}
	return ps
}

// OnChange has f told, from the goroutine that saw it, each time a lane
// pauses or opens, or its stuck Sends change.
func (ls *Lanes) OnChange(f func()) { ls.changed.Store(&f) }

// Stuck lists the lanes with stuck Sends now (stuck.go).
func (ls *Lanes) Stuck() []relaytype.StuckSends {
	var st []relaytype.StuckSends
	for _, l := range ls.all {
		l.mu.Lock()
		if n := l.stuck.Load(); n > 0 {
			st = append(st, relaytype.StuckSends{Type: l.typ, Sends: int(n), Since: l.stuckSince})
		}
		l.mu.Unlock()
	}
	return st
}
