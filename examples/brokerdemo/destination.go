package main

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/xadm/relay"
	"github.com/xadm/relay/kafka"
	"github.com/xadm/relay/natsjs"
)

// destination is where a run delivers, and the consumer reading it.
type destination interface {
	// sender returns a new sender of type "order" with its own client, for
	// one replica, and the function that closes it.
	sender() (relay.Sender, func(), error)
	// tally is what the consumer counted.
	tally() *tally
	// close stops the consumer and the broker.
	close()
}

// destinations are the kinds -to names.
var destinations = map[string]struct {
	title string
	start func(ctx context.Context) (destination, error)
}{
	"kafka": {"an in-process Kafka (kfake), topic \"orders\"", startKafka},
	"nats":  {"an embedded NATS JetStream, stream RELAY", startNATS},
	"http":  {"an HTTP receiver on 127.0.0.1", startHTTP},
}

// tally counts the copies of each message a consumer received, by
// Relay-Message-Id, with the Relay-Attempt of each copy.
type tally struct {
	mu       sync.Mutex
	attempts map[int64][]int
	copies   int
}

func newTally() *tally { return &tally{attempts: make(map[int64][]int)} }

// add counts one copy of message id, carrying the headers' values.
func (t *tally) add(id, attempt string) {
	n, err := strconv.ParseInt(id, 10, 64)
	if err != nil {
		n = -1 // counted, and never matching a row: the report shows it as lost
	}
	a, _ := strconv.Atoi(attempt)
	t.mu.Lock()
	t.attempts[n] = append(t.attempts[n], a)
	t.copies++
	t.mu.Unlock()
}

// counts is what a consumer saw.
type counts struct {
	copies     int // messages consumed, copies included
	distinct   int // distinct message ids
	duplicates int // copies of a message already consumed
	// unexplained are the duplicates that carry an attempt number already
	// seen for their message: two replicas sending the same attempt at once
	// (what the election prevents), or a send whose outcome was never recorded.
	// The others are retries after a recorded failure: at-least-once delivery.
	unexplained int
}

func (t *tally) counts() counts {
	t.mu.Lock()
	defer t.mu.Unlock()
	c := counts{copies: t.copies, distinct: len(t.attempts), duplicates: t.copies - len(t.attempts)}
	for _, as := range t.attempts {
		seen := map[int]bool{}
		for _, a := range as {
			if seen[a] {
				c.unexplained++
			}
			seen[a] = true
		}
	}
	return c
}

func (t *tally) received(id int64) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.attempts[id]) > 0
}

// quiet is the logger of the senders' own clients: a replica rolled closes
// its connection, which they would report as an error.
var quiet = slog.New(slog.DiscardHandler)

// kafkaDest is an in-process Kafka cluster (kfake) with topic "orders", and a
// consumer reading it from the start.
type kafkaDest struct {
	cluster  *kfake.Cluster
	consumer *kgo.Client
	t        *tally
	cancel   context.CancelFunc
	done     chan struct{}
}

func startKafka(ctx context.Context) (destination, error) {
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
	d := &kafkaDest{cluster: cluster, consumer: consumer, t: newTally(), cancel: cancel, done: make(chan struct{})}
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
				d.t.add(id, attempt)
			})
		}
	}()
	return d, nil
}

func (d *kafkaDest) sender() (relay.Sender, func(), error) {
	s, err := kafka.NewSender(kafka.Config{Type: "order", Topic: "orders", Brokers: d.cluster.ListenAddrs()})
	if err != nil {
		return nil, nil, err
	}
	return s, s.Close, nil
}

func (d *kafkaDest) tally() *tally { return d.t }

func (d *kafkaDest) close() {
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
	t       *tally
}

func startNATS(ctx context.Context) (d destination, err error) {
	dir, err := os.MkdirTemp("", "brokerdemo-nats-")
	if err != nil {
		return nil, err
	}
	n := &natsDest{dir: dir, t: newTally()}
	defer func() {
		if err != nil {
			n.close()
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
		n.t.add(m.Headers().Get("Relay-Message-Id"), m.Headers().Get("Relay-Attempt"))
	})
	if err != nil {
		return nil, err
	}
	return n, nil
}

func (n *natsDest) sender() (relay.Sender, func(), error) {
	s, err := natsjs.Connect(n.srv.ClientURL(), natsjs.Config{Type: "order", Logger: quiet})
	if err != nil {
		return nil, nil, err
	}
	return s, s.Close, nil
}

func (n *natsDest) tally() *tally { return n.t }

func (n *natsDest) close() {
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

// httpDest is an HTTP receiver on 127.0.0.1 that takes PUT /orders/{key}, as
// examples/demo's, counting by Relay-Message-Id.
type httpDest struct {
	url string
	srv *http.Server
	t   *tally
}

func startHTTP(context.Context) (destination, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	d := &httpDest{url: "http://" + l.Addr().String(), t: newTally()}
	mux := http.NewServeMux()
	mux.HandleFunc("PUT /orders/{key}", func(w http.ResponseWriter, r *http.Request) {
		d.t.add(r.Header.Get("Relay-Message-Id"), r.Header.Get("Relay-Attempt"))
		w.WriteHeader(http.StatusNoContent)
	})
	d.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = d.srv.Serve(l) }()
	return d, nil
}

func (d *httpDest) sender() (relay.Sender, func(), error) {
	s, err := relay.NewHTTPSender(relay.HTTPSenderConfig{Type: "order", URL: relay.URLWithKey(d.url + "/orders")})
	if err != nil {
		return nil, nil, err
	}
	return s, func() {}, nil
}

func (d *httpDest) tally() *tally { return d.t }

func (d *httpDest) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if err := d.srv.Shutdown(ctx); err != nil {
		_ = d.srv.Close()
	}
}
