package console

import (
	"fmt"
	"html"
	"html/template"
	"math"
	"strings"
	"time"

	"github.com/xadm/relay"
	"github.com/xadm/relay/internal/tools/diagnose"
)

// chart is one picture drawn on the server as inline SVG: no script, no
// external file, so it passes the console's Content-Security-Policy and
// renders in any browser, or in a mail, as it is.
type chart struct {
	ID     string // the svg element's id, for tests
	Title  string
	Values []float64 // one per step, oldest first
	Bars   bool      // bars (counts) or a line over an area (durations)
	Label  func(v float64) string
	Color  string
	Step   time.Duration
}

// Geometry of a chart, in SVG user units (pixels at 100%).
const (
	chartW, chartH       = 560, 150
	chartLeft, chartTop  = 58, 22
	chartRight, chartBot = 10, 22
)

// svg renders c. The y axis runs from 0 to a round number at or above the
// largest value; the x axis is the window, its right edge now.
func (c chart) svg() template.HTML {
	var b strings.Builder
	pw, ph := float64(chartW-chartLeft-chartRight), float64(chartH-chartTop-chartBot)
	top := 0.0
	for _, v := range c.Values {
		top = max(top, v)
	}
	if c.Bars {
		top = niceCeil(top)
	} else {
		top = niceSeconds(top)
	}
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" class="chart" id="%s" width="%d" height="%d" viewBox="0 0 %d %d" role="img" aria-label="%s">`,
		html.EscapeString(c.ID), chartW, chartH, chartW, chartH, html.EscapeString(c.Title))
	fmt.Fprintf(&b, `<title>%s</title>`, html.EscapeString(c.Title))
	fmt.Fprintf(&b, `<rect x="0" y="0" width="%d" height="%d" fill="#fff"/>`, chartW, chartH)
	fmt.Fprintf(&b, `<text x="%d" y="14" class="ct">%s</text>`, chartLeft, html.EscapeString(c.Title))
	// Grid lines and the y axis's labels: 0, half, top (only 0 when empty).
	marks := []float64{0, 0.5, 1}
	if top == 0 {
		marks = marks[:1]
	}
	for _, f := range marks {
		y := float64(chartTop) + ph*(1-f)
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="%s"/>`, chartLeft, y, chartW-chartRight, y, map[bool]string{true: "#9aa6bd", false: "#e6e8ec"}[f == 0])
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" class="cy" text-anchor="end">%s</text>`, chartLeft-6, y+4, html.EscapeString(c.Label(top*f)))
	}
	// The x axis: every quarter of the window, as minutes ago.
	n := len(c.Values)
	window := time.Duration(n) * c.Step
	for q := 0; q <= 4; q++ {
		x := float64(chartLeft) + pw*float64(q)/4
		label := "now"
		if q < 4 {
			label = "−" + short(window*time.Duration(4-q)/4)
		}
		anchor := "middle"
		if q == 4 {
			anchor = "end"
		}
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" class="cx" text-anchor="%s">%s</text>`, x, chartH-6, anchor, label)
	}
	if n > 0 && top > 0 {
		w := pw / float64(n)
		if c.Bars {
			for i, v := range c.Values {
				if v <= 0 {
					continue
				}
				h := ph * v / top
				fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%s: %s</title></rect>`,
					float64(chartLeft)+w*float64(i)+w*0.1, float64(chartTop)+ph-h, max(w*0.8, 0.5), h, c.Color,
					stepLabel(n, i, c.Step), html.EscapeString(c.Label(v)))
			}
		} else {
			var pts strings.Builder
			for i, v := range c.Values {
				fmt.Fprintf(&pts, "%.1f,%.1f ", float64(chartLeft)+w*float64(i+1), float64(chartTop)+ph*(1-v/top))
			}
			base := float64(chartTop) + ph
			fmt.Fprintf(&b, `<polygon points="%.1f,%.1f %s%.1f,%.1f" fill="%s" fill-opacity="0.15"/>`,
				float64(chartLeft)+w, base, pts.String(), float64(chartW-chartRight), base, c.Color)
			fmt.Fprintf(&b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="1.8"/>`, strings.TrimSpace(pts.String()), c.Color)
		}
	}
	if top == 0 {
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" class="cn" text-anchor="middle">none</text>`, float64(chartLeft)+pw/2, float64(chartTop)+ph/2)
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String()) // built from numbers and escaped text only
}

// stepLabel names step i of n as "from −12m to −11m".
func stepLabel(n, i int, step time.Duration) string {
	from, to := time.Duration(n-i)*step, time.Duration(n-i-1)*step
	if to == 0 {
		return "the last " + short(step)
	}
	return "−" + short(from) + " to −" + short(to)
}

// short is a whole number of seconds, minutes or hours as 30s, 45m or 1h,
// else as diagnose.Duration writes it.
func short(d time.Duration) string {
	switch {
	case d >= time.Hour && d%time.Hour == 0:
		return fmt.Sprintf("%dh", d/time.Hour)
	case d >= time.Minute && d%time.Minute == 0:
		return fmt.Sprintf("%dm", d/time.Minute)
	case d >= time.Minute && d%time.Second == 0 && d < time.Hour:
		return fmt.Sprintf("%dm%02ds", d/time.Minute, d%time.Minute/time.Second)
	case d >= time.Second && d%time.Second == 0:
		return fmt.Sprintf("%ds", d/time.Second)
	}
	switch {
	case d >= time.Hour && d%time.Hour == 0:
		return fmt.Sprintf("%dh", d/time.Hour)
	case d >= time.Minute && d%time.Minute == 0:
		return fmt.Sprintf("%dm", d/time.Minute)
	}
	return diagnose.Duration(d)
}

