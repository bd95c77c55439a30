package election

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/xadm/relay/internal/lease"
	"github.com/xadm/relay/internal/session"
	"github.com/xadm/relay/internal/store"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// This file is the partitioned election (Config.Partitions > 1, decision
// 0036): several replicas deliver at once, each only the rows of the
// partitions whose locks it holds, and a row's partition is a hash of its
// natural key (sql/pass.sql, partitionOf), so a key's messages keep their
// order on one replica at a time.
//
// A replica is a member while one session of its own, the membership's,
// holds the app's election key in shared mode. Shared holders admit each
// other and exclude every exclusive one: a JVM relay, a replica with
// Partitions 1, an operator's pause. On that same session the member holds
// its partitions' locks, two-int advisory locks that name N and the
// partition (sql/election.sql). Nothing else is stored: the server frees a
// member's locks when its session ends, and the session carries the lease of
// the field-faults issue (watch.go, internal/lease): idle_session_timeout and the watch's
// heartbeat, so a member cut off or frozen loses its partitions within the
// same bound as an elected replica.
//
// At the start of a pass, a member rebalances, in one round trip under the
// configuration lock (rebalanceSQL): it takes free partitions up to its
// share, ceil(N / members), and then lets go of those above it, so that the
// partitions spread without a coordinator:
//
//   - more than ceil: the extra ones (a new member came);
//   - more than floor(N / members) while a member holds fewer than floor:
//     one (the shares were taken before the last member came);
//   - an exclusive request waits for the app's key (relayctl pause): all,
//     and the membership too, until the request has been granted and let go;
//   - partitions held with another N (a deploy that changes Partitions):
//     none taken until the last of them is released, so that two counts,
//     whose partitions do not nest, never deliver at once.
//
// In the same round trip, the loop's member asks whether the partitions it
// held before have anything to deliver (partitionWork): when they have not,
// and its share is the same, the pass ends there. The loop's next timer pass
// then asks the same on the relay's own session and does not rebalance
// (idleCheck), the one after rebalances again, and so on: an idle member
// makes one round trip per pass, and each of its two sessions, the
// membership's and the relay's own (presence), gets one every other pass,
// which stands for its keepalive. An idle member thus rebalances every other
// Interval.
//
// A commit wakes every member at once (the NOTIFY names a type, not a
// partition). A woken pass within Interval of the member's last rebalance
// does not rebalance: it asks whether its own partitions have anything to
// deliver, on the membership's session with the election's heartbeat in the
// same round trip (look), and ends there when they have not. So the members
// woken by one commit do not queue behind each other on the configuration
// lock (16 members: the message's commit → Send p50 went from 7-15 ms to 1.4-2.8 ms),
// and each still rebalances at its first pass an Interval after its last: a
// newcomer's share, a stopped member's partitions and a waiting pause are
// seen within an Interval under wake-ups as without them.
//
// A member lets go of a partition only between passes, with nothing of it
// in flight, and another takes it at its own next rebalance: at most one
// replica delivers a key at any time. Partitioned passes drain for at most
// Interval, so that rebalancing happens at least that often.

// membership is this relay's part in the partitioned election. Its
// memberElection (elections.go) uses it under turn only, except for the
// watch's loss, which takes mu.
type membership struct {
	turn sync.Mutex // held by a pass, and by the loop's begin and end

	r     *Deps
	n     int
	start int // where this member starts looking for free partitions

	conn  *pgxpool.Conn // the membership's session; nil: not a member
	sess  lockSession
	since time.Time // when this membership began
	beat  string    // its heartbeat, marked with since and the replica (a woken pass's look)
	w     *watch    // watches conn between rebalances; nil while one runs
	held  []int
	// rebalanced is when the last rebalance was sent: a woken pass within
	// Interval of it looks instead of rebalancing (look).
	rebalanced time.Time

	// stay keeps the membership between passes: set while the loop runs.
	// Without it, each RunIfElected joins, passes and leaves.
	stay bool
	// idle: the last pass was an idle one of the loop's, which rebalanced;
	// the next timer pass looks for work on the relay's own session instead
	// (idleCheck).
	idle bool
	// left is the election's state as the last rebalance left it.
	left store.PartitionLook

	// announced logs each condition that keeps partitions unheld once per streak.
	announced string

	mu     sync.Mutex
	lost   error                   // why the session was lost, set by the watch
	cancel context.CancelCauseFunc // the pass in flight's, cancelled on loss

	shownMu sync.Mutex
	shown   []int // the partitions held, as published (publish); Stats reads them
}

// publish says which partitions this replica holds now (Stats): before a
// partition is let go of, so that no two replicas say they hold it.
func (m *membership) publish(parts []int) {
	m.shownMu.Lock()
	defer m.shownMu.Unlock()
	m.shown = slices.Clone(parts)
}

