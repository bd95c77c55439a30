package otelrelay

import (
	"context"
	"fmt"
	"sync"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"
)

// A recorded span's End runs the tracer's span processors, and a
// synchronous one (sdktrace.WithSyncer) exports there and then. An exporter
// that hangs would hold the Send past its deadline, and the relay would fail
// a message the receiver had accepted. So a send span ends here, on a
// goroutine of the module's, never on the Send's path: a sick tracer costs
// spans, never a delivery.

// endQueueMax is how many spans may wait to end. Past it, while an End does
// not return, spans are dropped unended (never exported).
const endQueueMax = 4096

// spanEnds ends every wrapped sender's spans.
var spanEnds ender

// ender ends spans in the order they came, on one goroutine started when
// spans wait and gone when none do.
type ender struct {
	mu       sync.Mutex
	queue    []trace.Span
	running  bool
	handed   uint64        // spans handed to end, dropped ones included
	done     uint64        // of those, ended or dropped
	progress chan struct{} // closed, and replaced, whenever done grows
	dropping bool          // spans are being dropped: said once per episode
}

// end ends a recorded span on the ender's goroutine.
func (e *ender) end(span trace.Span) {
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
	e.queue = append(e.queue, span)
	if !e.running {
		e.running = true
		go e.run()
	}
	e.mu.Unlock()
}

func (e *ender) run() {
	for {
		e.mu.Lock()
		spans := e.queue
		e.queue = nil
		if len(spans) == 0 {
			e.running = false
			e.mu.Unlock()
			return
		}
		e.mu.Unlock()
		for _, s := range spans {
			endSpan(s)
		}
		e.mu.Lock()
		e.done += uint64(len(spans))
		e.dropping = false // an End returned: a new episode of drops is said again
		if e.progress != nil {
			close(e.progress)
			e.progress = nil
		}
		e.mu.Unlock()
	}
}

// endSpan ends s; a panic inside costs the span only.
func endSpan(s trace.Span) {
	defer func() { _ = recover() }()
	s.End()
}

// Flush returns once every send span whose Send returned before the call has
// ended (or was dropped: see [WrapSender]), or when ctx ends, with its error.
// Call it after [relay.Relay.Stop] and before the TracerProvider's Shutdown,
// so that the last sends' spans are exported.
func Flush(ctx context.Context) error {
	e := &spanEnds
	e.mu.Lock()
	target := e.handed
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
