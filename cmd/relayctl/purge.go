package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"
)

// ageFlag is a duration that also takes days: 30d, 36h, 90m.
type ageFlag struct {
	d   time.Duration
	set bool
}

func (a *ageFlag) String() string {
	if !a.set {
		return ""
	}
	return a.d.String()
}

func (a *ageFlag) Set(v string) error {
	v = strings.TrimSpace(v)
	if days, ok := strings.CutSuffix(v, "d"); ok {
		n, err := strconv.ParseFloat(days, 64)
		if err != nil {
			return fmt.Errorf("%q is not a number of days (as in 30d)", v)
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
	scopeFlags(fs, o)
}

func runPurge(ctx context.Context, e *env) int {
	if !e.o.olderThan.set {
		return e.usageErr("purge: --older-than is required (e.g. --older-than 30d; 0 purges every SENT row)")
	}
	age := e.o.olderThan.d
	scope, err := e.scope(ctx)
	if err != nil {
		return e.fail(err)
	}
	p := newProgress(e.stderr, e.o.json)
	n, err := e.admin.PurgeSentProgress(ctx, age, p.update)
	p.done()
	if err != nil {
		return e.fail(err)
	}
	if e.o.json {
		if err := writeJSON(e.stdout, map[string]any{"purged": n, "types": scope.Types, "all_types": scope.All}); err != nil {
			return e.fail(err)
		}
		return exitOK
	}
	fprintf(e.stdout, "purged %s SENT row(s) of %s delivered more than %s ago\n", num(n), e.cfg.Table, age)
	return exitOK
}

// progress reports a purge: a bar redrawn in place on a terminal, else a
// plain line at most every plainEvery. Quiet (--json) prints nothing.
type progress struct {
	w        io.Writer
	terminal bool
	quiet    bool
	start    time.Time
	last     time.Time
	drawn    bool
}

const plainEvery = 2 * time.Second

func newProgress(w io.Writer, quiet bool) *progress {
	return &progress{w: w, terminal: isTerminal(w), quiet: quiet, start: time.Now()}
}

func (p *progress) update(deleted, expected int64) {
	if p.quiet {
		return
	}
	now := time.Now()
	if p.terminal {
		const width = 30
		frac := 1.0
		if expected > 0 {
			frac = min(float64(deleted)/float64(expected), 1)
		}
		filled := int(frac * width)
		fprintf(p.w, "\r[%s%s] %3.0f%%  %s of ~%s rows  %s ", strings.Repeat("#", filled), strings.Repeat(".", width-filled),
			frac*100, num(deleted), num(max(expected, deleted)), now.Sub(p.start).Round(time.Second))
		p.drawn = true
		return
	}
	if now.Sub(p.last) >= plainEvery {
		fprintf(p.w, "purge: %s of ~%s rows deleted (%s)\n", num(deleted), num(max(expected, deleted)), now.Sub(p.start).Round(time.Second))
		p.last = now
	}
}

func (p *progress) done() {
	if p.drawn {
		fprintf(p.w, "\n")
	}
}

// isTerminal says w is a terminal (a character device), where a bar redrawn
// with \r reads well; a file or a pipe gets plain lines.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