// partitions are the partitions held, as last published.
func (m *membership) partitions() []int {
	m.shownMu.Lock()
	defer m.shownMu.Unlock()
	return slices.Clone(m.shown)
}

func newMembership(r *Deps) *membership {
	return &membership{r: r, n: r.Partitions, start: rand.IntN(r.Partitions)}
}

// pass runs fn for this member's partitions, after it joined if it was not a
// member and rebalanced, or, woken within Interval of its last rebalance,
// looked at its partitions (look). It reports false, without calling fn,
// when this replica holds no partition: an exclusive holder keeps it out,
// other members hold every partition, or the partitions are held with
// another count.
func (m *membership) pass(ctx context.Context, woken bool, fn func(ctx context.Context, parts []int) error) (ran bool, err error) {
	if m.conn != nil {
		if lost := m.pause(); lost != nil {
			m.drop(lost)
		}
	}
	if m.conn == nil {
		joined, err := m.join(ctx)
		if err != nil || !joined {
			return false, err
		}
	}
	// The loop's member asks, in the rebalance's round trip, whether its
	// partitions have anything to deliver: an idle one then makes no select,
	// nor its pooled connection's ping.
	before := m.held
	var check *store.WorkCheck
	if m.stay && len(before) > 0 {
		check = m.r.Statements.PartitionWork(m.r.MaxAttempts, m.r.Types, m.n, before)
	}
	if woken && check != nil && time.Since(m.rebalanced) < m.r.Interval {
		// A commit woke every member at once: each asks about its own
		// partitions only, in parallel, and rebalances at its first pass
		// an Interval after its last rebalance.
		idle, err := m.look(ctx, check)
		if err != nil {
			return false, err
		}
		if idle {
			return true, nil
		}
	} else {
		m.idle = false
		st, idle, err := m.rebalance(ctx, check, before)
		if err != nil {
			return false, err
		}
		m.announce(st)
		if len(m.held) == 0 || m.conn == nil {
			m.publish(nil)
			return false, nil
		}
		m.publish(m.held)
		if idle {
			m.idle = true // the next timer pass looks on the relay's own session (idleCheck)
			return true, nil
		}
	}
	m.idle = false

	pctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	m.mu.Lock()
	m.cancel = cancel
	if m.lost != nil {
		cancel(m.lost)
	}
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		m.cancel = nil
		m.mu.Unlock()
	}()
	pctx = lease.With(pctx, m.w.lease)
	return true, fn(pctx, m.held)
}

// idleCheck is the loop's timer pass after an idle pass that rebalanced: it
// looks for work in this member's partitions on the relay's own session
// (session.go), in one round trip that is that session's keepalive too, and
// does not rebalance; the pass after it does. So an idle member's timer passes
// take its two sessions in turn, each pass one round trip, and each session's
// round trip every other pass stands for its keepalive (lease.IdleHeartbeat). It
// looks at the election's state in the same round trip too. It reports
// whether the pass goes on, to the rebalance: the check found work, or could
// not run (no own session, a failure); the election is not as the last
// rebalance left it (a member came or went, a partition was let go of, an
// exclusive request waits); the watch lost the membership meanwhile; or the
// last pass was not such an idle one.
func (m *membership) idleCheck(ctx context.Context, own *session.OwnSession) (work bool) {
	m.turn.Lock()
	defer m.turn.Unlock()
	if !m.idle || !m.stay || m.conn == nil || len(m.held) == 0 {
		return true
	}
	m.idle = false // the next timer pass rebalances
	m.mu.Lock()
	lost := m.lost
	m.mu.Unlock()
	if lost != nil {
		return true
	}
	r := m.r
	check := r.Statements.PartitionWork(r.MaxAttempts, r.Types, m.n, m.held)
	var look store.PartitionLook
	cctx, cancel := context.WithTimeout(ctx, session.LockTimeout)
	defer cancel()
	err := own.Do(cctx, func(ctx context.Context, conn *pgx.Conn, pid uint32) error {
		var got uint32
		var err error
		look, got, err = store.IdleLookStatement(ctx, conn, r.Presence.Mark(), check, r.Key, m.n)
		if err == nil && got != pid {
			err = session.ErrPresenceMoved
		}
		return err
	})
	// A member came or went, a partition was let go of, or a pause waits:
	// the rebalance takes it into account now, as it would have.
	return err != nil || !check.Ran || check.Work || look != m.left
}

