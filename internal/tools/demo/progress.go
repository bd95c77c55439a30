package demo

import (
	"fmt"
	"io"
	"os"
	"sync"
	"time"
)

// Progress writes a demo's output: events and log lines as lines of their
// own, and a status line that is redrawn in place (\r) when the output is a
// terminal, or printed once a second when it is a file, a pipe or a buffer.
type Progress struct {
	mu        sync.Mutex
	out       io.Writer
	live      bool   // out is a terminal
	status    string // the status line on screen, when live
	lastPlain time.Time
}

// NewProgress writes to w, live when w is a terminal.
func NewProgress(w io.Writer) *Progress {
	p := &Progress{out: w}
	if f, ok := w.(*os.File); ok {
		fi, err := f.Stat()
		p.live = err == nil && fi.Mode()&os.ModeCharDevice != 0
	}
	return p
}

// Write prints b (whole lines: an event, a log record) above the status line.
func (p *Progress) Write(b []byte) (int, error) {
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

// Printf prints one line above the status line.
func (p *Progress) Printf(format string, args ...any) {
	fmt.Fprintf(p, format+"\n", args...)
}

// Update shows the status line: redrawn at once on a terminal, else at most once a second.
func (p *Progress) Update(status string) {
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

// Finish leaves the last status on screen and ends its line.
func (p *Progress) Finish(status string) {
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
