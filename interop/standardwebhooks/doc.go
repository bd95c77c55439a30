// Package standardwebhooks holds the interoperability tests of the relay's
// signatures with the reference implementation of the Standard Webhooks
// specification, its Go library
// (github.com/standard-webhooks/standard-webhooks/libraries/go): the
// reference verifies every request the relay's HTTPSender signs, and the
// inbox accepts what the reference signs and refuses what it refuses.
//
// It is a module of its own so that the core module keeps depending on pgx
// and cron only. Nothing here is meant to be imported.
package standardwebhooks
