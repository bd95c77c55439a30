package e2e_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"github.com/twmb/franz-go/pkg/sasl/plain"

	"github.com/xadm/relay"
	"github.com/xadm/relay/kafka"
)

// TestPermanentErrors has a real broker refuse records in each way that
// retrying cannot fix, and checks that Send says so with relay.Permanent,
// wrapping the broker's own error.
func TestPermanentErrors(t *testing.T) {
	t.Parallel()
	c := newCluster(t, kfake.SeedTopics(2, "orders"))
	require.NoError(t, c.CreateTopic("small", 1, map[string]string{"max.message.bytes": "4000"}))
	send := func(t *testing.T, cfg kafka.Config, payload string) error {
		t.Helper()
		cfg.Type = "order"
		cfg.Timeout = waitLimit // the outcome must be the broker's answer, never the Timeout
		if cfg.Client == nil {
			cfg.Brokers = c.ListenAddrs()
		}
		err := newSender(t, cfg).Send(context.Background(), message(1, "order", "key-1", payload))
		require.Error(t, err)
		t.Log(err)
		return err
	}

	t.Run("LargerThanTheClientTakes", func(t *testing.T) {
		t.Parallel()
		// kgo refuses a record larger than one batch (1,000,012 bytes) itself.
		err := send(t, kafka.Config{Topic: "orders"}, `"`+randomText(1_100_000)+`"`)
		require.True(t, relay.IsPermanent(err))
		require.ErrorIs(t, err, kerr.MessageTooLarge)
	})
	t.Run("LargerThanTheTopicTakes", func(t *testing.T) {
		t.Parallel()
		err := send(t, kafka.Config{Topic: "small"}, `"`+randomText(6000)+`"`)
		require.True(t, relay.IsPermanent(err))
		require.ErrorIs(t, err, kerr.MessageTooLarge)
	})
	t.Run("UnknownTopic", func(t *testing.T) {
		t.Parallel()
		// kfake, like Kafka, creates no topic unless asked, and kgo asks only
		// with kgo.AllowAutoTopicCreation.
		err := send(t, kafka.Config{Topic: "nowhere"}, `{}`)
		require.True(t, relay.IsPermanent(err))
		require.ErrorIs(t, err, kerr.UnknownTopicOrPartition)
		require.Nil(t, c.TopicInfo("nowhere"), "no topic created")
	})
	t.Run("UnknownTopicCreatedWhenAllowed", func(t *testing.T) {
		t.Parallel()
		auto := newCluster(t, kfake.AllowAutoTopicCreation())
		s := newSender(t, kafka.Config{Type: "order", Topic: "created-on-demand", Brokers: auto.ListenAddrs(),
			Options: []kgo.Opt{kgo.AllowAutoTopicCreation()}, Timeout: waitLimit})
		require.NoError(t, s.Send(context.Background(), message(1, "order", "key-1", `{}`)))
		require.NotNil(t, auto.TopicInfo("created-on-demand"))
	})
}

// TestAuthorizationErrors has a broker with ACLs refuse a principal the
// write: permanent. A wrong password is not: it is the client's
// configuration, which an operator fixes, not the message's fault.
func TestAuthorizationErrors(t *testing.T) {
	t.Parallel()
	describe := kfake.ACL{Resource: kmsg.ACLResourceTypeTopic, Name: "orders", Pattern: kmsg.ACLResourcePatternTypeLiteral,
		Operation: kmsg.ACLOperationDescribe, Allow: true}
	idempotent := kfake.ACL{Resource: kmsg.ACLResourceTypeCluster, Name: "kafka-cluster", Pattern: kmsg.ACLResourcePatternTypeLiteral,
		Operation: kmsg.ACLOperationIdempotentWrite, Allow: true}
	c := newCluster(t, kfake.SeedTopics(1, "orders"), kfake.EnableSASL(), kfake.EnableACLs(),
		kfake.Superuser("PLAIN", "admin", "admin"),
		kfake.User("PLAIN", "reader", "secret", describe, idempotent))
	as := func(user, pass string, timeout time.Duration) kafka.Config {
		return kafka.Config{Type: "order", Topic: "orders", Brokers: c.ListenAddrs(), Timeout: timeout,
			Options: []kgo.Opt{kgo.SASL(plain.Auth{User: user, Pass: pass}.AsMechanism())}}
	}

	err := newSender(t, as("admin", "admin", waitLimit)).Send(context.Background(), message(1, "order", "key-1", `{}`))
	require.NoError(t, err, "the superuser writes")

	err = newSender(t, as("reader", "secret", waitLimit)).Send(context.Background(), message(2, "order", "key-1", `{}`))
	t.Log(err)
	require.True(t, relay.IsPermanent(err), "%v", err)
	require.True(t, errors.Is(err, kerr.TopicAuthorizationFailed) || errors.Is(err, kerr.ClusterAuthorizationFailed), "%v", err)

	// kgo keeps trying to authenticate until the sender's Timeout.
	err = newSender(t, as("admin", "planted-wrong-password", 2*time.Second)).Send(context.Background(), message(3, "order", "key-1", `{}`))
	t.Log(err)
	require.Error(t, err)
	require.False(t, relay.IsPermanent(err), "%v", err)
	require.NotContains(t, err.Error(), "planted-wrong-password", "no SASL password in an error (docs/security.md)")
}

// TestRetryableErrors checks that what passes, a broker down or one that
// refuses for now, is a plain error: the relay retries it with backoff.
func TestRetryableErrors(t *testing.T) {
	t.Parallel()
	send := func(t *testing.T, brokers []string, timeout time.Duration) error {
		t.Helper()
		s := newSender(t, kafka.Config{Type: "order", Topic: "orders", Brokers: brokers, Timeout: timeout})
		err := s.Send(context.Background(), message(1, "order", "key-1", `{}`))
		require.Error(t, err)
		require.False(t, relay.IsPermanent(err), "%v", err)
		t.Log(err)
		return err
	}

	t.Run("BrokerDown", func(t *testing.T) {
		t.Parallel()
		// The sender's Timeout ends the wait, or kgo gives up on the record
		// after failed dials: both say the broker refused.
		err := send(t, []string{fmt.Sprintf("127.0.0.1:%d", freePort(t))}, time.Second)
		require.ErrorContains(t, err, "connection refused")
	})
	for _, refusal := range []*kerr.Error{kerr.NotEnoughReplicas, kerr.NotLeaderForPartition, kerr.RequestTimedOut,
		kerr.ThrottlingQuotaExceeded, kerr.UnknownServerError} {
		t.Run("Refused"+refusal.Message, func(t *testing.T) {
			t.Parallel()
			c := newCluster(t, kfake.SeedTopics(1, "orders"))
			c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Topic: "orders", Err: refusal, Count: -1})
			if refusal.Retriable {
				// kgo retries these itself, until the sender's Timeout.
				err := send(t, c.ListenAddrs(), 500*time.Millisecond)
				require.ErrorContains(t, err, "no acknowledgement from the brokers within 500ms")
				return
			}
			// kgo gives up at once on what Kafka calls not retriable; the
			// relay still retries it.
			err := send(t, c.ListenAddrs(), waitLimit)
			require.ErrorIs(t, err, refusal)
		})
	}
}
