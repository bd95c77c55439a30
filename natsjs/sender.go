package natsjs

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/xadm/relay"
)

// A message's own headers ([relay.Message.Headers]: a W3C traceparent, say)
// travel too, named as the producer wrote them: NATS header names are
// case-sensitive, so a consumer reads "traceparent" as it is (nats.Header.Get),
// not through propagation.HeaderCarrier, which asks for "Traceparent".
//
// The headers every message carries besides Nats-Msg-Id (jetstream.MsgIDHeader,
// the message's [relay.Message.IdempotencyKey]).
const (
	// HeaderMessageID is the row's id in decimal. Ids of one natural key only
	// grow, so a consumer drops a message whose id is lower than the last one it
	// applied for its key: after a failover a key's older message can arrive
	// after a newer one.
	HeaderMessageID = "Relay-Message-Id"
	// HeaderMessageType is the message type, as the relay's senders register it.
	HeaderMessageType = "Relay-Message-Type"
	// HeaderMessageKey is the natural key, as it is, when a header can carry it
	// as it is; see [HeaderKeyEncoding].
	HeaderMessageKey = "Relay-Message-Key"
	// HeaderKeyEncoding is set to "token" when the natural key holds bytes a
	// header cannot carry as they are (a control character, or a leading or
	// trailing blank, which header parsers trim): [HeaderMessageKey] then holds
	// [Token] of the key, and [ParseToken] gives the key back. It is absent
	// otherwise.
	HeaderKeyEncoding = "Relay-Message-Key-Encoding"
	// HeaderAttempt is which attempt at delivering the message this is: 1 the
	// first time, 2 after one failure, and so on.
	HeaderAttempt = "Relay-Attempt"
)

// Config configures a [Sender]. Only Type is required.
type Config struct {
	// Type is the message type the sender delivers ([relay.Sender.Type]).
	// Required.
	Type string

	// SubjectPrefix is the first token or tokens of the default subject,
	// "<SubjectPrefix>.<Token(type)>.<Token(key)>". A stream listening on
	// "<SubjectPrefix>.>" takes every type. Ignored when Subject is set.
	// Defaults to "relay".
	SubjectPrefix string

	// Subject, if set, chooses each message's subject instead of the default.
	// A subject it returns that cannot be published to (empty, a wildcard,
	// whitespace, an empty token) fails that message permanently. Use [Token]
	// to put arbitrary strings in it. nil means the default subject.
	Subject func(m relay.Message) string

	// Stream, if set, is the stream every message must be stored in: each
	// publish carries Nats-Expected-Stream, and a subject bound to another
	// stream fails permanently instead of being stored there. Empty means any
	// stream bound to the subject.
	Stream string

	// Logger receives the connection events (disconnected, reconnected) of a
	// connection [Connect] opened. Defaults to [slog.Default].
	Logger *slog.Logger
}

// Sender publishes relay messages to NATS JetStream, one message per row, and
// waits for JetStream's acknowledgement: a nil error means the message is
// stored in a stream. It is a [relay.BatchSender]: [Sender.SendBatch]
// publishes many messages before it waits for their acknowledgements.
//
// Each message carries Nats-Msg-Id = [relay.Message.IdempotencyKey], so a
// message delivered again (a crash between the acknowledgement and the
// recording of its outcome) is discarded by the stream's duplicate window
// rather than stored twice. Build it with [New] or [Connect]. It is safe for
// concurrent use.
type Sender struct {
	typ     string
	prefix  string // SubjectPrefix + "."
	subject func(m relay.Message) string
	stream  string

	js      jetstream.JetStream
	nc      *nats.Conn
	own     bool // Connect opened nc: Close closes it
	denials *denials
}

var _ relay.BatchSender = (*Sender)(nil)

