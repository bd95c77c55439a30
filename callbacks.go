package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"reflect"
	"runtime/debug"
	"strings"
	"time"
	"unicode/utf8"
)

// Every call into code the adopter wrote — a Sender, an Observer, the handler
// behind Config.Logger, a Guard — goes through this file, under a recover: no
// user callback can kill the process or stop the loop. A panic becomes an error
// (for a Sender: the message failed) and is logged with its stack.

// safeHandler wraps the adopter's slog.Handler so that a handler that panics
// (a broken writer, a bad ReplaceAttr) costs the log line, never the relay. The
// first panic is written to stderr, once per handler, so it is not silent.
type safeHandler struct {
	h        slog.Handler
	reported *bool
}

func newSafeHandler(h slog.Handler) slog.Handler { return safeHandler{h: h, reported: new(bool)} }

func (s safeHandler) Enabled(ctx context.Context, l slog.Level) (ok bool) {
	defer s.recover("Enabled")
	return s.h.Enabled(ctx, l)
}

func (s safeHandler) Handle(ctx context.Context, r slog.Record) (err error) {
	defer s.recover("Handle")
	return s.h.Handle(ctx, r)
}

func (s safeHandler) WithAttrs(attrs []slog.Attr) (h slog.Handler) {
	defer func() {
		if p := recover(); p != nil {
			s.report("WithAttrs", p)
			h = s
		}
	}()
	return safeHandler{h: s.h.WithAttrs(attrs), reported: s.reported}
}

func (s safeHandler) WithGroup(name string) (h slog.Handler) {
	defer func() {
		if p := recover(); p != nil {
			s.report("WithGroup", p)
			h = s
		}
	}()
	return safeHandler{h: s.h.WithGroup(name), reported: s.reported}
}

func (s safeHandler) recover(method string) {
	if p := recover(); p != nil {
		s.report(method, p)
	}
}

// report writes the first panic of the handler to stderr: the logger itself is
// what broke, so there is nowhere else to say it. Later panics are dropped.
func (s safeHandler) report(method string, p any) {
	if *s.reported {
		return
	}
	*s.reported = true
	fmt.Fprintf(os.Stderr, "relay: the slog.Handler of Config.Logger panicked in %s (%v); its log lines are dropped, the relay goes on\n%s",
		method, p, debug.Stack())
}

// callObserver runs fn, a call of the adopter's Observer, under a recover.
func (r *Relay) callObserver(method string, fn func()) {
	defer func() {
		if p := recover(); p != nil {
			r.logger.LogAttrs(context.Background(), slog.LevelError, "relay: Observer."+method+" panicked; the relay goes on",
				slog.Any("panic", p), slog.String("stack", string(debug.Stack())))
		}
	}()
	fn()
}

// senderType calls s.Type under a recover, for New.
func senderType(s Sender) (typ string, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("its Type method panicked: %v", p)
		}
	}()
	return s.Type(), nil
}

// sendGrace is how long a sender whose context ended may take to return.
const sendGrace = 100 * time.Millisecond

// callSend runs one Send under a recover, on the calling goroutine (a
// worker's: worker.go, which also bounds it by SendTimeout). What it returns
// is made safe to use with sendFailure.
func (r *Relay) callSend(ctx context.Context, s Sender, m Message) (err error) {
	defer func() {
		if p := recover(); p != nil {
			r.logger.LogAttrs(ctx, slog.LevelError, "relay: sender panicked",
				slog.Int64("id", m.ID), slog.String("type", m.Type), slog.Any("panic", p), slog.String("stack", string(debug.Stack())))
			err = fmt.Errorf("sender panicked: %v", p)
		}
	}()
	return sendFailure(s.Send(ctx, m))
}

// sendBatch calls s.SendBatch in a goroutine of its own, under SendTimeout
// and a recover. A panic, an abandoned call or a result of the wrong length
// fails every message of the call.
func (r *Relay) sendBatch(ctx context.Context, s BatchSender, ms []Message) []error {
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
	go func() {
		defer func() {
			if p := recover(); p != nil {
				r.logger.LogAttrs(ctx, slog.LevelError, "relay: batch sender panicked",
					slog.String("type", s.Type()), slog.Int("messages", len(ms)), slog.Any("panic", p), slog.String("stack", string(debug.Stack())))
				done <- all(fmt.Errorf("sender panicked: %v", p))
			}
		}()
		errs := s.SendBatch(sctx, ms)
		if len(errs) != len(ms) {
			errs = all(fmt.Errorf("SendBatch of %T returned %d results for %d messages", s, len(errs), len(ms)))
		}
		for i := range errs {
			errs[i] = sendFailure(errs[i])
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
		r.logger.LogAttrs(ctx, slog.LevelError, "relay: batch sender did not return after its context ended; abandoned",
			slog.String("type", ms[0].Type), slog.Int("messages", len(ms)))
		return all(context.Cause(sctx))
	}
}

// sendFailure makes a Sender's error safe for the relay to use: a typed nil (a
// nil *MyError returned as error) is a failure, not a success, and an error
// whose Error or Unwrap method panics becomes a plain error describing it. The
// result keeps the original in its chain when that is safe, so an Observer
// still sees it and [IsPermanent] still finds a [Permanent] mark.
func sendFailure(err error) error {
	if err == nil {
		return nil
	}
	if v := reflect.ValueOf(err); isNilPointer(v) {
		return fmt.Errorf("the sender returned a nil %T as its error: a typed nil is not a nil error", err)
	}
	text, permanent, ok := inspect(err)
	if !ok {
		return fmt.Errorf("the sender returned a %T whose Error or Unwrap method panicked", err)
	}
	return &senderError{err: err, text: text, permanent: permanent}
}

func isNilPointer(v reflect.Value) bool {
	switch v.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Slice, reflect.Func, reflect.Chan, reflect.Interface:
		return v.IsNil()
	}
	return false
}

// inspect reads err's text and Permanent mark under a recover.
func inspect(err error) (text string, permanent, ok bool) {
	defer func() {
		if recover() != nil {
			ok = false
		}
	}()
	return err.Error(), IsPermanent(err), true
}

// senderError is a Sender's error whose text and Permanent mark were read once,
// safely. It unwraps to the original for the Observer.
type senderError struct {
	err       error
	text      string
	permanent bool
}

func (e *senderError) Error() string { return e.text }
func (e *senderError) Unwrap() error { return e.err }

// permanentFailure reports whether the relay must mark a failed message dead at
// once: a Permanent error, read safely.
func permanentFailure(err error) bool {
	var se *senderError
	if errors.As(err, &se) {
		return se.permanent
	}
	_, permanent, _ := inspect(err)
	return permanent
}

// lastErrorMax is how many bytes of a sender's error last_error keeps at most;
// a column declared narrower (varchar(255), as the JVM's migration declares
// it) keeps what fits its width in characters.
const lastErrorMax = 2000

// errorText is err's text as a last_error column of width characters (0: no
// declared width) keeps it: valid UTF-8, no NUL bytes (PostgreSQL text refuses
// them), at most width characters and lastErrorMax bytes.
func errorText(err error, width int) string {
	s, _, ok := inspect(err)
	if !ok {
		s = fmt.Sprintf("%T (its Error method panicked)", err)
	}
	return clip(s, width)
}

// clip makes s fit a text column of width characters (0: any number) and
// lastErrorMax bytes, cut on a character boundary.
func clip(s string, width int) string {
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
	if len(s) > lastErrorMax {
		s = s[:lastErrorMax]
		for !utf8.ValidString(s) {
			s = s[:len(s)-1]
		}
	}
	return s
}
