package e2e_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/xadm/relay/kafka"
)

// TestOrderAcrossRejections has the broker refuse the produces of two of the
// topic's three partitions for a while: their rows go ERROR, the later
// messages of their keys wait unsent behind them, the keys of the third
// partition are delivered meanwhile; once only refused sends are left, the
// type is paused (Config.PauseAfter failures in a row) and probed with one
// message; once the broker accepts again, a probe resumes it, delivery
// resumes by itself, and the consumer sees every key in id order.
func TestOrderAcrossRejections(t *testing.T) {
	t.Parallel()
	c := newCluster(t, kfake.NumBrokers(1), kfake.SeedTopics(3, "orders"))
	b := setup(t)
	b.cfg.Concurrency = 8
	b.cfg.MaxAttempts = 1000 // nothing dies while the broker refuses
	s := newSender(t, kafka.Config{Type: "order", Topic: "orders", Brokers: c.ListenAddrs(), Timeout: time.Second})

	refusal := c.Fault(kfake.Fault{
		Keys:       []kmsg.Key{kmsg.Produce},
		Topic:      "orders",
		Partitions: []int32{0, 1},
		Err:        kerr.NotEnoughReplicas, // retriable: the client retries it until the sender's Timeout
		Count:      -1,
	})
	t.Cleanup(refusal.Remove)

	const keys, perKey = 24, 4
	for i := range perKey {
		for k := range keys {
			b.enqueue(t, "order", fmt.Sprintf("key-%d", k), map[string]int{"key": k, "seq": i})
		}
	}
	r := b.relay(t, s)
	start(t, r)

	// While the broker refuses: each key of a refused partition has its first
	// message in ERROR, one of them retried as the paused type's probe, and
	// the later ones untouched; the keys of the third partition are all SENT.
	rs := b.waitRows(t, "the refused keys failed, a probe retried and the others delivered", func(rs []row) bool {
		requireHeldBack(t, rs)
		failed, retried, sent := 0, 0, 0
		for _, row := range rs {
			if row.Status == "ERROR" {
				failed++
			}
			if row.Status == "ERROR" && row.Attempts >= 2 {
				retried++
			}
			if row.Status == "SENT" {
				sent++
			}
		}
		return retried > 0 && failed+sent/perKey == keys && len(r.Stats().Paused) == 1
	})
	for _, row := range rs {
		if row.Status == "ERROR" {
			require.Contains(t, row.LastError, "no acknowledgement from the brokers within 1s", "row %d", row.ID)
		}
	}

	refusal.Remove()
	rs = b.waitRows(t, "every row SENT once the broker accepts again", func(rs []row) bool {
		requireHeldBack(t, rs)
		return allSent(rs)
	})
	requireKeyOrder(t, consume(t, c, "orders"), rs)
}

// requireHeldBack checks that no key has a message sent after one of its
// earlier messages that is not.
func requireHeldBack(t *testing.T, rs []row) {
	t.Helper()
	unsent := map[string]int64{} // the first id of each key that is not SENT
	for _, r := range rs {       // in id order
		if first, ok := unsent[r.Key]; ok {
			require.NotEqual(t, "SENT", r.Status, "row %d of key %s SENT while row %d is not", r.ID, r.Key, first)
			require.Zero(t, r.Attempts, "row %d of key %s tried while row %d is not SENT", r.ID, r.Key, first)
			continue
		}
		if r.Status != "SENT" {
			unsent[r.Key] = r.ID
		}
	}
}