// New returns a Sender that publishes through js, a JetStream context the
// caller built (jetstream.New(nc)) and keeps owning: [Sender.Close] leaves it
// open. Build one Sender per message type on the same js.
//
// New chains an error handler onto js's connection (the one set before still
// runs after it) to learn at once of a publish the server refused for want of
// permission, which the server answers with an asynchronous error instead of
// an acknowledgement. Give jetstream.New the option
// jetstream.WithPublishAsyncTimeout (a minute, say) so that a publish never
// acknowledged is forgotten by js rather than kept.
func New(js jetstream.JetStream, cfg Config) (*Sender, error) {
	if js == nil {
		return nil, errors.New("natsjs: New needs a jetstream.JetStream, got nil (build one with jetstream.New(nc), or use natsjs.Connect)")
	}
	s, err := newSender(cfg)
	if err != nil {
		return nil, err
	}
	if err := s.bind(js); err != nil {
		return nil, err
	}
	return s, nil
}

// asyncAckTimeout is how long a JetStream context built by Connect keeps an
// unacknowledged publish before it gives up on it.
const asyncAckTimeout = time.Minute

// Connect connects to the NATS servers in url (comma-separated, as
// nats.Connect takes them) and returns a Sender that owns the connection:
// [Sender.Close] closes it.
//
// The connection never gives up reconnecting (nats.MaxReconnects(-1)), and
// Connect returns even while no server answers (nats.RetryOnFailedConnect):
// until one does, every message fails with a retryable error and the relay
// retries it, so delivery resumes by itself when the server is back.
// Disconnections and reconnections are logged to [Config.Logger]. opts are
// applied after these and may override them (credentials, TLS, a name).
func Connect(url string, cfg Config, opts ...nats.Option) (*Sender, error) {
	s, err := newSender(cfg)
	if err != nil {
		return nil, err
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.Default()
	}
	logger = logger.With(slog.String("component", "natsjs"), slog.String("type", cfg.Type))
	all := []nats.Option{
		nats.Name("relay natsjs " + cfg.Type),
		nats.MaxReconnects(-1),
		nats.RetryOnFailedConnect(true),
		nats.DisconnectErrHandler(func(nc *nats.Conn, err error) {
			attrs := []slog.Attr{slog.String("server", nc.ConnectedUrlRedacted())}
			if err != nil {
				attrs = append(attrs, slog.String("error", err.Error()))
			}
			logger.LogAttrs(context.Background(), slog.LevelError,
				"natsjs: disconnected from NATS; messages fail and are retried until it reconnects", attrs...)
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			logger.LogAttrs(context.Background(), slog.LevelInfo, "natsjs: reconnected to NATS; delivery resumes",
				slog.String("server", nc.ConnectedUrlRedacted()))
		}),
	}
	nc, err := nats.Connect(url, append(all, opts...)...)
	if err != nil {
		return nil, fmt.Errorf("natsjs: connect to %s: %w", redactURLs(url), err)
	}
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(asyncAckTimeout))
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("natsjs: JetStream context: %w", err)
	}
	if err := s.bind(js); err != nil {
		nc.Close()
		return nil, err
	}
	s.own = true
	return s, nil
}

