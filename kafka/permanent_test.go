package kafka

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// TestPermanentError checks the default classification on the real values
// kerr and kgo return, bare and wrapped as the sender wraps them. The broker
// tests in kafka/e2e see the same values come back from kfake.
func TestPermanentError(t *testing.T) {
	permanent := []error{
		kerr.MessageTooLarge,
		fmt.Errorf("%w (uncompressed_bytes=%d)", kerr.MessageTooLarge, 2_000_000), // as kgo refuses a record itself
		kerr.RecordListTooLarge,
		kerr.InvalidRecord,
		kerr.UnknownTopicOrPartition,
		kerr.UnknownTopicID,
		kerr.InvalidTopicException,
		kerr.TopicAuthorizationFailed,
		kerr.ClusterAuthorizationFailed,
		kerr.TransactionalIDAuthorizationFailed,
	}
	retried := []error{
		kerr.NotEnoughReplicas,
		kerr.NotEnoughReplicasAfterAppend,
		kerr.NotLeaderForPartition,
		kerr.LeaderNotAvailable,
		kerr.RequestTimedOut,
		kerr.NetworkException,
		kerr.BrokerNotAvailable,
		kerr.CorruptMessage,
		kerr.ThrottlingQuotaExceeded,
		kerr.UnknownServerError,
		kerr.OutOfOrderSequenceNumber,
		kerr.UnknownProducerID,
		kerr.InvalidProducerEpoch,
		kerr.SaslAuthenticationFailed, // a credential rotation must not kill rows
		kgo.ErrRecordTimeout,
		kgo.ErrRecordRetries,
		kgo.ErrClientClosed,
		kgo.ErrMaxBuffered,
		kgo.ErrAborting,
		context.DeadlineExceeded,
		context.Canceled,
		io.EOF,
		&net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED},
		errors.New("something else"),
	}
	for _, err := range permanent {
		for _, e := range []error{err, fmt.Errorf("kafka: produce to topic %q: %w", "orders", err)} {
			if !PermanentError(e) {
				t.Errorf("PermanentError(%v) = false, want true", e)
			}
		}
	}
	for _, err := range retried {
		for _, e := range []error{err, fmt.Errorf("kafka: produce to topic %q: %w", "orders", err)} {
			if PermanentError(e) {
				t.Errorf("PermanentError(%v) = true, want false", e)
			}
		}
	}
	if PermanentError(nil) {
		t.Error("PermanentError(nil) = true")
	}
}
