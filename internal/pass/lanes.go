package pass

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// This file is isolation between message types (decision 0040). Each type
// the relay has a sender for is a lane, whose health outlives passes: open,
// paused until a time, or probing. A lane whose Sends fail PauseAfter times
// in a row, or whose abandoned Sends still running reach Concurrency, is
// paused: its rows are neither selected nor sent, and keep their status and
// attempts. When the pause ends, one of its messages is sent as a probe; its
// success opens the lane, its failure pauses it again, for twice as long. The
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
// to pauseMax.
const (
	pauseFirst = 5 * time.Second
	pauseMax   = time.Minute
)

// slowSend is how long a Send must take for its lane to count as slow: a
// slow lane leaves one worker to the others (flight.next), so that they wait
// for no send of it.
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
	index      int   // in lanes.all
	pauseAfter int   // Config.PauseAfter; 0: never
	abandonMax int32 // Sends abandoned and still running at which the lane pauses
	owner      *Lanes

	st        atomic.Int32 // state, for readers that take no lock
	abandoned atomic.Int32 // Sends given up that have not returned yet
	slow      atomic.Bool  // its last Send took slowSend or more: it may not take the last worker

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
	since   time.Time
	until   time.Time
	reason  string
}

// Lanes are a relay's lanes, one per type, in the order of its types.
type Lanes struct {
	all    []*lane
	byType map[string]*lane
	logger *slog.Logger
	// changed, when set, is told that a lane paused or opened.
	changed atomic.Pointer[func()]
}

func newLanes(types []string, cfg Config, logger *slog.Logger) *Lanes {
	ls := &Lanes{byType: make(map[string]*lane, len(types)), logger: logger}
	for i, typ := range types {
		l := &lane{typ: typ, index: i, pauseAfter: cfg.PauseAfter, abandonMax: int32(max(cfg.Concurrency, 1)), owner: ls}
		ls.all = append(ls.all, l)
		ls.byType[typ] = l
	}
	return ls
}

// dispatchable reports whether l's rows may be selected and sent now, and
// whether the next one goes as a probe. A pause that ended, with fewer
// abandoned Sends running than the bound, turns into probing here.
func (l *lane) dispatchable(now time.Time) (ok, probe bool) {
	if laneState(l.st.Load()) == laneOpen {
		return true, false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.state == lanePaused && !now.Before(l.until) && l.abandoned.Load() < l.abandonMax {
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
// passed its last probe's key over and found no other probes that key next.
func (l *lane) passEnded() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.state == laneProbing && !l.probe && l.avoided {
		l.avoid = ""
	}
	l.avoided = false
}

// releaseProbe gives the claim back when the probe was not sent (its pass
// ended first): the next pass probes again.
func (l *lane) releaseProbe() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.probe = false
}

// observe takes the outcome of a Send of a message of key into l's health:
// a success (or a Permanent refusal: the receiver answered) opens the lane,
// a failure counts, and pauses it after pauseAfter in a row, or at once for a
// probe.
func (l *lane) observe(out Outcome, permanent bool, err error, key string) {
	if l == nil {
		return
	}
	healthy := out == OutcomeSent || permanent
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
		l.failures, l.pauses, l.probe, l.avoid = 0, 0, false, ""
	case l.state == laneProbing:
		l.failures++
		l.pauseLocked(now, "the probe failed: "+ErrorText(err, 200))
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

// abandon counts a Send given up while it runs on; at abandonMax of them the
// lane pauses, instead of leaving more goroutines behind.
func (l *lane) abandon() {
	n := l.abandoned.Add(1)
	if n < l.abandonMax || l.pauseAfter == 0 {
		return
	}
	l.mu.Lock()
	paused := l.state != lanePaused
	if paused {
		l.pauseLocked(time.Now(), fmt.Sprintf("%d sends ignored their context and still run", n))
	}
	l.mu.Unlock()
	l.said(false, paused)
}

// returned says that an abandoned Send returned at last.
func (l *lane) returned() { l.abandoned.Add(-1) }

// pauseLocked pauses l (l.mu held).
func (l *lane) pauseLocked(now time.Time, reason string) {
	if l.state == laneOpen {
		l.since = now
	}
	l.pauses++
	d := pauseMax
	if l.pauses <= 8 && pauseFirst<<(l.pauses-1) < pauseMax {
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
			slog.Int("abandoned_running", int(l.abandoned.Load())))
	} else if opened {
		l.owner.logger.LogAttrs(context.Background(), slog.LevelInfo, "relay: type resumed: a message was delivered",
			slog.String("type", l.typ))
	}
	if f := l.owner.changed.Load(); f != nil {
		(*f)()
	}
}

// pausedType is l as [PausedType], and whether it is paused or probing.
func (l *lane) pausedType() (PausedType, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.state == laneOpen {
		return PausedType{}, false
	}
	return PausedType{Type: l.typ, Reason: l.reason, Since: l.since, Until: l.until, Probing: l.state == laneProbing}, true
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
func (ls *Lanes) Paused() []PausedType {
	var ps []PausedType
	for _, l := range ls.all {
		if p, ok := l.pausedType(); ok {
			ps = append(ps, p)
		}
	}
	return ps
}

// PausedType is a message type a relay has paused ([Config.PauseAfter]): its
// rows wait, with their status and attempts untouched, while the relay's
// other types go on.
type PausedType struct {
	Type   string
	Reason string    // why: the last failure, or the abandoned Sends still running
	Since  time.Time // when the first pause of this run of pauses began
	Until  time.Time // when one of its messages is next sent as a probe
	// Probing says the pause has ended and a message is being sent as a
	// probe: its success resumes the type.
	Probing bool
}

// OnChange has f told, from the goroutine that saw it, each time a lane
// pauses or opens.
func (ls *Lanes) OnChange(f func()) { ls.changed.Store(&f) }
