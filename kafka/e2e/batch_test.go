package e2e_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/xadm/relay"
	"github.com/xadm/relay/kafka"
)

// TestSendBatch calls SendBatch directly, as the relay's engine does with a
// BatchSender: many messages of distinct keys in one call, one outcome each.
func TestSendBatch(t *testing.T) {
	t.Parallel()

	t.Run("ManyInOneCall", func(t *testing.T) {
		t.Parallel()
		c := newCluster(t, kfake.SeedTopics(4, "orders"))
		s := newSender(t, kafka.Config{Type: "order", Topic: "orders", Brokers: c.ListenAddrs(), Timeout: waitLimit})
		const n = 500
		ms := make([]relay.Message, n)
		for i := range ms {
			ms[i] = message(int64(i+1), "order", fmt.Sprintf("key-%d", i), fmt.Sprintf(`{"n":%d}`, i))
			ms[i].Attempts = i % 3
		}
		errs := s.SendBatch(context.Background(), ms)
		require.Len(t, errs, n)
		for i, err := range errs {
			require.NoError(t, err, "message %d", i)
		}
		recs := consume(t, c, "orders")
		require.Len(t, recs, n, "one record per message")
		got := map[int64]*kgo.Record{}
		for _, r := range recs {
			got[recordID(t, r)] = r
		}
		for _, m := range ms {
			r := got[m.ID]
			require.NotNil(t, r, "message %d", m.ID)
			require.Equal(t, m.Key, string(r.Key))
			require.Equal(t, string(m.Payload), string(r.Value))
			require.Equal(t, fmt.Sprint(m.Attempts+1), header(t, r, kafka.HeaderAttempt))
			require.Equal(t, m.IdempotencyKey(), header(t, r, kafka.HeaderIdempotencyKey))
			require.Equal(t, "order", header(t, r, kafka.HeaderMessageType))
		}
	})

	t.Run("OneTooLargeAmongGoodOnes", func(t *testing.T) {
		t.Parallel()
		// One partition, so that the broker gets the large record in one
		// batch with the good ones and refuses the batch.
		c := newCluster(t)
		require.NoError(t, c.CreateTopic("small", 1, map[string]string{"max.message.bytes": "4000"}))
		s := newSender(t, kafka.Config{Type: "order", Topic: "small", Brokers: c.ListenAddrs(), Timeout: waitLimit})
		const n, large = 20, 7
		ms := make([]relay.Message, n)
		for i := range ms {
			ms[i] = message(int64(i+1), "order", fmt.Sprintf("key-%d", i), fmt.Sprintf(`{"n":%d}`, i))
		}
		ms[large].Payload = []byte(`"` + randomText(6000) + `"`)
		errs := s.SendBatch(context.Background(), ms)
		require.Len(t, errs, n)
		for i, err := range errs {
			if i == large {
				require.True(t, relay.IsPermanent(err), "%v", err)
				require.ErrorIs(t, err, kerr.MessageTooLarge)
				continue
			}
			require.NoError(t, err, "message %d", i)
		}
		recs := consume(t, c, "small")
		require.Len(t, recs, n-1)
		for _, r := range recs {
			require.NotEqual(t, ms[large].ID, recordID(t, r))
		}
	})

	t.Run("RefusedPartitionFailsOnlyItsOwn", func(t *testing.T) {
		t.Parallel()
		c := newCluster(t, kfake.SeedTopics(4, "orders"))
		c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: "orders", Partitions: []int32{2},
			Err: kerr.UnknownServerError, Count: -1})
		s := newSender(t, kafka.Config{Type: "order", Topic: "orders", Brokers: c.ListenAddrs(), Timeout: waitLimit})
		ms := make([]relay.Message, 100)
		for i := range ms {
			ms[i] = message(int64(i+1), "order", fmt.Sprintf("key-%d", i), `{}`)
		}
		errs := s.SendBatch(context.Background(), ms)
		failed := map[int64]bool{}
		for i, err := range errs {
			if err != nil {
				require.ErrorIs(t, err, kerr.UnknownServerError)
				require.False(t, relay.IsPermanent(err))
				failed[ms[i].ID] = true
			}
		}
		require.NotEmpty(t, failed, "the keys of partition 2 failed")
		recs := consume(t, c, "orders")
		require.Len(t, recs, len(ms)-len(failed))
		for _, r := range recs {
			require.NotEqual(t, int32(2), r.Partition)
			require.False(t, failed[recordID(t, r)], "a failed message is not on the topic")
		}
	})

	t.Run("Empty", func(t *testing.T) {
		t.Parallel()
		s := newSender(t, kafka.Config{Type: "order", Brokers: []string{"127.0.0.1:1"}})
		require.Empty(t, s.SendBatch(context.Background(), nil))
	})

	t.Run("CallerGivesUp", func(t *testing.T) {
		t.Parallel()
		s := newSender(t, kafka.Config{Type: "order", Topic: "orders",
			Brokers: []string{fmt.Sprintf("127.0.0.1:%d", freePort(t))}})
		ctx, cancel := context.WithTimeoutCause(context.Background(), 200*time.Millisecond, errCallerGaveUp)
		defer cancel()
		started := time.Now()
		errs := s.SendBatch(ctx, []relay.Message{message(1, "order", "a", `{}`), message(2, "order", "b", `{}`)})
		require.Less(t, time.Since(started), 5*time.Second, "SendBatch returns soon after its ctx ends")
		for _, err := range errs {
			require.ErrorIs(t, err, errCallerGaveUp)
			require.False(t, relay.IsPermanent(err))
		}
	})
}

var errCallerGaveUp = fmt.Errorf("the caller gave up")
