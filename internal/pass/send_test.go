package pass

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/xadm/relay/internal/store"
)

// ctxSender waits for its context to end and keeps what the context said.
type ctxSender struct {
	started chan struct{}
	seen    chan ctxSeen
}

type ctxSeen struct {
	deadline        time.Time
	hasDeadline     bool
	err, cause      error
	childErr        error
	childCause      error
	startedAt, done time.Time
}

func (ctxSender) Type() string { return "t" }

func (s ctxSender) Send(ctx context.Context, _ store.Row) error {
	child, cancel := context.WithCancel(ctx) // as an HTTP or Kafka client derives its own
	defer cancel()
	var v ctxSeen
	v.startedAt = time.Now()
	v.deadline, v.hasDeadline = ctx.Deadline()
	close(s.started)
	<-ctx.Done()
	<-child.Done()
	v.done = time.Now()
	v.err, v.cause = ctx.Err(), context.Cause(ctx)
	v.childErr, v.childCause = child.Err(), context.Cause(child)
	s.seen <- v
	return ctx.Err()
}

// A Send's context has no timer of its own (sendContext): the worker's ends
// it at SendTimeout. To the Sender it must still be what
// context.WithTimeoutCause's was: a deadline SendTimeout past its start,
// DeadlineExceeded once it passed, the relay's cause, and children that end
// with it; and when the pass's context ends first, its cause instead.
func TestSendContext(t *testing.T) {
	// run runs one pass over one row under parent, with SendTimeout timeout,
	// calling onStart once the Send started.
	run := func(parent context.Context, timeout time.Duration, onStart func()) (v ctxSeen, before time.Time) {
		s := ctxSender{started: make(chan struct{}), seen: make(chan ctxSeen, 1)}
		cfg := memRelay(t, 1, 1, s).cfg
		cfg.SendTimeout = timeout
		r := New(cfg, []string{"t"}, Deps{Senders: map[string]Sender{"t": s}, Logger: slog.New(slog.DiscardHandler)})
		go func() { <-s.started; onStart() }()
		before = time.Now()
		runMemCtx(parent, r, newMemTable(1, "k"), Opts{})
		return <-s.seen, before
	}

	t.Run("TimedOut", func(t *testing.T) {
		const timeout = 200 * time.Millisecond
		v, before := run(context.Background(), timeout, func() {})
		require.True(t, v.hasDeadline)
		require.False(t, v.deadline.Before(before.Add(timeout)), "the deadline is SendTimeout past the Send's start")
		require.False(t, v.deadline.After(v.startedAt.Add(timeout)), "the deadline is SendTimeout past the Send's start")
		require.False(t, v.done.Before(v.deadline), "ended at its deadline, not before")
		require.ErrorIs(t, v.err, context.DeadlineExceeded)
		require.EqualError(t, v.cause, fmt.Sprintf("send timed out after %s", timeout))
		require.Equal(t, v.cause, v.childCause, "a derived context has the same cause")
		require.Error(t, v.childErr)
	})

	t.Run("PassEndedFirst", func(t *testing.T) {
		stopped := errors.New("the pass stopped")
		parent, cancel := context.WithCancelCause(context.Background())
		defer cancel(nil)
		v, _ := run(parent, time.Hour, func() { cancel(stopped) })
		require.ErrorIs(t, v.err, context.Canceled)
		require.ErrorIs(t, v.cause, stopped)
		require.ErrorIs(t, v.childCause, stopped)
	})

	t.Run("ParentDeadlineFirst", func(t *testing.T) {
		parent, cancel := context.WithTimeout(context.Background(), time.Hour)
		defer cancel()
		c, stop := (&Runner{cfg: Config{SendTimeout: 2 * time.Hour}, sendTimedOut: errors.New("x")}).sendContext(parent, time.Now())
		defer stop(nil)
		want, _ := parent.Deadline()
		got, ok := c.Deadline()
		require.True(t, ok)
		require.Equal(t, want, got, "the earlier of the pass's deadline and SendTimeout's")
	})
}
