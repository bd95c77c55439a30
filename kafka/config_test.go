package kafka

import (
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// TestNewSenderRefuses checks that each bad Config gets an error naming its
// field, and that nothing is left running when NewSender refuses.
func TestNewSenderRefuses(t *testing.T) {
	brokers := []string{"127.0.0.1:9092"}
	client := func(t *testing.T, opts ...kgo.Opt) *kgo.Client {
		cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers...)}, opts...)...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(cl.Close)
		return cl
	}
	tests := []struct {
		name string
		cfg  func(t *testing.T) Config
		want []string
	}{
		{"NoType", func(*testing.T) Config { return Config{Brokers: brokers} },
			[]string{"kafka: Config.Type must not be empty"}},
		{"BlankType", func(*testing.T) Config { return Config{Type: " ", Topic: "t", Brokers: brokers} },
			[]string{"kafka: Config.Type must not be empty"}},
		{"TypeIsNoTopicName", func(*testing.T) Config { return Config{Type: "order created", Brokers: brokers} },
			[]string{`kafka: Config.Topic is empty, so the topic is the type "order created", which is not a valid Kafka topic name: ' '`, "set Config.Topic"}},
		{"BadTopic", func(*testing.T) Config { return Config{Type: "order", Topic: "orders/eu", Brokers: brokers} },
			[]string{`kafka: Config.Topic "orders/eu" is not a valid Kafka topic name: '/'`}},
		{"DotTopic", func(*testing.T) Config { return Config{Type: "order", Topic: "..", Brokers: brokers} },
			[]string{`kafka: Config.Topic ".." is not a valid Kafka topic name`}},
		{"LongTopic", func(*testing.T) Config {
			return Config{Type: "order", Topic: strings.Repeat("a", 250), Brokers: brokers}
		},
			[]string{"longer than 249 characters"}},
		{"NoBrokers", func(*testing.T) Config { return Config{Type: "order"} },
			[]string{"kafka: Config.Brokers must not be empty when Config.Client is nil"}},
		{"EmptyBroker", func(*testing.T) Config { return Config{Type: "order", Brokers: []string{""}} },
			[]string{"kafka: Config.Brokers[0] must not be empty"}},
		{"ClientAndBrokers", func(t *testing.T) Config { return Config{Type: "order", Client: client(t), Brokers: brokers} },
			[]string{"kafka: Config.Brokers must be empty when Config.Client is set"}},
		{"ClientAndOptions", func(t *testing.T) Config {
			return Config{Type: "order", Client: client(t), Options: []kgo.Opt{kgo.ClientID("x")}}
		}, []string{"kafka: Config.Options apply only to a client the sender builds"}},
		{"NilOption", func(*testing.T) Config { return Config{Type: "order", Brokers: brokers, Options: []kgo.Opt{nil}} },
			[]string{"kafka: Config.Options[0] must not be nil"}},
		{"NegativeTimeout", func(*testing.T) Config { return Config{Type: "order", Brokers: brokers, Timeout: -time.Second} },
			[]string{"kafka: Config.Timeout must not be negative, got -1s"}},
		{"ClientNotIdempotent", func(t *testing.T) Config {
			return Config{Type: "order", Client: client(t, kgo.DisableIdempotentWrite(), kgo.RequiredAcks(kgo.LeaderAck()))}
		}, []string{"kafka: Config.Client: the idempotent producer is disabled (kgo.DisableIdempotentWrite)",
			"kafka: Config.Client: the required acks are lowered (kgo.RequiredAcks)"}},
		{"ClientTransactional", func(t *testing.T) Config {
			return Config{Type: "order", Client: client(t, kgo.TransactionalID("txn"))}
		}, []string{"kafka: Config.Client: the client is transactional (kgo.TransactionalID)"}},
		{"OptionsNotIdempotent", func(*testing.T) Config {
			return Config{Type: "order", Brokers: brokers, Options: []kgo.Opt{kgo.DisableIdempotentWrite(), kgo.RequiredAcks(kgo.LeaderAck())}}
		}, []string{"kafka: Config.Options: the idempotent producer is disabled", "kafka: Config.Options: the required acks are lowered"}},
		{"OptionsLeaderAcks", func(*testing.T) Config {
			return Config{Type: "order", Brokers: brokers, Options: []kgo.Opt{kgo.RequiredAcks(kgo.LeaderAck())}}
		}, []string{"kafka: build a client from Config.Brokers and Config.Options: idempotency requires acks=all"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := NewSender(tt.cfg(t))
			if err == nil {
				s.Close()
				t.Fatal("NewSender accepted the config")
			}
			for _, want := range tt.want {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not contain %q", err, want)
				}
			}
		})
	}
}

// TestNewSenderDefaults checks what NewSender fills in, without a broker:
// building a client does not connect.
func TestNewSenderDefaults(t *testing.T) {
	s, err := NewSender(Config{Type: "order.created", Brokers: []string{"127.0.0.1:9092"}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.Type() != "order.created" || s.topic != "order.created" {
		t.Errorf("type %q, topic %q: want the type as the topic", s.Type(), s.topic)
	}
	if s.timeout != TimeoutDefault {
		t.Errorf("timeout %s, want %s", s.timeout, TimeoutDefault)
	}
	if got := s.client.OptValue(kgo.MetadataMinAge); got != metadataMinAge {
		t.Errorf("MetadataMinAge %v, want %v", got, metadataMinAge)
	}
	if got := s.client.OptValue(kgo.DisableIdempotentWrite); got != false {
		t.Errorf("DisableIdempotentWrite %v, want false", got)
	}
	s.Close() // a second Close does nothing

	// A caller's client is the caller's: Close leaves it open.
	cl, err := kgo.NewClient(kgo.SeedBrokers("127.0.0.1:9092"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	s, err = NewSender(Config{Type: "order", Topic: "orders", Client: cl, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	if err := cl.Ping(t.Context()); err == nil || strings.Contains(err.Error(), "client closed") {
		// No broker answers: Ping fails, but not because the client was closed.
		t.Errorf("the caller's client after Close: %v", err)
	}
}
