package e2e_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/xadm/relay/kafka"
)

// TestBrokerOutage stops the only broker while the relay runs: the rows
// written meanwhile go ERROR with a last_error and a log line that say what
// happened, the later messages of their keys wait, and the type is paused
// (Config.PauseAfter failures in a row): one message is sent as a probe,
// the others spend no attempts; the broker comes back on the same address
// with its log intact, the next probe resumes the type, and delivery
// resumes by itself, each key in id order on the topic.
func TestBrokerOutage(t *testing.T) {
	t.Parallel()
	port, dir := freePort(t), t.TempDir()
	up := func() *kfake.Cluster {
		t.Helper()
		return newCluster(t, kfake.NumBrokers(1), kfake.Ports(port), kfake.DataDir(dir), kfake.SeedTopics(3, "orders"))
	}
	c := up()
	b := setup(t)
	b.cfg.Concurrency = 4
	b.cfg.MaxAttempts = 1000 // nothing dies during the outage
	s := newSender(t, kafka.Config{Type: "order", Topic: "orders", Brokers: []string{fmt.Sprintf("127.0.0.1:%d", port)},
		Timeout: 500 * time.Millisecond})
	r := b.relay(t, s)
	start(t, r)

	const keys = 8
	for k := range keys {
		b.enqueue(t, "order", fmt.Sprintf("key-%d", k), map[string]any{"key": k, "phase": "before"})
	}
	b.waitRows(t, "the first messages SENT", allSent)

	c.Close()
	for i := range 3 {
		for k := range keys {
			b.enqueue(t, "order", fmt.Sprintf("key-%d", k), map[string]any{"key": k, "phase": "during", "seq": i})
		}
	}
	rs := b.waitRows(t, "the type paused and a probe retried while the broker is down", func(rs []row) bool {
		requireHeldBack(t, rs)
		retried := false
		for _, row := range rs {
			retried = retried || row.Status == "ERROR" && row.Attempts >= 2
		}
		return retried && len(r.Stats().Paused) == 1
	})
	require.Equal(t, "order", r.Stats().Paused[0].Type)
	// kgo gives up on the record itself after failed dials, or the sender's
	// Timeout does: either way the error says the broker refused.
	for _, row := range rs {
		if row.Status == "ERROR" {
			require.Contains(t, row.LastError, `kafka: produce to topic "orders": `, "row %d", row.ID)
			require.True(t, strings.Contains(row.LastError, "connection refused") ||
				strings.Contains(row.LastError, "no acknowledgement from the brokers within 500ms"), "row %d: %s", row.ID, row.LastError)
		}
	}
	logged := b.logs.Lines("relay: send failed; will retry", `kafka: produce to topic \"orders\"`, "connection refused")
	require.NotEmpty(t, logged, "a log line says why the rows failed")

	c = up()
	rs = b.waitRows(t, "every row SENT once the broker is back", func(rs []row) bool {
		requireHeldBack(t, rs)
		return allSent(rs)
	})
	require.Empty(t, r.Stats().Paused, "the probe resumed the type")
	requireKeyOrder(t, consume(t, c, "orders"), rs)
}