// join tries the shared hold of the app's key on a connection of its own.
func (m *membership) join(ctx context.Context) (bool, error) {
	r := m.r
	if err := r.Sessions.Verify(ctx, r.Pool, r.Logger); err != nil {
		return false, err
	}
	lctx, cancel := context.WithTimeout(ctx, session.LockTimeout)
	defer cancel()
	now := time.Now()
	conn, locked, sess, err := tryElection(lctx, r.Pool, r.Key, store.MarkReplica(store.LockSharedSQL, r.Presence.ID()), r.Sessions.IsDirect())
	switch {
	case err != nil:
		return false, err
	case sess.readOnly:
		conn.Release()
		return false, fmt.Errorf("%w: not joining the partitioned election %q on backend %d: a lock taken on a standby excludes nobody on the primary",
			store.ErrReadOnly, r.Key, sess.pid)
	case locked == nil:
		conn.Release()
		r.Logger.LogAttrs(ctx, slog.LevelWarn, "relay: the election's key is already held by the pooled session the membership was given; not joining",
			slog.String("key", r.Key), slog.Uint64("pid", uint64(sess.pid)),
			slog.String("hint", "another holder took the key on the shared pool and released the connection, "+
				"or a transaction-pooling proxy sits between the relay and PostgreSQL"))
		return false, nil
	case !*locked:
		conn.Release() // an exclusive holder: a JVM relay, a replica with Partitions 1, a pause
		m.announce(store.PartitionState{Excluded: true})
		return false, nil
	}
	m.conn, m.sess, m.since, m.held = conn, sess, now, nil
	m.beat = store.MarkReplica(store.HeartbeatSQL(now), r.Presence.ID())
	if ok, err := store.MarkStatement(store.WithReplica(lctx, r.Presence.ID()), conn, r.Key, m.n, sess.pid); err != nil || !ok {
		m.drop(err)
		return false, fmt.Errorf("relay: mark the membership of %q with Partitions %d: %w", r.Key, m.n, cmp.Or(err, errors.New("refused")))
	}
	m.mu.Lock()
	m.lost = nil
	m.mu.Unlock()
	return true, nil
}

// rebalance takes free partitions up to this member's share and lets go of
// those above it (see the top of the file), and reports whether the pass is
// idle: check found nothing in the partitions held before, which it still
// holds. The watch is paused while it runs; a failure ends the membership.
func (m *membership) rebalance(ctx context.Context, check *store.WorkCheck, before []int) (_ store.PartitionState, idle bool, err error) {
	r := m.r
	if err := m.pause(); err != nil {
		m.drop(err)
		return store.PartitionState{}, false, err
	}
	rctx, cancel := context.WithTimeout(ctx, session.LockTimeout)
	defer cancel()
	sent := time.Now()
	m.rebalanced = sent
	st, err := store.RebalanceStatement(store.WithReplica(rctx, r.Presence.ID()), m.conn, r.Key, m.n, m.start, m.sess.pid, check)
	if err != nil {
		m.drop(err)
		return store.PartitionState{}, false, fmt.Errorf("relay: rebalance the partitions of %q: %w", r.Key, err)
	}
	m.held = st.Held
	var release []int
	switch floor, ceil := m.n/st.Members, (m.n+st.Members-1)/st.Members; {
	case st.Waiter:
		m.leave(ctx)
		return st, false, nil
	case len(m.held) > ceil:
		release = m.held[ceil:]
	case len(m.held) > floor && st.Fewest < floor:
		release = m.held[len(m.held)-1:]
	}
	if len(release) > 0 {
		m.publish(m.held[:len(m.held)-len(release)]) // before another can take them
		ok, err := store.ReleasePartitionsStatement(rctx, m.conn, r.Key, m.n, release, false, m.sess.pid)
		if err == nil && !ok {
			err = fmt.Errorf("%w: backend %d did not hold partitions %v it was given", lease.ErrLost, m.sess.pid, release)
		}
		if err != nil {
			m.drop(err)
			return store.PartitionState{}, false, fmt.Errorf("relay: release partitions %v of %q: %w", release, r.Key, err)
		}
		m.held = slices.Clone(m.held[:len(m.held)-len(release)])
	}
	m.left = store.PartitionLook{Members: st.Members, Held: st.Others + len(m.held)}
	idle = check != nil && check.Ran && !check.Work && slices.Equal(before, m.held)
	// Between idle passes the watch's heartbeat waits lease.IdleHeartbeat, past the
	// next rebalance; a pass that delivers runs under the election's.
	every := lease.Heartbeat
	if idle {
		every = lease.IdleHeartbeat
	}
	m.resume(sent, every)
	return st, idle, nil
}

