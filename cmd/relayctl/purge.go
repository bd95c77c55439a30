package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/xadm/relay"
)

// ageFlag is a duration that also takes days: 30d, 36h, 90m. It is said
// back as it was given (1000d, not 24000h0m0s).
type ageFlag struct {
	d   time.Duration
	raw string
	set bool
}

func (a *ageFlag) String() string {
	if !a.set {
		return ""
	}
	return a.raw
}

func (a *ageFlag) Set(v string) error {
	v = strings.TrimSpace(v)
	a.raw = v
	if days, ok := strings.CutSuffix(v, "d"); ok {
		n, err := strconv.ParseFloat(days, 64)
		switch {
		case err != nil && !errors.Is(err, strconv.ErrRange), math.IsNaN(n):
			return fmt.Errorf("%q is not a number of days (as in 30d)", v)
		case n < 0:
			return fmt.Errorf("%q: an age must not be negative", v)
		case n*24*float64(time.Hour) >= math.MaxInt64:
			return fmt.Errorf("%q is too long an age: at most %d days", v, int64(math.MaxInt64/(24*time.Hour)))
		}
		a.d, a.set = time.Duration(n*24*float64(time.Hour)), true
	} else {
		d, err := time.ParseDuration(v)
		if err != nil {
			return fmt.Errorf("%q is not an age: use days or a duration, as in 30d, 12h, 90m", v)
		}
		a.d, a.set = d, true
	}
	if a.d < 0 {
		return fmt.Errorf("%q: an age must not be negative", v)
	}
	return nil
}

func purgeFlags(fs *flag.FlagSet, o *opts) {
	fs.Var(&o.olderThan, "older-than", "delete the SENT rows delivered longer ago than this: 30d, 12h, 0 for all (required)")
	fs.BoolVar(&o.dryRun, "dry-run", false, "say how many rows of which types the purge would delete, and delete none")
	scopeFlags(fs, o)
}

// runPurgeEstimate is purge --dry-run.
func runPurgeEstimate(ctx context.Context, e *env) int {
	if _, code, ok := e.scope(ctx); !ok {
		return code
	}
	est, err := e.admin.EstimatePurge(ctx, e.o.olderThan.d)
	if err != nil {
		return e.fail(err)
	}
	if e.o.json {
		types := make(map[string]int64, len(est.Types))
		for _, c := range est.Types {
			types[c.Type] = c.Rows
		}
		if err := writeJSON(e.stdout, struct {
			Rows   int64            `json:"rows"`
			Types  map[string]int64 `json:"types"`
			Exact  bool             `json:"exact"`
			Cutoff time.Time        `json:"sent_before"`
		}{est.Rows, types, est.Exact, est.Cutoff.UTC()}); err != nil {
			return e.fail(err)
		}
		return exitOK
	}
	how := "counted"
	if !est.Exact {
		how = fmt.Sprintf("estimated from a sample of %s of the table's %s pages", num(est.SampledPages), num(est.Pages))
	}
	about := ""
	if !est.Exact {
		about = "about "
	}
	fprintf(e.stdout, "purge --older-than %s would delete %s%s SENT row(s) of %s delivered before %s (%s)\n",
		e.o.olderThan.String(), about, num(est.Rows), e.cfg.Table, stamp(est.Cutoff), how)
	for _, c := range est.Types {
		fprintf(e.stdout, "  %s  %s\n", num(c.Rows), c.Type)
	}
	return exitOK
}

// confirmPurge says what the purge would delete and asks; ok false with the
// exit code when it is not to go on (nothing to delete: exitOK).
func confirmPurge(ctx context.Context, e *env) (code int, ok bool) {
	est, err := e.admin.EstimatePurge(ctx, e.o.olderThan.d)
	if err != nil {
		return e.fail(err), false
	}
	if est.Exact && est.Rows == 0 {
		return 0, true // nothing to delete: nothing to ask
	}
	if !e.o.yes {
		about := ""
		if !est.Exact {
			about = "about "
		}
		fprintf(e.stderr, "relayctl: delete %s%s SENT row(s) of %s delivered before %s (more than %s ago):\n",
			about, num(est.Rows), e.cfg.Table, stamp(est.Cutoff), e.o.olderThan.String())
		for _, c := range est.Types {
			fprintf(e.stderr, "  %s%s  %s\n", about, num(c.Rows), c.Type)
		}
	}
	return e.confirm(ctx, "purge", "Delete them")
}

