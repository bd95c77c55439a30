package pass

import "context"

// eachOutcomes (GroupOutcomes 1) records each outcome in its own short transaction, on the
// connection the sending worker's writer holds from before its first send;
// what waits to be written while the worker sends on goes in one round trip
// (a pipeline, one transaction per outcome). A crash re-delivers at most the
// message in flight and the outcomes waiting in the pipeline, per worker.
type eachOutcomes struct{ rc *recorder }

func (s eachOutcomes) ready(context.Context) error { return s.rc.errorOf() }

func (s eachOutcomes) hold(ctx context.Context, conn *heldConn) error {
	_, err := conn.get(ctx)
	return s.rc.keep(err)
}

func (s eachOutcomes) add(ds []delivery, conn *heldConn) error {
	recorded, err := s.rc.writeAs(ds, conn, writeApart)
	s.rc.waiting.add(-len(ds))
	s.rc.report(recorded)
	return s.rc.keep(err)
}

func (s eachOutcomes) flush() error { return s.rc.errorOf() }
func (s eachOutcomes) close() error { return s.rc.errorOf() }
