package main

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/xadm/relay"
	"github.com/xadm/relay/internal/tools/demo"
	"github.com/xadm/relay/kafka"
	"github.com/xadm/relay/natsjs"
)

// destinations are the kinds -to names.
var destinations = map[string]struct {
	title   string
	start   func(ctx context.Context) (demo.Destination, error)
	dropped string // what the copies handed to the senders but never consumed became
}{
	"kafka": {"an in-process Kafka (kfake), topic \"orders\"", startKafka, "reached no consumer and were retried"},
	"nats":  {"an embedded NATS JetStream, stream RELAY", startNATS, "the stream dropped as duplicates (Nats-Msg-Id)"},
	"http":  {"an HTTP receiver on 127.0.0.1", demo.StartHTTP(0), "reached no consumer and were retried"},
}

// quiet is the logger of the senders' own clients: a replica rolled closes
// its connection, which they would report as an error.
var quiet = slog.New(slog.DiscardHandler)

// kafkaDest is an in-process Kafka cluster (kfake) with topic "orders", and a
// consumer reading it from the start.
type kafkaDest struct {
	cluster  *kfake.Cluster
	consumer *kgo.Client
	t        *demo.Tally
	cancel   context.CancelFunc
	done     chan struct{}
}

func startKafka(ctx context.Context) (demo.Destination, error) {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(4, "orders"))
	if err != nil {
		return nil, err
	}
	consumer, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...), kgo.ConsumeTopics("orders"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		cluster.Close()
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	d := &kafkaDest{cluster: cluster, consumer: consumer, t: demo.NewTally(), cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(d.done)
		for ctx.Err() == nil {
			consumer.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
				var id, attempt string
				for _, h := range r.Headers {
					switch h.Key {
					case "Relay-Message-Id":
						id = string(h.Value)
					case "Relay-Attempt":
						attempt = string(h.Value)
					}
				}
				d.t.Add(id, attempt)
			})
		}
	}()
	return d, nil
}

func (d *kafkaDest) Sender() (relay.Sender, func(), error) {
	s, err := kafka.NewSender(kafka.Config{Type: demo.OrderType, Topic: "orders", Brokers: d.cluster.ListenAddrs()})
	if err != nil {
		return nil, nil, err
	}
	return s, s.Close, nil
}

func (d *kafkaDest) Tally() *demo.Tally { return d.t }

func (d *kafkaDest) Close() {
	d.cancel()
	<-d.done
	d.consumer.Close()
	d.cluster.Close()
}

// natsDest is an embedded nats-server with JetStream, a stream RELAY on
// relay.> with a two-minute duplicate window, and an ordered consumer of it.
type natsDest struct {
	srv     *server.Server
	dir     string
	nc      *nats.Conn
	consume jetstream.ConsumeContext
	t       *demo.Tally
}

func startNATS(ctx context.Context) (d demo.Destination, err error) {
	dir, err := os.MkdirTemp("", "brokerdemo-nats-")
	if err != nil {
		return nil, err
	}
	n := &natsDest{dir: dir, t: demo.NewTally()}
	defer func() {
		if err != nil {
			n.Close()
		}
	}()
	n.srv, err = server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT,
		JetStream: true, StoreDir: dir, NoLog: true, NoSigs: true})
	if err != nil {
		return nil, err
	}
	go n.srv.Start()
	if !n.srv.ReadyForConnections(30 * time.Second) {
		return nil, errors.New("the embedded NATS server did not accept connections within 30s")
	}
	if n.nc, err = nats.Connect(n.srv.ClientURL()); err != nil {
		return nil, err
	}
	js, err := jetstream.New(n.nc)
	if err != nil {
		return nil, err
	}
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "RELAY", Subjects: []string{"relay.>"},
		Storage: jetstream.FileStorage, Duplicates: 2 * time.Minute})
	if err != nil {
		return nil, err
	}
	consumer, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return nil, err
	}
	n.consume, err = consumer.Consume(func(m jetstream.Msg) {
		n.t.Add(m.Headers().Get("Relay-Message-Id"), m.Headers().Get("Relay-Attempt"))
	})
	if err != nil {
		return nil, err
	}
	return n, nil
}

func (n *natsDest) Sender() (relay.Sender, func(), error) {
	s, err := natsjs.Connect(n.srv.ClientURL(), natsjs.Config{Type: demo.OrderType, Logger: quiet})
	if err != nil {
		return nil, nil, err
	}
	return s, s.Close, nil
}

func (n *natsDest) Tally() *demo.Tally { return n.t }

func (n *natsDest) Close() {
	if n.consume != nil {
		n.consume.Stop()
		<-n.consume.Closed()
	}
	if n.nc != nil {
		n.nc.Close()
	}
	if n.srv != nil {
		n.srv.Shutdown()
		n.srv.WaitForShutdown()
	}
	_ = os.RemoveAll(n.dir)
}
