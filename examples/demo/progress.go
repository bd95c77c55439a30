package main

import (
	"fmt"
	"io"
	"os"
	"sync"
	"time"
)

// progress writes the demo's output: events and log lines as lines of their
// own, and a status line that is redrawn in place (\r) when the output is a
// terminal, or printed once a second when it is a file or a pipe.
type progress struct {
	mu        sync.Mutex
	out       io.Writer
	live      bool   // out is a terminal
	status    string // the status line on screen, when live
	lastPlain time.Time
}

func newProgress(f *os.File) *progress {
	fi, err := f.Stat()
	return &progress{out: f, live: err == nil && fi.Mode()&os.ModeCharDevice != 0}
}

// Write prints p (whole lines: an event, a log record) above the status line.
func (p *progress) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.live && p.status != "" {
		fmt.Fprint(p.out, "\r\033[K")
	}
	n, err := p.out.Write(b)
	if p.live && p.status != "" {
		fmt.Fprint(p.out, p.status)
	}
	return n, err
}

// printf prints one line above the status line.
func (p *progress) printf(format string, args ...any) {
	fmt.Fprintf(p, format+"\n", args...)
}

// update shows the status line: redrawn at once on a terminal, else at most once a second.
func (p *progress) update(status string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.live {
		p.status = status
		fmt.Fprint(p.out, "\r\033[K"+status)
		return
	}
	if time.Since(p.lastPlain) >= time.Second {
		p.lastPlain = time.Now()
		fmt.Fprintln(p.out, status)
	}
}

// finish leaves the last status on screen and ends its line.
func (p *progress) finish(status string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.live {
		fmt.Fprint(p.out, "\r\033[K"+status+"\n")
	} else {
		fmt.Fprintln(p.out, status)
	}
	p.status = ""
	p.lastPlain = time.Time{}
}
