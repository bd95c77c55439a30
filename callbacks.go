package relay

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"reflect"
	"runtime/debug"

	"github.com/xadm/relay/internal/pass"
	"github.com/xadm/relay/internal/store"
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

// userSender is the relay's side of an adopter's Sender, as the pass calls it
// (internal/pass bounds each call in time): each call under a recover, and
// what it returns made safe to use (sendFailure).
type userSender struct {
	r *Relay
	s Sender
}

// userBatchSender is userSender for a [BatchSender].
type userBatchSender struct {
	userSender
	b BatchSender
}

// sender is s as the pass calls it.
func (r *Relay) sender(s Sender) pass.Sender {
	if b, ok := s.(BatchSender); ok {
		return userBatchSender{userSender{r, s}, b}
	}
	return userSender{r, s}
}

// messageOf is the message of a row, as its Sender gets it.
func messageOf(m *store.Row) Message {
	return Message{ID: m.ID, Type: m.Type, Key: m.Key, Payload: m.Payload, Attempts: m.Attempts, CreatedAt: m.CreatedAt,
		Headers: m.Headers, source: m.Source}
}

// Send runs one Send under a recover, on the calling goroutine (a worker's).
func (u userSender) Send(ctx context.Context, row store.Row) (err error) {
	m := messageOf(&row)
	defer func() {
		if p := recover(); p != nil {
			u.r.logger.LogAttrs(ctx, slog.LevelError, "relay: sender panicked",
				slog.Int64("id", m.ID), slog.String("type", m.Type), slog.Any("panic", p), slog.String("stack", string(debug.Stack())))
			err = fmt.Errorf("sender panicked: %v", p)
		}
	}()
	return sendFailure(u.s.Send(ctx, m))
}

// SendBatch runs one SendBatch under a recover. A panic, or a result of the
// wrong length, fails every message of the call.
func (u userBatchSender) SendBatch(ctx context.Context, rows []store.Row) (errs []error) {
	ms := make([]Message, len(rows))
	for i := range rows {
		ms[i] = messageOf(&rows[i])
	}
	all := func(err error) []error {
		errs := make([]error, len(ms))
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	defer func() {
		if p := recover(); p != nil {
			u.r.logger.LogAttrs(ctx, slog.LevelError, "relay: batch sender panicked",
				slog.String("type", u.s.Type()), slog.Int("messages", len(ms)), slog.Any("panic", p), slog.String("stack", string(debug.Stack())))
			errs = all(fmt.Errorf("sender panicked: %v", p))
		}
	}()
	errs = u.b.SendBatch(ctx, ms)
	if len(errs) != len(ms) {
		return all(fmt.Errorf("SendBatch of %T returned %d results for %d messages", u.b, len(errs), len(ms)))
	}
	for i := range errs {
		errs[i] = sendFailure(errs[i])
	}
	return errs
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
	return &pass.SendError{Err: err, Text: text, Permanent: permanent}
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