// newSender validates cfg and returns an unbound Sender.
func newSender(cfg Config) (*Sender, error) {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("natsjs: Config."+field+" "+format, args...))
	}
	switch {
	case strings.TrimSpace(cfg.Type) == "":
		bad("Type", "must not be empty: it is the relay message type this sender delivers")
	case !headerSafe(cfg.Type):
		bad("Type", "%q must not hold control characters or leading or trailing blanks: it travels in the %s header", cfg.Type, HeaderMessageType)
	}
	prefix := cfg.SubjectPrefix
	if prefix == "" {
		prefix = SubjectPrefixDefault
	}
	if cfg.Subject == nil {
		if err := checkSubject(prefix); err != nil {
			bad("SubjectPrefix", "%q is not a subject prefix: %v", cfg.SubjectPrefix, err)
		} else if strings.ContainsAny(prefix, "*>") {
			bad("SubjectPrefix", "%q must not hold the wildcards * or >", cfg.SubjectPrefix)
		}
	}
	if cfg.Stream != "" {
		if strings.ContainsAny(cfg.Stream, ".*>/\\ \t\r\n\f\v") || !headerSafe(cfg.Stream) {
			bad("Stream", "%q is not a stream name: it must not hold '.', '*', '>', '/', '\\\\', whitespace or control characters", cfg.Stream)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return &Sender{typ: cfg.Type, prefix: prefix + ".", subject: cfg.Subject, stream: cfg.Stream}, nil
}

// bind makes s publish through js.
func (s *Sender) bind(js jetstream.JetStream) error {
	nc := js.Conn()
	if nc == nil {
		return errors.New("natsjs: the jetstream.JetStream has no connection")
	}
	s.js, s.nc = js, nc
	s.denials = watchDenials(nc)
	return nil
}

// Type returns the message type s delivers, [Config.Type].
func (s *Sender) Type() string { return s.typ }

// Close closes the connection [Connect] opened. For a Sender built by [New]
// it does nothing: the caller owns the connection.
func (s *Sender) Close() {
	if s.own {
		s.nc.Close()
	}
}

// Send publishes m and waits for JetStream's acknowledgement. An error that
// retrying cannot help (the message is larger than the server or stream
// allows, no stream is bound to its subject, a permission is missing) is
// wrapped with [relay.Permanent]; the others (no connection, a timeout, a
// server busy or electing) are left for the relay to retry.
func (s *Sender) Send(ctx context.Context, m relay.Message) error {
	return s.SendBatch(ctx, []relay.Message{m})[0]
}

// SendBatch publishes every message of ms without waiting, then waits for
// each acknowledgement, so the batch costs about one round trip instead of
// one per message. It returns one error per message, errs[i] for ms[i], with
// the meaning of [Sender.Send]'s; a failure marks only its own message. The
// relay hands it at most one message per natural key, so the order in which
// the server stores them does not matter.
func (s *Sender) SendBatch(ctx context.Context, ms []relay.Message) []error {
	errs := make([]error, len(ms))
	if len(ms) == 0 {
		return errs
	}
	if st := s.nc.Status(); st != nats.CONNECTED {
		// Publishing now would only fill the client's reconnect buffer and
		// wait for the deadline: fail at once, retryably.
		for i, m := range ms {
			errs[i] = fmt.Errorf("natsjs: message %d not published: %s; the relay retries it", m.ID, notConnected(st))
		}
		return errs
	}
	// Watch for denials before publishing: the server refuses at once.
	w := s.denials.watch()
	defer w.stop()
	b := batch{s: s, ms: ms, errs: errs, subjects: make([]string, len(ms)), futures: make([]jetstream.PubAckFuture, len(ms))}
	b.publish(ctx)
	for i, f := range b.futures {
		if f != nil {
			errs[i] = b.waitOne(ctx, i, f, w)
		}
	}
	return errs
}

// notConnected says why a connection in status st cannot publish.
func notConnected(st nats.Status) string {
	switch st {
	case nats.CLOSED:
		return "the NATS connection is closed (Close was called, or it ran out of reconnect attempts)"
	case nats.RECONNECTING, nats.CONNECTING, nats.DISCONNECTED:
		return "the NATS connection is " + strings.ToLower(st.String()) + ": the server is down or unreachable"
	default:
		return "the NATS connection is " + strings.ToLower(st.String())
	}
}

// batch is one SendBatch call in progress.
type batch struct {
	s        *Sender
	ms       []relay.Message
	errs     []error
	subjects []string
	futures  []jetstream.PubAckFuture // nil where the publish failed at once
	probed   map[string]error         // the no-stream probe's verdict, by subject
}

// publish hands every message to the connection without waiting.
func (b *batch) publish(ctx context.Context) {
	stall := stallWait(ctx)
	for i, m := range b.ms {
		if err := ctx.Err(); err != nil {
			b.errs[i] = fmt.Errorf("natsjs: message %d not published: %w", m.ID, context.Cause(ctx))
			continue
		}
		subj, err := b.s.subjectOf(m)
		if err != nil {
			b.errs[i] = relay.Permanent(err)
			continue
		}
		b.subjects[i] = subj
		f, err := b.s.js.PublishMsgAsync(b.s.msg(m, subj), jetstream.WithStallWait(stall))
		if err != nil {
			b.errs[i] = b.classify(ctx, i, err)
			continue
		}
		b.futures[i] = f
	}
}

// stallWait is how long one publish may wait for room among the publishes
// awaiting their acknowledgement: until ctx's deadline.
func stallWait(ctx context.Context) time.Duration {
	if d, ok := ctx.Deadline(); ok {
		return max(time.Until(d), time.Millisecond)
	}
	return 30 * time.Second
}

// waitOne waits for the acknowledgement of message i, or the reason there is none.
func (b *batch) waitOne(ctx context.Context, i int, f jetstream.PubAckFuture, w *watch) error {
	for {
		if err := w.denied(b.subjects[i]); err != nil {
			return b.classify(ctx, i, err)
		}
		select {
		case ack := <-f.Ok():
			return b.acked(i, ack)
		case err := <-f.Err():
			return b.classify(ctx, i, err)
		case <-w.changed():
			// The server refused a publish to some subject: look again.
		case <-ctx.Done():
			return b.unanswered(ctx, i, f)
		}
	}
}

// acked checks an acknowledgement: a duplicate is a success, since the stream
// holds the message from its first delivery.
func (b *batch) acked(i int, ack *jetstream.PubAck) error {
	if b.s.stream != "" && ack.Stream != b.s.stream {
		return relay.Permanent(fmt.Errorf("natsjs: message %d was stored in stream %q, not in Config.Stream %q",
			b.ms[i].ID, ack.Stream, b.s.stream))
	}
	return nil
}

// unanswered is the error of message i when ctx ended before its
// acknowledgement arrived.
func (b *batch) unanswered(ctx context.Context, i int, f jetstream.PubAckFuture) error {
	select {
	case ack := <-f.Ok():
		return b.acked(i, ack)
	case err := <-f.Err():
		return b.classify(ctx, i, err)
	default:
	}
	// A denial the handler has not seen yet may still be the connection's last error.
	if err := b.s.nc.LastError(); err != nil && deniedSubject(err) == b.subjects[i] {
		return b.classify(ctx, i, err)
	}
	return fmt.Errorf("natsjs: no acknowledgement from JetStream for message %d on %s: %w",
		b.ms[i].ID, b.subjects[i], context.Cause(ctx))
}

// msg builds the NATS message of m.
func (s *Sender) msg(m relay.Message, subj string) *nats.Msg {
	h := make(nats.Header, 7+len(m.Headers))
	// The message's own headers, named as written (a W3C traceparent, say);
	// the relay refused any that would take one of the sender's names, which
	// are set after them and so win in a Message built by hand.
	for name, value := range m.Headers {
		h[name] = []string{value}
	}
	h[jetstream.MsgIDHeader] = []string{m.IdempotencyKey()}
	h[HeaderMessageID] = []string{strconv.FormatInt(m.ID, 10)}
	h[HeaderMessageType] = []string{m.Type}
	if headerSafe(m.Key) {
		h[HeaderMessageKey] = []string{m.Key}
	} else {
		h[HeaderMessageKey] = []string{Token(m.Key)}
		h[HeaderKeyEncoding] = []string{"token"}
	}
	h[HeaderAttempt] = []string{strconv.Itoa(m.Attempts + 1)}
	if s.stream != "" {
		h[jetstream.ExpectedStreamHeader] = []string{s.stream}
	}
	return &nats.Msg{Subject: subj, Header: h, Data: m.Payload}
}

// headerSafe reports whether a header carries v as it is: not empty, no
// control characters, no leading or trailing blank (header parsers trim them).
func headerSafe(v string) bool {
	if v == "" || v[0] == ' ' || v[len(v)-1] == ' ' {
		return false
	}
	for i := 0; i < len(v); i++ {
		if c := v[i]; c < 0x20 || c == 0x7f {
			return false
		}
	}
	return true
}

// redactURLs is a Connect URL (one, or several separated by commas) fit for
// an error: each one's password replaced by "xxxxx", as pgx does; a URL that
// does not parse is not shown.
func redactURLs(s string) string {
	parts := strings.Split(s, ",")
	for i, p := range parts {
		u, err := url.Parse(strings.TrimSpace(p))
		if err != nil {
			parts[i] = "(a URL that does not parse)"
			continue
		}
		if _, ok := u.User.Password(); ok {
			u.User = url.UserPassword(u.User.Username(), "xxxxx")
		}
		parts[i] = u.String()
	}
	return strings.Join(parts, ",")
}
