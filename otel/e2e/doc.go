// Package e2e proves that a producer's trace context, stored by otelrelay,
// reaches the consumers of a Kafka topic (franz-go's kfake) and of a NATS
// JetStream stream (an embedded nats-server), and that their spans continue
// the relay's send span. It is a module of its own because kfake needs a
// newer Go than the otel module's.
package e2e
