// Package signing is the Standard Webhooks signature (standardwebhooks.com,
// version 1.0.0) as the relay's HTTPSender makes it and the inbox checks it.
//
// # The scheme
//
// A request carries three headers: webhook-id (the message's idempotency key,
// the same on every attempt), webhook-timestamp (the attempt's send time, in
// Unix seconds) and webhook-signature, a space-separated list of
// "<version>,<base64 signature>", one per signing key, of the content
//
//	<webhook-id>.<webhook-timestamp>.<body, as the raw bytes sent>
//
// Version v1 is HMAC-SHA256 with a shared secret, serialised "whsec_" +
// base64 of 24 to 64 random bytes; v1a is Ed25519, its private key (the
// 32-byte seed) serialised "whsk_" + base64 and its public key "whpk_" +
// base64. Several keys sign at once during a rotation; a verifier accepts a
// request when one signature matches one of its keys and the timestamp is
// within its tolerance of its clock.
//
// # Failure handling
//
// A malformed key is refused when the signer or verifier is built, with an
// error naming the field and the key's index, never the key. Verification
// says which of its checks failed (missing, malformed, outside the
// tolerance, no match), never what the expected signature was.
package signing
