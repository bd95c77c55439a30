package kafka

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/xadm/relay"
)

// TestRecord checks the record a message becomes: key, value, headers.
func TestRecord(t *testing.T) {
	s := &Sender{topic: "orders"}
	m := relay.Message{ID: 42, Type: "order.created", Key: "order-7", Payload: []byte(`{"total":10}`), Attempts: 2}
	r := s.record(&m)
	if r.Topic != "orders" || string(r.Key) != "order-7" || string(r.Value) != `{"total":10}` {
		t.Errorf("record %s key %q value %q", r.Topic, r.Key, r.Value)
	}
	want := [][2]string{
		{"Relay-Message-Id", "42"},
		{"Relay-Message-Type", "order.created"},
		{"Relay-Attempt", "3"},
		{"Idempotency-Key", "42"}, // a hand-built message has no table
	}
	if len(r.Headers) != len(want) {
		t.Fatalf("headers %v, want %v", r.Headers, want)
	}
	for i, h := range r.Headers {
		if h.Key != want[i][0] || string(h.Value) != want[i][1] {
			t.Errorf("header %d: %s=%q, want %s=%q", i, h.Key, h.Value, want[i][0], want[i][1])
		}
	}
}

// TestSendWithoutBroker checks, without a broker, that a Send nobody answers
// fails, within Timeout, with a retryable error naming the refused connection.
func TestSendWithoutBroker(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now

	s, err := NewSender(Config{Type: "order", Topic: "orders", Brokers: []string{addr}, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	err = s.Send(context.Background(), relay.Message{ID: 1, Type: "order", Key: "k", Payload: []byte(`{}`)})
	if err == nil || relay.IsPermanent(err) {
		t.Fatalf("Send = %v, want a retryable error", err)
	}
	// Either the sender's Timeout ends the wait ("no acknowledgement from the
	// brokers within 1s ...; last connection error: <addr>: ...") or kgo gives
	// up on the record after failed dials: both name the refused address.
	for _, want := range []string{`kafka: produce to topic "orders": `, addr, "connection refused"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not contain %q", err, want)
		}
	}
}
