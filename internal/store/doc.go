// Package store is the outbox table as the relay's machinery reads and writes
// it: the rows a pass selects (Row), the outcomes it records, and the errors
// of a database and its pool in an operator's terms. Every statement the
// relay sends lives in the module's SQL files (sql/*.sql), one per concern.
//
// # Failure handling
//
// A connection is taken from the pool within [AcquireTimeout], or the caller
// gets [ErrPoolExhausted] with the pool's size: a starved pool delays work and
// says so, never hangs it. [ConnectionFailed] tells the connection's failure
// (worth one more try on another connection) from the statement's (a refusal,
// never retried).
package store
