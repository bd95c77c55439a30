// Package testlog is the log buffer that the tests of every module of this
// repository assert on: the relay's log lines, as slog's text handler writes
// them, Debug and up.
package testlog

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
)

// Buffer collects log lines, safe for concurrent writes. The zero value is ready.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns every line written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Logger is a logger that writes to b, Debug and up.
func (b *Buffer) Logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(b, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// Lines returns the lines written so far that contain every one of subs.
func (b *Buffer) Lines(subs ...string) []string {
	var out []string
	for line := range strings.SplitSeq(b.String(), "\n") {
		ok := line != ""
		for _, s := range subs {
			ok = ok && strings.Contains(line, s)
		}
		if ok {
			out = append(out, line)
		}
	}
	return out
}
