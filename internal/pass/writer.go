package pass

import "context"

// writer writes one worker's outcomes on a goroutine of its own, so that the
// worker sends its next message while the last one's outcome is being
// written: the send and the write's round trip overlap. It holds the
// connection the outcomes are written on (one transaction each) from before
// the worker's first send; with GroupOutcomes it hands them to the recorder's
// group instead. It also says when a task's keys are done — once their
// outcomes are recorded, never before, so that the engine never selects a
// row whose outcome is on its way as if it were still waiting.
type writer struct {
	rc    *recorder
	conn  heldConn
	in    chan submission
	slots chan struct{} // one per outcome handed over and not yet recorded: at most the recorder's pipeline
	done  chan struct{}
	one   [1]delivery // recordOne's, when the worker adds to the group itself (the group copies it)
}

// submission is outcomes to record; once they are, ack (if set) is closed and
// done (if finished is set) goes to finished.
type submission struct {
	ds       []delivery
	ack      chan struct{}
	done     taskDone
	finished chan<- taskDone
}

// newWriter starts a worker's writer, holding its connection first.
func (rc *recorder) newWriter(ctx context.Context) (*writer, error) {
	// The worker sends on while up to the recorder's pipeline of outcomes wait to be
	// written (slots), in submissions that also carry its tasks' keys.
	if err := rc.errorOf(); err != nil {
		return nil, err // the pass failed: hold nothing for sends that will not start
	}
	w := &writer{rc: rc, conn: heldConn{src: rc.r.deps.Outbox}, in: make(chan submission, 2*rc.pipeline),
		slots: make(chan struct{}, rc.pipeline), done: make(chan struct{})}
	if err := rc.hold(ctx, &w.conn); err != nil {
		// The pass failed meanwhile (another worker's outcome could not be
		// written), or the connection could not be had: no writer, and
		// nothing held for it.
		w.conn.release()
		return nil, err
	}
	go w.run()
	return w, nil
}

func (w *writer) run() {
	defer close(w.done)
	for s := range w.in {
		// Whatever else is waiting goes in the same round trip, each outcome
		// in its own transaction.
		batch := []submission{s}
		n := len(s.ds)
	more:
		for n < w.rc.pipeline {
			select {
			case next, ok := <-w.in:
				if !ok {
					break more
				}
				batch = append(batch, next)
				n += len(next.ds)
			default:
				break more
			}
		}
		var ds []delivery
		for _, b := range batch {
			ds = append(ds, b.ds...)
		}
		if len(ds) > 0 {
			_ = w.rc.add(ds, &w.conn) // a failure stops the pass through rc.err
			for range ds {
				<-w.slots
			}
		}
		for _, b := range batch {
			if b.ack != nil {
				close(b.ack)
			}
			if b.finished != nil {
				b.finished <- b.done
			}
		}
	}
}

// record hands ds to the writer; with wait, it returns once they are
// recorded (a key's next message is sent only after its previous outcome is
// written, so a lost write can never let it overtake). It returns the pass's
// stopping failure, if any.
func (w *writer) record(ds []delivery, wait bool) error {
	w.rc.waiting.add(len(ds))
	if w.rc.direct {
		_ = w.rc.add(ds, &w.conn) // a failure stops the pass through rc.err
		return w.rc.errorOf()
	}
	for len(ds) > 0 || wait {
		n := min(len(ds), w.rc.pipeline)
		s := submission{ds: ds[:n:n]}
		ds = ds[n:]
		last := len(ds) == 0
		if wait && last {
			s.ack = make(chan struct{})
		}
		for range s.ds {
			w.slots <- struct{}{} // waits while the pipeline is full
		}
		w.in <- s
		if s.ack != nil {
			<-s.ack
		}
		if last {
			break
		}
	}
	return w.rc.errorOf()
}

// recordOne is record of one outcome, without a slice of its own per
// message where the group takes a copy of it at once (direct).
func (w *writer) recordOne(d delivery, wait bool) error {
	if !w.rc.direct {
		return w.record([]delivery{d}, wait) // the slice goes to the writer's goroutine
	}
	w.one[0] = d
	err := w.record(w.one[:], wait)
	w.one[0] = delivery{} // holds nothing of the message past its outcome
	return err
}

// finish has the writer send done to finished once every outcome handed to
// it before is recorded.
func (w *writer) finish(done taskDone, finished chan<- taskDone) {
	if w.rc.direct {
		finished <- done // every outcome handed before is in the strategy's hands
		return
	}
	w.in <- submission{done: done, finished: finished}
}

// close waits for the last outcome and gives the connection back.
func (w *writer) close() {
	close(w.in)
	<-w.done
	w.conn.release()
}
