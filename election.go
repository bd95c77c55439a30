package relay

import (
	"fmt"

	"github.com/xadm/relay/internal/election"
	"github.com/xadm/relay/internal/loop"
	"github.com/xadm/relay/internal/session"
)

// This file is how the relay's passes are elected, decided once, in New
// (chooseElection), as one of internal/election's four elections, and the
// passes built over them (internal/loop: the pass slot that Run,
// RunIfElected and the loop share).

// chooseElection picks the relay's election, once. With ClusterLock and no
// Guard it is the relay's own PostgresGuard on its pool, as it is when the
// adopter passes one on that same pool.
func (r *Relay) chooseElection(guard Guard) (election.Election, error) {
	er := &election.Deps{Pool: r.pool, Logger: r.logger, Key: r.key, Table: r.cfg.Table, Types: r.types,
		MaxAttempts: r.cfg.MaxAttempts, Partitions: r.cfg.Partitions, Interval: r.cfg.Interval, Presence: r.presence,
		Statements: r.repo}
	r.direct = election.NewNone(er)
	if !r.cfg.ClusterLock {
		return r.direct, nil
	}
	own, _ := guard.(*PostgresGuard)
	if guard == nil {
		own = NewPostgresGuard(r.pool)
		own.g.SetLogger(r.logger)
	}
	onPool := own != nil && own.g.Pool() == r.pool
	// The election would hold the pool's only connection while the pass waits
	// for another: fail now rather than at every pass.
	if onPool && r.maxConns < 2 {
		return nil, fmt.Errorf("relay: the pool allows %d connection; the election holds one for the whole pass "+
			"and the pass needs another: set pool_max_conns to at least 2", r.maxConns)
	}
	switch { // the check that the pool keeps its sessions, shared with the guard on it
	case onPool:
		r.sessions = own.g.Sessions()
	case r.cfg.Partitions > 1:
		r.sessions = &session.SessionCheck{}
	}
	er.Sessions = r.sessions
	switch {
	case r.cfg.Partitions > 1:
		return election.NewMember(er), nil
	case !onPool:
		return election.NewGuarded(er, guard), nil
	}
	return election.NewPolled(er, own.g), nil
}

// newPasses builds the relay's passes (internal/loop), once, in New, over
// the elections chooseElection chose.
func (r *Relay) newPasses() *loop.Passes {
	return loop.New(loop.Deps{Pool: r.pool, Logger: r.logger, Interval: r.cfg.Interval, Enabled: r.cfg.Enabled,
		Election: r.election, Direct: r.direct, Runner: r.runner,
		Learn: r.outbox.Learn, Keyed: r.outbox.Keyed, Sendable: r.sendable,
		Report: r.passDone, Failing: r.failing})
}
