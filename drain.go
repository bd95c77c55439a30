package relay

import (
	"context"
	"sync"
	"time"
)

// drain is the periodic pass's way through a backlog: one election,
// Concurrency workers, and the next batch selected as soon as the current one
// is all dispatched, while its last messages are still in flight. Batch by
// batch, every batch's slowest messages would leave workers idle.
//
// A key in flight is never dispatched again: its later messages, selected
// again, are skipped until a later batch finds the key idle. Outcomes are
// flushed before each select, so a message sent in this pass is never
// selected as still pending. Draining stops when a batch comes back short,
// after drainMax (the next tick then elects again at once), on halt, when a
// recording fails, or after a failure: the destination may be struggling, and
// a failed row waits for the next tick, not the next batch. Memory is bounded by BatchSize rows plus those in flight.
func (r *Relay) drain(ctx context.Context, o *passOpts) passResult {
	var res passResult
	rec := r.newRecorder(ctx, &res)
	start := time.Now()

	type finished struct {
		key    string
		failed bool
	}
	work := make(chan []*row)
	done := make(chan finished, r.cfg.Concurrency)
	var stop sync.Once
	stopped := make(chan struct{})
	var wg sync.WaitGroup
	for range r.cfg.Concurrency {
		wg.Go(func() {
			for group := range work {
				allSent, halt := r.deliverKey(ctx, o, rec, group)
				if halt {
					stop.Do(func() { close(stopped) })
				}
				done <- finished{key: group[0].Key, failed: !allSent && !halt}
			}
		})
	}

	var (
		queue    [][]*row
		busy     = make(map[string]bool, r.cfg.Concurrency)
		more     = true  // the last batch came back full: select again when the queue runs dry
		waitDone = false // the last select found only keys in flight: wait for one to finish first
		first    = true
	)
	for {
		select {
		case <-stopped:
			more, queue = false, nil
		default:
		}
		if halted(ctx, o) {
			more, queue = false, nil
		}
		if len(queue) == 0 && more && !waitDone {
			if err := rec.flush(); err != nil {
				break
			}
			rows, err := r.fetch(ctx)
			if err != nil {
				res.err = err
				break
			}
			if first && len(rows) > 0 {
				res.lag = max(time.Since(rows[0].CreatedAt), 0)
			}
			first = false
			// Rows skipped because their key is in flight are selected again
			// once it is idle, even from a short batch.
			skipped := false
			for _, g := range byKey(rows) {
				if busy[g[0].Key] {
					skipped = true
				} else {
					queue = append(queue, g)
				}
			}
			more = len(rows) == r.cfg.BatchSize || skipped
			if more && time.Since(start) > drainMax {
				more, res.backlog = false, true
			}
			waitDone = len(queue) == 0 && len(busy) > 0
		}
		if len(queue) == 0 && len(busy) == 0 && !(more && !waitDone) {
			break
		}
		var send chan []*row
		var next []*row
		if len(queue) > 0 {
			send, next = work, queue[0]
		}
		select {
		case send <- next:
			busy[next[0].Key] = true
			queue = queue[1:]
		case f := <-done:
			delete(busy, f.key)
			waitDone = false
			if f.failed {
				more = false // the failed rows wait for the next tick
			}
		}
	}
	close(work)
	for len(busy) > 0 {
		delete(busy, (<-done).key)
	}
	wg.Wait()
	if err := rec.flush(); err != nil && res.err == nil {
		res.err = err
	} else if res.err == nil && ctx.Err() != nil {
		res.err = context.Cause(ctx)
	}
	return res
}
