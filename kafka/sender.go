package kafka

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/xadm/relay"
)

// metadataMinAge is the kgo.MetadataMinAge of a client the sender builds,
// instead of kgo's 5s: kgo gives up on an unknown topic after
// kgo.UnknownTopicRetries metadata loads (4), which it may space by this
// much, and the sender must learn that a topic is missing well within its
// Timeout, or it would retry a message that can never be delivered.
const metadataMinAge = time.Second

// abandonGrace is how long a produce whose context ended may take to report
// before the sender returns without it: less than the relay's own grace, so
// that the relay never has to abandon the sender.
const abandonGrace = 50 * time.Millisecond

// Sender delivers the messages of one type as Kafka records, one record per
// message, on the topic of [Config.Topic]. Build it with [NewSender]; it is
// safe for concurrent use. It implements [relay.BatchSender]: [Sender.Send]
// produces one record and waits for its acknowledgement, [Sender.SendBatch]
// produces many and waits for all of them, one round trip for the lot.
//
// Each record's key is the message's natural key, so that the default
// partitioner puts all of a key's messages on one partition, in the order the
// relay hands them over (one at a time per key, in id order). Its value is the
// payload, verbatim. Its headers are [HeaderMessageID], [HeaderMessageType],
// [HeaderAttempt] and [HeaderIdempotencyKey], then the message's own
// ([relay.Message.Headers]: a W3C traceparent, say), named as written.
//
// The producer is idempotent and waits for all in-sync replicas, so a record
// the client retries after a lost answer is written once, and a record
// reported delivered survives its leader. A crash of the relay between the
// acknowledgement and the commit of the outcome still produces the message
// again, on a later pass: consumers drop a record whose Relay-Message-Id is not
// above the last one they applied for its key, or deduplicate by
// Idempotency-Key.
type Sender struct {
	typ       string
	topic     string
	client    *kgo.Client
	owned     bool       // the sender built client and closes it
	conns     *connWatch // the last connection error; nil for a caller's client
	timeout   time.Duration
	timedOut  error // the cause of an expired Timeout
	permanent func(error) bool
	closeOnce sync.Once
}

var _ relay.BatchSender = (*Sender)(nil)

// NewSender returns a [Sender] configured by cfg, or an error naming each
// field it refuses, as in "kafka: Config.Type must not be empty". It builds a
// client from cfg.Brokers when cfg.Client is nil; building one does not
// connect, so NewSender succeeds while the brokers are down.
func NewSender(cfg Config) (*Sender, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	s := &Sender{
		typ:       cfg.Type,
		topic:     cmp.Or(cfg.Topic, cfg.Type),
		client:    cfg.Client,
		timeout:   cfg.Timeout,
		timedOut:  fmt.Errorf("no acknowledgement from the brokers within %s (kafka.Config.Timeout)", cfg.Timeout),
		permanent: cfg.Permanent,
	}
	field := "Client"
	if s.client == nil {
		s.conns = &connWatch{}
		opts := append([]kgo.Opt{kgo.MetadataMinAge(metadataMinAge)}, cfg.Options...)
		opts = append(opts, kgo.SeedBrokers(cfg.Brokers...), kgo.WithHooks(s.conns))
		cl, err := kgo.NewClient(opts...)
		if err != nil {
			return nil, fmt.Errorf("kafka: build a client from Config.Brokers and Config.Options: %w", err)
		}
		s.client, s.owned, field = cl, true, "Options"
	}
	if err := checkClient(s.client, field); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// Type returns the message type the sender delivers, [Config.Type].
func (s *Sender) Type() string { return s.typ }

// Send produces m as one record and waits until the brokers acknowledge it, at
// most [Config.Timeout]. It returns nil once the record is written to all
// in-sync replicas, an error wrapped with [relay.Permanent] when
// [Config.Permanent] says retrying cannot help, and a plain error otherwise.
func (s *Sender) Send(ctx context.Context, m relay.Message) error {
	return s.SendBatch(ctx, []relay.Message{m})[0]
}

// SendBatch produces one record per message and waits until the brokers
// acknowledged or refused each of them, at most [Config.Timeout] for the lot:
// one produce round for all, the records of one partition going in few
// requests. It returns one error per message, errs[i] for ms[i], each as
// [Sender.Send] returns it: a failure marks only its own message.
//
// Messages of one key keep their order on the partition only if the caller
// hands over a key's next message after its previous one succeeded, as the
// relay does: SendBatch gets at most one message per key.
//
// A broker refuses a whole batch of records that is larger than a topic's
// max.message.bytes, good records with the bad one: a record refused as too
// large is produced once more on its own before it counts as refused.
func (s *Sender) SendBatch(ctx context.Context, ms []relay.Message) (errs []error) {
	errs = make([]error, len(ms))
	if len(ms) == 0 {
		return errs
	}
	parent := ctx
	ctx, cancel := context.WithTimeoutCause(ctx, s.timeout, s.timedOut)
	defer cancel()

	recs := make([]*kgo.Record, len(ms))
	for i := range ms {
		recs[i] = s.record(&ms[i])
	}
	s.produce(ctx, recs, errs)

	for i, err := range errs {
		if errors.Is(err, kerr.MessageTooLarge) && ctx.Err() == nil {
			s.produce(ctx, []*kgo.Record{s.record(&ms[i])}, errs[i:i+1])
		}
	}
	for i, err := range errs {
		if err != nil {
			errs[i] = s.describe(parent, err)
		}
	}
	return errs
}

// Close closes the client the sender built from [Config.Brokers], failing the
// records it still holds; the sender must not be used afterwards. It does
// nothing to a caller's [Config.Client]. A second Close does nothing.
func (s *Sender) Close() {
	if s.owned {
		s.closeOnce.Do(s.client.Close)
	}
}

// produce produces recs and stores each one's result in errs (nil, kgo's
// error, or ctx's error for a record that had none when ctx ended).
func (s *Sender) produce(ctx context.Context, recs []*kgo.Record, errs []error) {
	index := make(map[*kgo.Record]int, len(recs))
	for i, r := range recs {
		index[r] = i
		errs[i] = nil
	}
	done := make(chan kgo.ProduceResults, 1)
	// ProduceSync stops lingering on the partitions it produced to, so that a
	// lone record leaves at once; it returns when every promise has fired.
	go func() { done <- s.client.ProduceSync(ctx, recs...) }()

	var results kgo.ProduceResults
	select {
	case results = <-done:
	case <-ctx.Done():
		// The client fails the records it has not sent yet at once, and
		// those in flight when their answer comes: wait a little for that,
		// then report the rest as interrupted. Their results, when they come,
		// go nowhere.
		t := time.NewTimer(abandonGrace)
		select {
		case results = <-done:
		case <-t.C:
		}
		t.Stop()
	}
	answered := make([]bool, len(recs))
	for _, res := range results {
		if i, ok := index[res.Record]; ok {
			errs[i], answered[i] = res.Err, true
		}
	}
	for i := range recs {
		if !answered[i] {
			errs[i] = context.Cause(ctx)
		}
	}
}

// describe turns a failed produce's error into the one Send returns: the
// topic and the cause, in words that read well in last_error, and
// [relay.Permanent] when s.permanent says so. parent is the caller's ctx.
func (s *Sender) describe(parent context.Context, err error) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, s.timedOut) {
		// The client reports a record given up on with ctx.Err(), sometimes
		// just before ctx says it is done: unless the caller's ctx ended,
		// it was the sender's Timeout.
		if parent.Err() != nil {
			return fmt.Errorf("kafka: produce to topic %q: %w", s.topic, context.Cause(parent))
		}
		if last := s.conns.last(); last != "" {
			return fmt.Errorf("kafka: produce to topic %q: %w; last connection error: %s", s.topic, s.timedOut, last)
		}
		return fmt.Errorf("kafka: produce to topic %q: %w", s.topic, s.timedOut)
	}
	err = fmt.Errorf("kafka: produce to topic %q: %w", s.topic, err)
	if s.permanent(err) {
		return relay.Permanent(err)
	}
	return err
}

