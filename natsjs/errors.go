package natsjs

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/xadm/relay"
)

// The JetStream API error codes (nats-server's jetstream_errors_generated.go)
// of a publish that retrying cannot help: the stream will refuse the same
// message the same way until someone changes its configuration.
const (
	errCodeMessageTooLarge jetstream.ErrorCode = 10054 // JSStreamMessageExceedsMaximumErr: above the stream's max_msg_size or the server's max_payload
	errCodeStreamNotMatch  jetstream.ErrorCode = 10060 // JSStreamNotMatchErr: the subject is bound to another stream than Config.Stream
	errCodeHeaderTooLarge  jetstream.ErrorCode = 10097 // JSStreamHeaderExceedsMaximumErr: headers above 64 KiB
	errCodeStreamSealed    jetstream.ErrorCode = 10109 // JSStreamSealedErr: a sealed stream takes no message, ever
	errCodeStoreFailed     jetstream.ErrorCode = 10077 // JSStreamStoreFailedF: permanent only for "message too large"
)

// probeTimeout bounds the question "is a stream bound to this subject?" asked
// after a publish found no responder.
const probeTimeout = 5 * time.Second

// classify wraps err, why message i was not stored, with [relay.Permanent]
// when retrying cannot help, and leaves it retryable otherwise.
//
// Permanent:
//   - nats.ErrMaxPayload: the message and its headers exceed the server's
//     max_payload; the client refuses it before sending, and will every time.
//   - API errors 10054 (above the stream's max_msg_size), 10097 (headers above
//     64 KiB) and 10077 for "message too large": the stream refuses the size.
//   - API error 10060: the subject belongs to another stream than
//     [Config.Stream]; 10109: the stream is sealed.
//   - No responders (jetstream.ErrNoStreamResponse) when JetStream itself
//     answers that no stream is bound to the subject; see noStream.
//   - nats.ErrPermissionViolation: the server refused the publish for want of
//     permission; only a change of the account's permissions helps.
//   - nats.ErrBadSubject: the subject cannot be published to.
//
// Everything else is retried: the connection down, reconnecting or closed
// (nats.ErrDisconnected, nats.ErrConnectionClosed, ...), a timeout
// (jetstream.ErrAsyncPublishTimeout, the send's deadline), too many publishes
// awaiting acknowledgement (jetstream.ErrTooManyStalledMsgs), no responders
// while JetStream cannot say whether a stream is bound (a cluster electing a
// leader, JetStream starting), and the stream's other refusals (limits reached
// with the discard-new policy, resources exhausted, a store error), which may
// clear.
func (b *batch) classify(ctx context.Context, i int, err error) error {
	m, subj := b.ms[i], b.subjects[i]
	permanent := func(format string, args ...any) error {
		return relay.Permanent(fmt.Errorf("natsjs: message %d on %s: "+format, append([]any{m.ID, subj}, args...)...))
	}
	switch {
	case errors.Is(err, nats.ErrMaxPayload):
		return permanent("%d bytes of payload and headers exceed the server's max_payload of %d bytes: %w",
			len(m.Payload), b.s.nc.MaxPayload(), err)
	case errors.Is(err, nats.ErrPermissionViolation):
		return permanent("the server refused it: %w", err)
	case errors.Is(err, nats.ErrBadSubject):
		return permanent("%w", err)
	case errors.Is(err, jetstream.ErrNoStreamResponse), errors.Is(err, nats.ErrNoResponders):
		if noStream := b.noStream(ctx, subj); noStream != nil {
			return permanent("no JetStream stream is bound to the subject (%v): %w", noStream, err)
		}
		return fmt.Errorf("natsjs: message %d on %s: no stream answered; JetStream may be electing or starting, "+
			"the relay retries it: %w", m.ID, subj, err)
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		switch {
		case apiErr.ErrorCode == errCodeMessageTooLarge, apiErr.ErrorCode == errCodeHeaderTooLarge,
			apiErr.ErrorCode == errCodeStoreFailed && strings.Contains(apiErr.Description, "message too large"):
			return permanent("%d bytes of payload: the stream refuses the size: %w", len(m.Payload), err)
		case apiErr.ErrorCode == errCodeStreamNotMatch:
			return permanent("the subject is bound to another stream than Config.Stream %q: %w", b.s.stream, err)
		case apiErr.ErrorCode == errCodeStreamSealed:
			return permanent("the stream is sealed: %w", err)
		}
	}
	return fmt.Errorf("natsjs: message %d on %s: %w", m.ID, subj, err)
}

// noStream asks JetStream whether a stream is bound to subj, once per batch
// and subject. It returns why not when JetStream answers that none is, and nil
// when one is or when JetStream does not answer (then the no-responders was
// transient, or cannot be told apart from a transient one).
func (b *batch) noStream(ctx context.Context, subj string) error {
	if verdict, ok := b.probed[subj]; ok {
		return verdict
	}
	pctx, cancel := context.WithTimeout(ctx, probeTimeout)
	_, err := b.s.js.StreamNameBySubject(pctx, subj)
	cancel()
	var verdict error
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		verdict = err
	}
	if b.probed == nil {
		b.probed = make(map[string]error)
	}
	b.probed[subj] = verdict
	return verdict
}
