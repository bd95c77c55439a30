package main

import (
	"cmp"
	"fmt"
	"html"
	"io"
	"slices"
	"strings"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	otelrelay "github.com/xadm/relay/otel"
)

// drawTrace draws spans as a waterfall, one row per span in start order,
// each indented under its parent and placed on one time axis; a link is a
// dashed arrow from the linked span. Spans of several traces (the send span
// linked, not a child) are drawn on the same axis, each trace labelled.
func drawTrace(w io.Writer, spans []sdktrace.ReadOnlySpan) error {
	if len(spans) == 0 {
		return fmt.Errorf("no span to draw")
	}
	spans = slices.Clone(spans)
	slices.SortFunc(spans, func(a, b sdktrace.ReadOnlySpan) int { return a.StartTime().Compare(b.StartTime()) })
	start, end := spans[0].StartTime(), spans[0].EndTime()
	depth := map[trace.SpanID]int{}
	row := map[trace.SpanID]int{}
	for i, s := range spans {
		end = later(end, s.EndTime())
		if d, ok := depth[s.Parent().SpanID()]; ok && s.Parent().IsValid() {
			depth[s.SpanContext().SpanID()] = d + 1
		} else {
			depth[s.SpanContext().SpanID()] = 0
		}
		row[s.SpanContext().SpanID()] = i
	}
	total := max(end.Sub(start), time.Microsecond)

	const (
		width, labelWidth, rowHeight, top, indent = 1000, 420, 34, 58, 16
		barWidth                                  = width - labelWidth - 30
	)
	height := top + rowHeight*len(spans) + 40
	x := func(t time.Time) float64 { return labelWidth + float64(t.Sub(start))/float64(total)*barWidth }
	colors := map[trace.SpanKind]string{
		trace.SpanKindServer: "#4e79a7", trace.SpanKindProducer: "#f28e2b", trace.SpanKindClient: "#76b7b2",
		trace.SpanKindConsumer: "#59a14f", trace.SpanKindInternal: "#bab0ac",
	}

	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n",
		width, height, width, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="6" markerHeight="6" orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="#555"/></marker></defs>`+"\n")
	fmt.Fprintf(&b, `<text x="10" y="22" font-size="15" font-weight="bold">One message, from the request that wrote it to the receiver (%s in all)</text>`+"\n",
		html.EscapeString(total.Round(time.Microsecond).String()))
	fmt.Fprintf(&b, `<text x="10" y="42" fill="#555">trace %s — colour: span kind (server, client, producer); dashed arrow: a link</text>`+"\n",
		html.EscapeString(spans[0].SpanContext().TraceID().String()))
	for i := 0; i <= 4; i++ {
		gx := labelWidth + float64(i)/4*barWidth
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#eee"/>`+"\n", gx, top-6, gx, height-30)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" fill="#777" text-anchor="middle">%s</text>`+"\n",
			gx, height-14, html.EscapeString((total * time.Duration(i) / 4).Round(time.Microsecond).String()))
	}
	traces := map[trace.TraceID]bool{}
	for i, s := range spans {
		y := top + i*rowHeight
		sc := s.SpanContext()
		label := s.Name()
		if !traces[sc.TraceID()] && len(traces) > 0 {
			label += "  (trace " + sc.TraceID().String()[:8] + "…)"
		}
		traces[sc.TraceID()] = true
		fmt.Fprintf(&b, `<text x="%d" y="%d">%s</text>`+"\n", 10+depth[sc.SpanID()]*indent, y+14, html.EscapeString(label))
		fmt.Fprintf(&b, `<text x="%d" y="%d" fill="#777" font-size="10">%s · %s · %s</text>`+"\n", 10+depth[sc.SpanID()]*indent, y+27,
			html.EscapeString(party(s)), s.SpanKind(), html.EscapeString(detail(s)))
		x0, x1 := x(s.StartTime()), x(s.EndTime())
		fmt.Fprintf(&b, `<rect x="%.1f" y="%d" width="%.1f" height="%d" rx="3" fill="%s"/>`+"\n",
			x0, y+4, max(x1-x0, 2), rowHeight-12, cmp.Or(colors[s.SpanKind()], "#bab0ac"))
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" fill="#333" font-size="10">%s</text>`+"\n",
			min(x1+4, width-60), y+18, html.EscapeString(s.EndTime().Sub(s.StartTime()).Round(time.Microsecond).String()))
		for _, l := range s.Links() {
			if from, ok := row[l.SpanContext.SpanID()]; ok {
				fy := top + from*rowHeight + rowHeight/2
				fmt.Fprintf(&b, `<path d="M%.1f,%d C%.1f,%d %.1f,%d %.1f,%d" fill="none" stroke="#555" stroke-dasharray="4 3" marker-end="url(#arrow)"/>`+"\n",
					x(spans[from].EndTime()), fy, x0-30, fy, x0-30, y+rowHeight/2, x0, y+rowHeight/2)
			}
		}
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// detail is what a span's attributes say of it, briefly.
func detail(s sdktrace.ReadOnlySpan) string {
	var parts []string
	for _, kv := range s.Attributes() {
		switch kv.Key {
		case "messaging.system", "messaging.destination.name", "relay.message.attempt", "error.type":
			parts = append(parts, string(kv.Key)+"="+kv.Value.String())
		}
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, " ")
}

// party names who made s: the relay for the send spans, else the tracer's name.
func party(s sdktrace.ReadOnlySpan) string {
	if s.InstrumentationScope().Name == otelrelay.ScopeName {
		return "relay (otelrelay)"
	}
	return s.InstrumentationScope().Name
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
