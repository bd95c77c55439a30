package kafka

import (
	"errors"

	"github.com/twmb/franz-go/pkg/kerr"
)

// permanentErrors are the broker's answers that no retry of the same record
// to the same topic can change: the record is too large for the topic, the
// topic does not exist (and the client may not create it) or its name is
// invalid, the broker refused the record itself, or the client's principal
// is not authorised to write.
var permanentErrors = []error{
	kerr.MessageTooLarge,
	kerr.RecordListTooLarge,
	kerr.InvalidRecord,
	kerr.UnknownTopicOrPartition,
	kerr.UnknownTopicID,
	kerr.InvalidTopicException,
	kerr.TopicAuthorizationFailed,
	kerr.ClusterAuthorizationFailed,
	kerr.TransactionalIDAuthorizationFailed,
}

// PermanentError reports whether err, an error of a produce, is one that
// retrying cannot fix; it is the default of [Config.Permanent]. It is true for
//
//   - kerr.MessageTooLarge and kerr.RecordListTooLarge: the record is larger
//     than the client's batch limit (kgo.ProducerBatchMaxBytes, 1,000,012
//     bytes by default) or the topic's max.message.bytes;
//   - kerr.UnknownTopicOrPartition and kerr.UnknownTopicID: the topic does not
//     exist and the client may not create it (kgo fails the record with it
//     after kgo.UnknownTopicRetries metadata loads, 4 by default);
//   - kerr.InvalidTopicException and kerr.InvalidRecord: the broker refuses
//     the topic's name or the record itself;
//   - kerr.TopicAuthorizationFailed, kerr.ClusterAuthorizationFailed and
//     kerr.TransactionalIDAuthorizationFailed: an ACL denies the write.
//
// Everything else is retried by the relay: brokers down or unreachable, the
// sender's [Config.Timeout] and the relay's SendTimeout, leader elections,
// not enough in-sync replicas, throttling, a closed client, and failed SASL
// authentication (a credential rotation must not kill rows).
func PermanentError(err error) bool {
	for _, target := range permanentErrors {
		if errors.Is(err, target) {
			return true
		}
	}
	return false
}
