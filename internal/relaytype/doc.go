// Package relaytype holds the words every layer of the relay shares: what
// became of a message (Outcome), a paused type (PausedType), a type's stuck
// Sends (StuckSends). It imports nothing of the module, so the engine
// (internal/pass), the relay's own session (internal/session) and the root
// all use the same types, and the root names them in its public API as
// aliases (relay.Outcome, relay.PausedType, relay.StuckSends), as River's
// rivertype does.
//
// Named relaytype rather than types: in this module a "type" is a message
// type, the key of a Sender.
package relaytype