// The headers a [Sender] sets on every record.
const (
	// HeaderMessageID is the message's id in decimal ([relay.Message.ID]). It
	// grows with each message of a key: a consumer ignores a record whose id
	// is lower than the last one it applied for the record's key, which a
	// failover or a re-delivery can bring after a newer one.
	HeaderMessageID = "Relay-Message-Id"
	// HeaderMessageType is the message's type ([relay.Message.Type]).
	HeaderMessageType = "Relay-Message-Type"
	// HeaderAttempt is the attempt being made, in decimal, from 1
	// ([relay.Message.Attempts] + 1).
	HeaderAttempt = "Relay-Attempt"
	// HeaderIdempotencyKey names the one message ([relay.Message.IdempotencyKey]):
	// the same on every delivery of the message, different for every other
	// message, including the other messages of its key.
	HeaderIdempotencyKey = "Idempotency-Key"
)

// record returns m as the record Send produces: the sender's headers first,
// then the message's own ([relay.Message.Headers]), by name, as they are
// (the relay refused any that would take one of the sender's names).
func (s *Sender) record(m *relay.Message) *kgo.Record {
	headers := make([]kgo.RecordHeader, 4, 4+len(m.Headers))
	headers[0] = kgo.RecordHeader{Key: HeaderMessageID, Value: strconv.AppendInt(nil, m.ID, 10)}
	headers[1] = kgo.RecordHeader{Key: HeaderMessageType, Value: []byte(m.Type)}
	headers[2] = kgo.RecordHeader{Key: HeaderAttempt, Value: strconv.AppendInt(nil, int64(m.Attempts)+1, 10)}
	headers[3] = kgo.RecordHeader{Key: HeaderIdempotencyKey, Value: []byte(m.IdempotencyKey())}
	for _, name := range slices.Sorted(maps.Keys(m.Headers)) {
		headers = append(headers, kgo.RecordHeader{Key: name, Value: []byte(m.Headers[name])})
	}
	return &kgo.Record{Topic: s.topic, Key: []byte(m.Key), Value: m.Payload, Headers: headers}
}

// connWatch remembers the last failed connection to a broker of a client the
// sender built, so that a timeout can say why nothing was acknowledged.
type connWatch struct {
	err atomic.Pointer[string] // nil after a successful connection
}

var _ kgo.HookBrokerConnect = (*connWatch)(nil)

// OnBrokerConnect implements [kgo.HookBrokerConnect].
func (w *connWatch) OnBrokerConnect(meta kgo.BrokerMetadata, _ time.Duration, _ net.Conn, err error) {
	if err == nil {
		w.err.Store(nil)
		return
	}
	msg := net.JoinHostPort(meta.Host, strconv.Itoa(int(meta.Port))) + ": " + err.Error()
	w.err.Store(&msg)
}

// last returns the last connection error, "" if the last connection succeeded
// or w is nil.
func (w *connWatch) last() string {
	if w == nil {
		return ""
	}
	if p := w.err.Load(); p != nil {
		return *p
	}
	return ""
}
