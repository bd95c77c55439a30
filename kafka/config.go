package kafka

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// TimeoutDefault is the default of [Config.Timeout].
const TimeoutDefault = 10 * time.Second

// topicMaxLen is the longest topic name Kafka accepts.
const topicMaxLen = 249

// Config configures [NewSender].
type Config struct {
	// Type is the message type the sender delivers. Required.
	Type string

	// Topic is the topic every message of Type goes to. Give every sender the
	// same Topic for one topic of all types, or each its own. Defaults to
	// Type itself: one topic per type, named after it.
	Topic string

	// Client produces the records: a client the caller built, shared by any
	// number of senders, and closed by the caller, never by the sender. It must
	// keep the idempotent producer on (kgo's default) and require acks from all
	// in-sync replicas (also kgo's default), and must not be transactional.
	// Give it kgo.MetadataMinAge(time.Second), or a missing topic may take
	// longer than Timeout to be reported (see Brokers), and every message to
	// it is retried instead of marked dead. Exactly one of Client and Brokers
	// is required.
	Client *kgo.Client

	// Brokers are the seed brokers ("host:port") of a client the sender builds
	// for itself and closes in [Sender.Close]: kgo's defaults, except
	// kgo.MetadataMinAge(time.Second) so that a missing topic is reported
	// within seconds (kgo gives up after 4 metadata loads, which its default
	// spaces by 5s). Exactly one of Client and Brokers is required.
	Brokers []string

	// Options are added to the client the sender builds from Brokers, after
	// its own: TLS, SASL, kgo.AllowAutoTopicCreation(), and so on. They may
	// not disable the idempotent producer, lower the acks or make the client
	// transactional. Not allowed with Client. Optional.
	Options []kgo.Opt

	// Timeout bounds one [Sender.Send] or [Sender.SendBatch]: how long the
	// brokers have to acknowledge the records, on top of the relay's ctx (whose
	// [relay.Config.SendTimeout] wins when it is shorter). Records still
	// unacknowledged then fail with a retryable error that says so, naming the
	// last connection error when the sender built the client. Defaults to
	// [TimeoutDefault] (10s).
	Timeout time.Duration

	// Permanent reports whether a produce error is one that retrying cannot
	// fix, so that the message is marked dead at once ([relay.Permanent])
	// instead of retried. Defaults to [PermanentError].
	Permanent func(err error) bool
}

// validate fills in the defaults of c and returns every field it refuses,
// joined, each error naming its field.
func (c *Config) validate() error {
	if c.Timeout == 0 {
		c.Timeout = TimeoutDefault
	}
	if c.Permanent == nil {
		c.Permanent = PermanentError
	}

	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("kafka: Config.%s %s", field, fmt.Sprintf(format, args...)))
	}
	switch {
	case strings.TrimSpace(c.Type) == "":
		bad("Type", "must not be empty")
	case c.Topic == "":
		if err := validTopic(c.Type); err != nil {
			bad("Topic", "is empty, so the topic is the type %q, which %v: set Config.Topic", c.Type, err)
		}
	}
	if c.Topic != "" {
		if err := validTopic(c.Topic); err != nil {
			bad("Topic", "%q %v", c.Topic, err)
		}
	}
	switch {
	case c.Client == nil && len(c.Brokers) == 0:
		bad("Brokers", "must not be empty when Config.Client is nil: give the seed brokers, or a *kgo.Client")
	case c.Client != nil && len(c.Brokers) > 0:
		bad("Brokers", "must be empty when Config.Client is set: the client knows its brokers")
	}
	for i, b := range c.Brokers {
		if strings.TrimSpace(b) == "" {
			bad(fmt.Sprintf("Brokers[%d]", i), "must not be empty")
		}
	}
	if c.Client != nil && len(c.Options) > 0 {
		bad("Options", "apply only to a client the sender builds from Config.Brokers: give them to kgo.NewClient instead")
	}
	for i, o := range c.Options {
		if o == nil {
			bad(fmt.Sprintf("Options[%d]", i), "must not be nil")
		}
	}
	if c.Timeout < 0 {
		bad("Timeout", "must not be negative, got %s", c.Timeout)
	}
	return errors.Join(errs...)
}

// validTopic returns why name is not a topic name Kafka accepts, or nil.
func validTopic(name string) error {
	switch {
	case name == "." || name == "..":
		return errors.New(`is not a valid Kafka topic name: "." and ".." are reserved`)
	case len(name) > topicMaxLen:
		return fmt.Errorf("is not a valid Kafka topic name: longer than %d characters", topicMaxLen)
	}
	for _, r := range name {
		if !('a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' || r == '.' || r == '_' || r == '-') {
			return fmt.Errorf("is not a valid Kafka topic name: %q is not one of the letters, digits, '.', '_' and '-' it may contain", r)
		}
	}
	return nil
}

// checkClient returns why cl cannot carry the sender's records, or nil; field
// names the Config field that gave cl its options.
func checkClient(cl *kgo.Client, field string) error {
	var errs []error
	if v, _ := cl.OptValue(kgo.DisableIdempotentWrite).(bool); v {
		errs = append(errs, fmt.Errorf("kafka: Config.%s: the idempotent producer is disabled (kgo.DisableIdempotentWrite); "+
			"the sender needs it, so that a produce the client retries is written once", field))
	}
	if acks, _ := cl.OptValue(kgo.RequiredAcks).(kgo.Acks); acks != kgo.AllISRAcks() {
		errs = append(errs, fmt.Errorf("kafka: Config.%s: the required acks are lowered (kgo.RequiredAcks); the sender "+
			"needs kgo.AllISRAcks(), so that a message it reports delivered survives the loss of its leader", field))
	}
	if vs := cl.OptValues(kgo.TransactionalID); len(vs) == 2 && vs[1] == true {
		errs = append(errs, fmt.Errorf("kafka: Config.%s: the client is transactional (kgo.TransactionalID); "+
			"the sender produces outside transactions", field))
	}
	return errors.Join(errs...)
}
