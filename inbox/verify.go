package inbox

import (
	"fmt"
	"net/http"
	"time"

	"github.com/xadm/relay/internal/signing"
)

// checkTime is the part of the signature's check that needs no body: the
// signature headers present, once each, and the timestamp within the
// tolerance. It does nothing without [Config.SigningSecrets].
func (ib *Inbox) checkTime(r *http.Request) (signing.Headers, error) {
	if ib.verifier == nil {
		return signing.Headers{}, nil
	}
	sig := signing.FromHTTP(r.Header)
	if err := ib.verifier.CheckTime(sig, time.Now()); err != nil {
		return sig, fmt.Errorf("inbox: %w", err)
	}
	return sig, nil
}

// verify checks the signature of body against the inbox's keys, and that
// the signed Webhook-Id is the Idempotency-Key the inbox deduplicates by:
// otherwise a captured request could be applied again under a new key. A
// missing or repeated Idempotency-Key is left to readRequest's 400.
func (ib *Inbox) verify(r *http.Request, sig signing.Headers, body []byte) error {
	if ib.verifier == nil {
		return nil
	}
	if err := ib.verifier.Verify(sig, body); err != nil {
		return fmt.Errorf("inbox: %w", err)
	}
	if keys := r.Header.Values(headerIdempotencyKey); len(keys) == 1 && keys[0] != sig.ID {
		return fmt.Errorf("inbox: header %s %q is not the signed %s %q: the signature must cover the key the inbox deduplicates by",
			headerIdempotencyKey, keys[0], signing.HeaderID, sig.ID)
	}
	return nil
}
