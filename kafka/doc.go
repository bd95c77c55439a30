// Package kafka delivers relay messages to Kafka.
package kafka
