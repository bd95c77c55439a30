package otelrelay

import (
	"context"
	"fmt"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"
)

// A recorded span's End runs the tracer's span processors, and a
// synchronous one (sdktrace.WithSyncer) exports there and then. An exporter
// that hangs would hold the Send past its deadline, and the relay would fail
// a message the receiver had accepted. So a send span ends here, on a
// goroutine of the module's, never on the Send's path: a sick tracer costs
// spans, never a delivery.
//
// The spans are handed over in batches: a Send notes its span's end time and
// queues it, and the goroutine is started once endBatch spans wait, or
// endDelay after the first of them, so that a busy relay does not wake a
// goroutine for each span. Each span ends with the time its Send noted.

// endQueueMax is how many spans may wait to end. Past it, while an End does
// not return, spans are dropped unended (never exported).
const endQueueMax = 4096

// endBatch is how many waiting spans start the ender at once.
const endBatch = 64

// endDelay is the longest a span waits to end when fewer than endBatch do.
const endDelay = 5 * time.Millisecond

// spanEnds ends every wrapped sender's spans.
var spanEnds ender

// ender ends spans in the order they came, on one goroutine started when
// spans wait and gone when none do.
type ender struct {
	mu       sync.Mutex
	queue    []ending
	spare    []ending // the last batch's, for the next queue
	running  bool
	timer    *time.Timer // endDelay after the first span waits; armed says it will fire
	armed    bool
	handed   uint64        // spans handed to end, dropped ones included
	done     uint64        // of those, ended or dropped
	progress chan struct{} // closed, and replaced, whenever done grows
	dropping bool          // spans are being dropped: said once per episode
}

// ending is a span to end, and when its Send ended it.
type ending struct {
	span trace.Span
	at   time.Time
}

// end ends a recorded span on the ender's goroutine, at the time of the call.
func (e *ender) end(span trace.Span) {
	at := time.Now()
	e.mu.Lock()
	e.handed++
	if len(e.queue) >= endQueueMax {
		e.done++
		first := !e.dropping
		e.dropping = true
		e.mu.Unlock()
		if first {
			otel.Handle(fmt.Errorf("otelrelay: the tracer's span processor has not returned from a span's End; "+
				"send spans are dropped while %d wait", endQueueMax))
		}
		return
	}
	e.queue = append(e.queue, ending{span, at})
	switch {
	case e.running:
	case len(e.queue) >= endBatch:
		e.running = true
		go e.run()
	case !e.armed:
		e.armed = true
		if e.timer == nil {
			e.timer = time.AfterFunc(endDelay, e.timeUp)
		} else {
			e.timer.Reset(endDelay)
		}
	}
	e.mu.Unlock()
}

// timeUp ends the spans that wait, endDelay after the first of them came.
func (e *ender) timeUp() {
	e.mu.Lock()
	e.armed = false
	if e.running || len(e.queue) == 0 {
		e.mu.Unlock()
		return
	}
	e.running = true
	e.mu.Unlock()
	e.run()
}

func (e *ender) run() {
	for {
		e.mu.Lock()
		spans := e.queue
		e.queue, e.spare = e.spare[:0], nil
		if len(spans) == 0 {
			e.running = false
			e.spare = spans
			e.mu.Unlock()
			return
		}
		e.mu.Unlock()
		for i := range spans {
			endSpan(spans[i])
			spans[i] = ending{}
		}
		e.mu.Lock()
		e.spare = spans
		e.done += uint64(len(spans))
		e.dropping = false // an End returned: a new episode of drops is said again
		if e.progress != nil {
			close(e.progress)
			e.progress = nil
		}
		e.mu.Unlock()
	}
}

// endSpan ends s.span at s.at (on the SDK's span, its start plus the
// monotonic time since, as the SDK's own End reckons); a panic inside costs
// the span only.
func endSpan(s ending) {
	defer func() { _ = recover() }()
	at := s.at
	if st, ok := s.span.(interface{ StartTime() time.Time }); ok {
		if start := st.StartTime(); !start.IsZero() {
			at = start.Add(s.at.Sub(start))
		}
	}
	s.span.End(trace.WithTimestamp(at))
}

// Flush returns once every send span whose Send returned before the call has
// ended (or was dropped: see [WrapSender]), or when ctx ends, with its error.
// Call it after [relay.Relay.Stop] and before the TracerProvider's Shutdown,
// so that the last sends' spans are exported.
func Flush(ctx context.Context) error {
	e := &spanEnds
	e.mu.Lock()
	target := e.handed
	if !e.running && len(e.queue) > 0 {
		e.running = true
		go e.run()
	}
	for e.done < target {
		if e.progress == nil {
			e.progress = make(chan struct{})
		}
		p := e.progress
		e.mu.Unlock()
		select {
		case <-p:
		case <-ctx.Done():
			return ctx.Err()
		}
		e.mu.Lock()
	}
	e.mu.Unlock()
	return nil
}