// look is a woken pass's question between two rebalances, on the
// membership's session, without the configuration lock: whether its
// partitions have anything to deliver (check), with the election's heartbeat
// in the same round trip, which renews the lease as the watch's would. It
// reports whether the pass is idle; a failure ends the membership.
func (m *membership) look(ctx context.Context, check *store.WorkCheck) (idle bool, err error) {
	lctx, cancel := context.WithTimeout(ctx, session.LockTimeout)
	defer cancel()
	sent := time.Now()
	pid, err := store.MemberLookStatement(store.WithReplica(lctx, m.r.Presence.ID()), m.conn, m.beat, check)
	if err == nil && pid != m.sess.pid {
		err = store.SessionMoved("the look at the partitions", m.sess.pid, pid)
	}
	if err != nil {
		m.drop(err)
		return false, fmt.Errorf("relay: look at the partitions of %q: %w", m.r.Key, err)
	}
	idle = check.Ran && !check.Work
	every := lease.Heartbeat
	if idle {
		every = lease.IdleHeartbeat
	}
	m.resume(sent, every)
	return idle, nil
}

// pause stops the watch, so that this goroutine can use the session, and
// returns why the session was lost meanwhile, if it was.
func (m *membership) pause() error {
	if m.w == nil {
		return nil
	}
	lost := m.w.stop()
	m.w = nil
	return lost
}

// resume watches the session again, with a lease from at, when the session
// last answered, and a heartbeat every every.
func (m *membership) resume(at time.Time, every time.Duration) {
	if m.conn == nil || m.w != nil {
		return
	}
	m.w = startWatch(m.conn.Conn().PgConn(), m.sess.pid, m.since, at, every, m.r.Presence.ID(), func(err error) {
		m.mu.Lock()
		defer m.mu.Unlock()
		m.lost = err
		if m.cancel != nil {
			m.cancel(err)
		}
	})
}

// drop ends a membership whose session failed or was lost (why): closing the
// connection ends the session, and the server frees whatever it held. When a
// statement of the session ran on another backend, the session's locks are on
// a server connection of the pooler's, and are let go of there first
// (closeSession).
func (m *membership) drop(why error) {
	m.publish(nil)
	_ = m.pause()
	if m.conn != nil {
		closeSession(context.Background(), m.conn, m.r.Key, m.sess)
		attrs := []slog.Attr{slog.Any("partitions", m.held)}
		if why != nil {
			attrs = append(attrs, slog.String("error", why.Error()))
		}
		m.r.Logger.LogAttrs(context.Background(), slog.LevelWarn, "relay: left the partitioned election: its session was lost", attrs...)
	}
	m.conn, m.held = nil, nil
}

// leave lets go of the partitions and of the app's key, on the membership's
// own session, under its own deadline (ctx may be cancelled already).
func (m *membership) leave(ctx context.Context) {
	if m.conn == nil {
		return
	}
	if lost := m.pause(); lost != nil {
		m.drop(lost)
		return
	}
	r := m.r
	m.publish(nil) // before another can take them
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), session.UnlockTimeout)
	defer cancel()
	ok, err := store.ReleasePartitionsStatement(uctx, m.conn, r.Key, m.n, m.held, true, m.sess.pid)
	if err == nil && !ok {
		err = fmt.Errorf("%w: backend %d did not hold partitions %v and its member mark", lease.ErrLost, m.sess.pid, m.held)
	}
	if err != nil {
		closeSession(uctx, m.conn, r.Key, m.sess)
	} else {
		err = releaseElection(uctx, m.conn, r.Key, m.sess, store.UnlockSharedSQL)
	}
	if err != nil {
		r.Logger.LogAttrs(ctx, slog.LevelWarn, "relay: leave the partitioned election", slog.String("error", err.Error()))
	}
	m.conn, m.held = nil, nil
}

// announce logs, once per streak, why this member holds no partition, or
// holds them while others wait.
func (m *membership) announce(st store.PartitionState) {
	var msg string
	var attrs []slog.Attr
	switch {
	case st.Excluded:
		msg = "relay: an exclusive holder of the election's key (a JVM relay, a replica with Partitions 1, a pause) keeps this replica out of the partitioned election"
	case st.Waiter:
		msg = "relay: an exclusive request waits for the election's key (a pause, or a replica with Partitions 1): left the partitioned election until it is let go"
	case st.ForeignN != 0:
		msg = "relay: partitions are held with another Partitions: this replica takes none until their holders stop"
		attrs = []slog.Attr{slog.Int("partitions", m.n), slog.Int("held_with", st.ForeignN)}
	}
	if msg == m.announced {
		return
	}
	m.announced = msg
	if msg != "" {
		m.r.Logger.LogAttrs(context.Background(), slog.LevelWarn, msg, append(attrs, slog.String("key", m.r.Key))...)
	}
}
