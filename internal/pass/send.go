package pass

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/xadm/relay/internal/store"
)

// This file bounds the calls into the adopter's Senders in time: a Send runs
// on its worker's goroutine (worker.go) and a SendBatch on one of its own,
// each under SendTimeout, and one that ignores its context is given up
// sendGrace after it ended. The relay's side of each call (Deps.Senders)
// recovers a panic and makes what the Sender returns safe to read.

// sendGrace is how long a sender whose context ended may take to return.
const sendGrace = 100 * time.Millisecond

// sendContext returns the context of a Send started at start: a child of
// parent (the pass's) whose deadline is SendTimeout past start. It has no
// timer of its own, unlike context.WithTimeoutCause's: the worker's timer
// (worker.watch) cancels it, with r.sendTimedOut as its cause, once the
// deadline passes. A timer made and stopped for every message cost a
// grouped drain 4–9% of its rate (docs/performance.md).
//
// To the Sender it is what WithTimeoutCause's would be: Deadline says when
// it ends, Err is context.DeadlineExceeded once it timed out (Canceled when
// the pass's context ended first), and context.Cause is r.sendTimedOut. A
// context the Sender derives from it ends with it and has the same cause,
// but its Err is Canceled.
func (r *Runner) sendContext(parent context.Context, start time.Time) (context.Context, context.CancelCauseFunc) {
	c, cancel := context.WithCancelCause(parent)
	deadline := start.Add(r.cfg.SendTimeout)
	if d, ok := parent.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	return &sendContext{Context: c, deadline: deadline, timedOut: r.sendTimedOut}, cancel
}

// sendContext is a Send's context (Runner.sendContext).
type sendContext struct {
	context.Context
	deadline time.Time
	timedOut error // the cause it is cancelled with at its deadline
}

func (c *sendContext) Deadline() (time.Time, bool) { return c.deadline, true }

func (c *sendContext) Err() error {
	err := c.Context.Err()
	if err != nil && context.Cause(c.Context) == c.timedOut {
		return context.DeadlineExceeded
	}
	return err
}

// sendBatch calls s.SendBatch in a goroutine of its own, under SendTimeout.
// An abandoned call or a result of the wrong length fails every message of
// the call.
func (r *Runner) sendBatch(ctx context.Context, s BatchSender, ms []store.Row) []error {
	sctx, cancel := context.WithTimeoutCause(ctx, r.cfg.SendTimeout, r.sendTimedOut)
	defer cancel()
	all := func(err error) []error {
		errs := make([]error, len(ms))
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	done := make(chan []error, 1)
	l := r.lanes.all[ms[0].Lane]
	go func() {
		defer func() {
			if p := recover(); p != nil { // the relay's side recovers the Sender's: this is a last resort
				done <- all(fmt.Errorf("sender panicked: %v", p))
			}
		}()
		errs := s.SendBatch(sctx, ms)
		if len(errs) != len(ms) {
			errs = all(fmt.Errorf("SendBatch returned %d results for %d messages", len(errs), len(ms)))
		}
		done <- errs
	}()
	select {
	case errs := <-done:
		return errs
	case <-sctx.Done():
		select {
		case errs := <-done:
			return errs
		case <-time.After(sendGrace):
		}
		r.deps.Logger.LogAttrs(ctx, slog.LevelError, "relay: batch sender did not return after its context ended; abandoned",
			slog.String("type", ms[0].Type), slog.Int("messages", len(ms)))
		for _, m := range ms {
			r.lanes.stuck.add(l, m.Key) // its key waits until the call returns
		}
		go func() {
			<-done
			for _, m := range ms {
				r.lanes.stuck.done(l, m.Key)
			}
		}()
		return all(context.Cause(sctx))
	}
}

// permanentFailure reports whether the relay must mark a failed message dead
// at once: a Permanent error, as the relay's side of the Sender read it.
func permanentFailure(err error) bool {
	var se *SendError
	return errors.As(err, &se) && se.Permanent
}

// LastErrorMax is how many bytes of a sender's error last_error keeps at
// most; a column declared narrower (varchar(255), as the JVM's migration
// declares it) keeps what fits its width in characters.
const LastErrorMax = 2000

// ErrorText is err's text as a last_error column of width characters (0: no
// declared width) keeps it: valid UTF-8, no NUL bytes (PostgreSQL text refuses
// them), at most width characters and LastErrorMax bytes. An error whose
// Error method panics is described instead.
func ErrorText(err error, width int) string {
	s, ok := text(err)
	if !ok {
		s = fmt.Sprintf("%T (its Error method panicked)", err)
	}
	return Clip(s, width)
}

// text reads err's text under a recover.
func text(err error) (s string, ok bool) {
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	return err.Error(), true
}

// Clip makes s fit a text column of width characters (0: any number) and
// LastErrorMax bytes, cut on a character boundary.
func Clip(s string, width int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	s = strings.ReplaceAll(s, "\x00", "")
	if width > 0 {
		n := 0
		for i := range s {
			if n == width {
				s = s[:i]
				break
			}
			n++
		}
	}
	if len(s) > LastErrorMax {
		s = s[:LastErrorMax]
		for !utf8.ValidString(s) {
			s = s[:len(s)-1]
		}
	}
	return s
}
