package relay

import (
	"context"
	"errors"
	"time"
)

// Sender delivers the messages of one type to their destination, typically with
// an HTTP PUT to another service. The relay registers one Sender per type and
// drains only the types it has senders for (the type filter of decision 0021),
// so several apps can share one table without touching each other's rows.
//
// Send must honour ctx: the relay cancels it after [Config.SendTimeout], when
// the election is lost, and on a hard stop. A nil error means the destination
// accepted the message and the row becomes SENT. Any other error marks only
// this row ERROR (attempts + 1, the text in last_error) and the batch goes on;
// an error wrapped with [Permanent] marks it dead at once. A panic is recovered
// and treated as an error.
//
// Delivery is at-least-once: a crash between the destination's answer and the
// commit of the outcome delivers the message again, so the destination must
// deduplicate by [Message.Key].
type Sender interface {
	// Type returns the message type this sender delivers.
	Type() string
	// Send delivers m, returning nil only when the destination accepted it.
	Send(ctx context.Context, m Message) error
}

// Message is one outbound row as the relay read it.
type Message struct {
	ID        int64     // the row's id; ids grow with insertion order
	Type      string    // the type that chose the Sender
	Key       string    // the natural key: receivers deduplicate by it
	Payload   []byte    // the JSON payload, as stored
	Attempts  int       // failed attempts before this one
	CreatedAt time.Time // when the row was written
}

// SenderFunc adapts a function to a [Sender] of type typ.
func SenderFunc(typ string, send func(ctx context.Context, m Message) error) Sender {
	return senderFunc{typ: typ, send: send}
}

type senderFunc struct {
	typ  string
	send func(ctx context.Context, m Message) error
}

func (s senderFunc) Type() string                              { return s.typ }
func (s senderFunc) Send(ctx context.Context, m Message) error { return s.send(ctx, m) }

// Permanent wraps err to say that retrying cannot help (a 4xx answer, say): the
// relay marks the row dead at once (ERROR with attempts at the ceiling) instead
// of retrying it until [Config.MaxAttempts]. An operator can re-queue it. It
// returns nil when err is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err: err}
}

// IsPermanent reports whether err, or an error it wraps, was marked by [Permanent].
func IsPermanent(err error) bool {
	var p *permanentError
	return errors.As(err, &p)
}

type permanentError struct{ err error }

func (e *permanentError) Error() string { return "permanent: " + e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }
