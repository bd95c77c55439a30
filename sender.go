package relay

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/xadm/relay/internal/pass"
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
// deduplicate by the message ([Message.IdempotencyKey]), and, after a failover,
// ignore a message of a [Message.Key] older than one it already applied.
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
	Key       string    // the natural key: the receiver's unit of state and order
	Payload   []byte    // the JSON payload, as stored
	Attempts  int       // failed attempts before this one
	CreatedAt time.Time // when the row was written

	// Headers are the message's headers (see [HeadersMax]), as its producer
	// wrote them; nil when it has none, or the table has no headers column.
	// A Sender must not modify the map: copy it to add to it.
	Headers map[string]string

	// source names the table the row came from, schema-qualified
	// ("public.mensagem_m2m"); set by the relay, empty in a Message built by hand.
	source string
}

// IdempotencyKey names this one message, for a receiver or a broker that
// deduplicates deliveries: the same on every retry of the message, different
// for every other message, including messages of the same natural key and rows
// of other tables in the same database. It is the schema-qualified table and
// the row's id, "public.mensagem_m2m/42"; a Message built by hand, which has no
// table, gives its id alone ("42").
//
// It is not the natural key: a receiver that replays its stored answer for a
// repeated idempotency key would drop every later message of a key that used
// its key as idempotency key.
func (m Message) IdempotencyKey() string {
	id := strconv.FormatInt(m.ID, 10)
	if m.source == "" {
		return id
	}
	return m.source + "/" + id
}

// BatchSender is a [Sender] that can also deliver several messages in one call,
// as a broker's producer does: one round trip for many records instead of one
// each. The relay uses SendBatch when a Sender implements it and Send
// otherwise; the semantics of each message are those of Send.
//
// The relay hands SendBatch messages of this sender's type, in id order, with
// at most one message per natural key: a key's next message is handed over only
// after its previous one succeeded, so a failure never lets a later message of
// its key overtake it. SendBatch returns one error per message, in the same
// order (nil: the destination accepted it; [Permanent]: retrying cannot help).
// A result of the wrong length, or a panic, fails every message of the call.
type BatchSender interface {
	Sender
	// SendBatch delivers ms and returns their outcomes, errs[i] for ms[i].
	SendBatch(ctx context.Context, ms []Message) (errs []error)
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

// ParsePermanent reads the mark a relay puts at the start of the last_error
// of a row that died of a permanent failure ("permanent after 1 attempt(s): …")
// and returns the number of attempts really made; ok is false for any other
// text, such as a row that reached MaxAttempts.
func ParsePermanent(lastError string) (attempts int, ok bool) { return pass.ParsePermanent(lastError) }
