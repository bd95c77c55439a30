package relay

import "github.com/xadm/relay/internal/headers"

// Headers travel with a message from its producer to its destination: a
// Sender gets them in [Message.Headers], and the HTTPSender, the Kafka sender
// and the NATS sender put them in the request's headers, the record's and the
// message's. They carry metadata beside the payload, typically the W3C trace
// context (traceparent, tracestate) that the otel module stores.
//
// They are stored in the optional headers column (jsonb, one object of
// strings), which CreateTable and SchemaSQL add; a table without it (a JVM
// service's) keeps working, and its messages have no headers. The rules,
// checked by Enqueue and again by the relay on every row it reads (a row that
// breaks them, written by another producer, is marked dead with the reason):
//
//   - a name is an HTTP token (letters, digits and !#$%&'*+-.^_`|~), unique
//     whatever its case, and not one the senders set themselves:
//     Idempotency-Key, Content-Type, Relay-*, Nats-*, the signature's
//     Webhook-Id, Webhook-Timestamp and Webhook-Signature, nor one Go's HTTP
//     client would drop (Host, Content-Length, Transfer-Encoding, Trailer);
//   - a value has no control characters other than tab;
//   - at most [HeadersMax] headers, names and values of at most
//     [HeadersBytesMax] bytes in all.
const (
	HeadersMax      = headers.Max      // headers of one message, at most
	HeadersBytesMax = headers.BytesMax // bytes of one message's header names and values, at most
)

// ValidateHeaders returns an error naming the first header of h that breaks
// the rules of [HeadersMax], nil when every one keeps them: what Enqueue and
// the relay check, for a producer that writes by plain SQL, or a Sender (or a
// wrapper of one) that adds headers.
func ValidateHeaders(h map[string]string) error { return headers.Validate(h) }

// headersMigration is the statement that adds the headers column to table
// (quoted), for an existing table; docs/operations.md gives it too.
func headersMigration(table string) string {
	return "ALTER TABLE " + table + " ADD COLUMN IF NOT EXISTS " + headers.Column + " jsonb"
}
