package pgserver

import (
	"bytes"
	"errors"
	"io"
	"testing"

	"github.com/stretchr/testify/require"
)

// fakeTerminal is a terminal that records what is written to it, or that
// cannot be opened (as under CI or a pipe) when missing is set.
type fakeTerminal struct {
	bytes.Buffer
	missing bool
	opened  int
}

func (f *fakeTerminal) Close() error { return nil }

func (f *fakeTerminal) open() (io.WriteCloser, error) {
	f.opened++
	if f.missing {
		return nil, errors.New("open /dev/tty: no such device or address")
	}
	return f, nil
}

func TestNoteSkips(t *testing.T) {
	t.Parallel()
	const note = "pgbouncer is not installed (Debian: apt-get install -y pgbouncer)\n"

	t.Run("NothingWhenNoneSkipped", func(t *testing.T) {
		t.Parallel()
		var stderr bytes.Buffer
		tty := &fakeTerminal{}
		noteSkips(0, false, &stderr, tty.open)
		require.Zero(t, stderr.Len())
		require.Zero(t, tty.Len())
		require.Zero(t, tty.opened)
	})

	t.Run("OnTheTerminalWithoutVerbose", func(t *testing.T) {
		t.Parallel()
		var stderr bytes.Buffer
		tty := &fakeTerminal{}
		noteSkips(3, false, &stderr, tty.open)
		require.Regexp(t, `^\S+: 3 tests skipped: `, tty.String())
		require.Contains(t, tty.String(), note)
		require.Zero(t, stderr.Len(), "once is enough")
	})

	t.Run("OnStderrWithoutATerminal", func(t *testing.T) {
		t.Parallel()
		var stderr bytes.Buffer
		tty := &fakeTerminal{missing: true}
		noteSkips(1, false, &stderr, tty.open)
		require.Regexp(t, `^\S+: 1 test skipped: `, stderr.String())
		require.Contains(t, stderr.String(), note)
	})

	t.Run("OnStderrWithVerbose", func(t *testing.T) {
		t.Parallel()
		var stderr bytes.Buffer
		tty := &fakeTerminal{}
		noteSkips(2, true, &stderr, tty.open)
		require.Contains(t, stderr.String(), "2 tests skipped: "+note)
		require.Zero(t, tty.opened, "-v shows stderr: the terminal is not needed")
	})
}