// niceCeil is the smallest of 1, 2, 2.5, 5 × 10^k at or above v (0 for 0).
func niceCeil(v float64) float64 {
	if v <= 0 || math.IsNaN(v) || math.IsInf(v, 0) {
		return 0
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*p >= v*(1-1e-9) {
			return m * p
		}
	}
	return 10 * p
}

// niceSeconds is the smallest round duration, in seconds, at or above v: 1,
// 2, 5, 10, 15, 30 s, 1, 2, 5, 10, 15, 30 min, 1, 2, 3, 6, 12, 24 h, then
// whole days by niceCeil (0 for 0).
func niceSeconds(v float64) float64 {
	if v <= 0 || math.IsNaN(v) || math.IsInf(v, 0) {
		return 0
	}
	for _, s := range []float64{1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400} {
		if s >= v {
			return s
		}
	}
	return 86400 * niceCeil(v/86400)
}

// countLabel and lagLabel are the y axes' labels.
func countLabel(v float64) string { return diagnose.Count(int64(math.Round(v))) }

func lagLabel(v float64) string {
	if v == 0 {
		return "0"
	}
	return short(time.Duration(v * float64(time.Second)))
}

// The charts page's window and step.
const (
	chartWindow = time.Hour
	chartStep   = time.Minute
)

// chartsView is the charts page of one source.
type chartsView struct {
	Index      int
	App, Table string
	From, To   time.Time
	FromID     int64
	Cached     bool // read less than historyFresh ago, by an earlier view
	All        chartPair
	Types      []chartPair
	Process    *processView
}

// chartPair is one type's (or all types') two charts.
type chartPair struct {
	Type            string // "" for all types
	Delivered, Lag  template.HTML
	Total           int64
	LagNow, LagMax  time.Duration
	DeliveredPerMin float64
	DeliveredInPeak int64
}

// processView is this process's relay, from its Stats sampled at each view.
type processView struct {
	Sent      int64
	Lag       time.Duration
	LastPass  time.Time
	Samples   int
	Delivered template.HTML // nil with fewer than two samples in the window
}

func newChartsView(i int, s *source, h relay.History) chartsView {
	v := chartsView{Index: i, App: s.Admin.AppName(), Table: s.Admin.Table(), From: h.From, To: h.To, FromID: h.FromID}
	steps := int(chartWindow / chartStep)
	allDelivered, allLag := make([]int64, steps), make([]time.Duration, steps)
	for _, th := range h.Types {
		for k := range min(steps, len(th.Delivered)) {
			allDelivered[k] += th.Delivered[k]
			allLag[k] = max(allLag[k], th.Lag[k])
		}
		v.Types = append(v.Types, newChartPair(th.Type, th.Delivered, th.Lag, h.Step))
	}
	v.All = newChartPair("", allDelivered, allLag, h.Step)
	return v
}

func newChartPair(typ string, delivered []int64, lag []time.Duration, step time.Duration) chartPair {
	p := chartPair{Type: typ}
	counts, lags := make([]float64, len(delivered)), make([]float64, len(lag))
	for i, n := range delivered {
		counts[i] = float64(n)
		p.Total += n
		p.DeliveredInPeak = max(p.DeliveredInPeak, n)
	}
	for i, d := range lag {
		lags[i] = d.Seconds()
		p.LagMax = max(p.LagMax, d)
	}
	if len(lag) > 0 {
		p.LagNow = lag[len(lag)-1]
	}
	if len(delivered) > 0 {
		p.DeliveredPerMin = float64(p.Total) / (float64(len(delivered)) * step.Minutes())
	}
	id, name := "all", "all types"
	if typ != "" {
		id, name = "type-"+typ, typ
	}
	p.Delivered = chart{ID: "delivered-" + id, Title: "delivered per minute · " + name, Values: counts, Bars: true,
		Label: countLabel, Color: "#2f6fd0", Step: step}.svg()
	p.Lag = chart{ID: "lag-" + id, Title: "lag · " + name, Values: lags, Label: lagLabel, Color: "#d0572f", Step: step}.svg()
	return p
}

// newProcessView draws this process's relay's deliveries per minute from the
// samples of its Stats: each pair of samples spreads its deliveries evenly
// over the minutes between them.
func newProcessView(st relay.Stats, samples []statSample, now time.Time) *processView {
	p := &processView{Sent: st.Sent, Lag: st.Lag, LastPass: st.LastPassAt, Samples: len(samples)}
	if len(samples) < 2 {
		return p
	}
	steps := int(chartWindow / chartStep)
	from := now.Add(-chartWindow)
	per := make([]float64, steps)
	for j := 1; j < len(samples); j++ {
		a, b := samples[j-1], samples[j]
		n, span := float64(b.sent-a.sent), b.at.Sub(a.at)
		if n <= 0 || span <= 0 {
			continue
		}
		for k := range steps {
			lo, hi := from.Add(time.Duration(k)*chartStep), from.Add(time.Duration(k+1)*chartStep)
			end, begin := hi, lo
			if b.at.Before(end) {
				end = b.at
			}
			if a.at.After(begin) {
				begin = a.at
			}
			overlap := end.Sub(begin)
			if overlap > 0 {
				per[k] += n * float64(overlap) / float64(span)
			}
		}
	}
	p.Delivered = chart{ID: "delivered-process", Title: "delivered per minute · this process's relay (sampled at each view)",
		Values: per, Bars: true, Label: countLabel, Color: "#2f9e58", Step: chartStep}.svg()
	return p
}
