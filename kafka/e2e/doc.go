// Package e2e holds the tests that prove the Kafka sender against an
// in-process Kafka (franz-go's kfake, which speaks the real protocol) and a
// real PostgreSQL, and the command that measures it (cmd/kafkabench).
//
// It is a module of its own because kfake is only published in versions that
// need Go 1.26, while the sender's module, github.com/xadm/relay/kafka, keeps
// building with Go 1.25. Nothing here is meant to be imported.
package e2e
