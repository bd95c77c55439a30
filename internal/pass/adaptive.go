package pass

import "context"

// adaptiveOutcomes is the default recording (GroupOutcomes 0,
// docs/decisions/0037-adaptive-outcomes.md). A worker's writer writes its
// outcomes as soon as it is free: one alone, in its own transaction, while
// they trickle — no timer, so a message's outcome is written as fast as with
// one transaction each — and what queued while a write was on its way all
// together, in one fenced statement, once that write returns. Under a backlog
// the groups grow by themselves, up to adaptivePipeline per worker; a group
// the server refuses as a whole is written again one transaction each.
//
// The bound a crash of the relay pays: at most adaptivePipeline sent messages
// per worker whose outcomes were waiting, beyond the one in flight, and never
// older than one write's round trip plus the sends made meanwhile.
type adaptiveOutcomes struct{ rc *recorder }

func (s adaptiveOutcomes) ready(context.Context) error { return s.rc.errorOf() }

func (s adaptiveOutcomes) hold(ctx context.Context, conn *heldConn) error {
	_, err := conn.get(ctx)
	return s.rc.keep(err)
}

func (s adaptiveOutcomes) add(ds []delivery, conn *heldConn) error {
	recorded, err := s.rc.writeAs(ds, conn, writeTogetherOrApart)
	s.rc.waiting.add(-len(ds))
	s.rc.report(recorded)
	return s.rc.keep(err)
}

func (s adaptiveOutcomes) flush() error { return s.rc.errorOf() }
func (s adaptiveOutcomes) close() error { return s.rc.errorOf() }