func runPurge(ctx context.Context, e *env) int {
	if !e.o.olderThan.set {
		return e.usageErr("purge: --older-than is required (e.g. --older-than 30d; 0 purges every SENT row)")
	}
	if e.o.dryRun {
		return runPurgeEstimate(ctx, e)
	}
	age := e.o.olderThan.d
	scope, code, ok := e.scope(ctx)
	if !ok {
		return code
	}
	if code, ok := confirmPurge(ctx, e); !ok {
		return code
	}
	p := newProgress(e.stderr, e.o.json)
	n, err := e.admin.PurgeSentProgress(ctx, age, p.update)
	p.done()
	if err != nil {
		return e.fail(err)
	}
	if e.o.json {
		if err := writeJSON(e.stdout, map[string]any{"purged": n, "types": scope.Types, "all_types": scope.All, "excluded": scope.Excluded}); err != nil {
			return e.fail(err)
		}
		return exitOK
	}
	fprintf(e.stdout, "purged %s SENT row(s) of %s delivered more than %s ago\n", num(n), e.cfg.Table, e.o.olderThan.String())
	return exitOK
}

// progress reports a purge: a bar redrawn in place on a terminal, else a
// plain line at most every plainEvery; both with the rate and the time left,
// measured against the total estimated before the first chunk. Quiet (--json)
// prints nothing. now is its clock (a test replays a purge on a fake one).
type progress struct {
	w        io.Writer
	terminal bool
	quiet    bool
	now      func() time.Time
	start    time.Time // when the estimate was known: the rate is measured from it
	last     time.Time // the last plain line
	drawn    bool
}

const plainEvery = 2 * time.Second

func newProgress(w io.Writer, quiet bool) *progress {
	return &progress{w: w, terminal: isTerminal(w), quiet: quiet, now: time.Now}
}

// update is the callback of Admin.PurgeSentProgress: deleted 0 once with the
// estimate, then after each chunk.
func (p *progress) update(deleted, expected int64) {
	if p.quiet {
		return
	}
	now := p.now()
	if p.start.IsZero() {
		p.start, p.last = now, now
		if deleted == 0 {
			fprintf(p.w, "purge: about %s SENT row(s) to delete, in chunks of %s\n", num(expected), num(relay.PurgeChunk))
			return
		}
	}
	if !p.terminal {
		if now.Sub(p.last) >= plainEvery {
			fprintf(p.w, "purge: %s\n", p.status(now, deleted, expected))
			p.last = now
		}
		return
	}
	const width = 30
	frac := 1.0
	if expected > 0 {
		frac = min(float64(deleted)/float64(expected), 1)
	}
	filled := int(frac * width)
	fprintf(p.w, "\r[%s%s] %3.0f%%  %s ", strings.Repeat("#", filled), strings.Repeat(".", width-filled), frac*100, p.status(now, deleted, expected))
	p.drawn = true
}

// status is "290,000 of ~940,000 rows  29,000 rows/s  22s left".
func (p *progress) status(now time.Time, deleted, expected int64) string {
	var b strings.Builder
	if deleted <= expected {
		fmt.Fprintf(&b, "%s of ~%s rows", num(deleted), num(expected))
	} else {
		fmt.Fprintf(&b, "%s rows, more than the ~%s estimated", num(deleted), num(expected))
	}
	elapsed := now.Sub(p.start)
	if elapsed < 100*time.Millisecond || deleted == 0 {
		fmt.Fprintf(&b, "  %s", elapsed.Round(time.Second))
		return b.String()
	}
	rate := float64(deleted) / elapsed.Seconds()
	fmt.Fprintf(&b, "  %s rows/s", num(int64(rate+0.5)))
	if left := expected - deleted; left > 0 {
		fmt.Fprintf(&b, "  %s left", clock(time.Duration(float64(left)/rate*float64(time.Second))))
	} else {
		fmt.Fprintf(&b, "  %s", clock(elapsed))
	}
	return b.String()
}

// clock is a duration to the second: 9s, 4m05s, 1h02m03s.
func clock(d time.Duration) string {
	s := int64(d.Round(time.Second) / time.Second)
	switch {
	case s < 60:
		return fmt.Sprintf("%ds", s)
	case s < 3600:
		return fmt.Sprintf("%dm%02ds", s/60, s%60)
	}
	return fmt.Sprintf("%dh%02dm%02ds", s/3600, s/60%60, s%60)
}

func (p *progress) done() {
	if p.drawn {
		fprintf(p.w, "\n")
	}
}

// isTerminal says f is a terminal (a character device): where a bar redrawn
// with \r reads well (a file or a pipe gets plain lines), where a person can
// answer a confirmation.
func isTerminal(v any) bool {
	f, ok := v.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
