package relay

import (
	"slices"
	"time"

	"github.com/xadm/relay/internal/session"
)

// This file is one type, one app as the relay applies it (decision 0043):
// internal/session's ownership.go decides, on the presence session of a
// started relay, which of its types another app's live relays already
// deliver on its table; the relay leaves those out of every select and of
// the idle poll, so that the engine never sees their rows, and takes them
// back when the claim does.

// YieldedType is a message type a started relay has a sender for and does
// not deliver, because live relays of another app already deliver it on the
// same table (docs/decisions/0043-alerting-and-ownership.md): it takes the type
// over once they have all stopped.
type YieldedType struct {
	Type  string
	App   string    // the other app
	Since time.Time // since when this relay yields it
}

// yielded are the types this relay does not deliver now.
func (r *Relay) yielded() []YieldedType {
	ys := r.presence.Ownership().Yielded()
	if len(ys) == 0 {
		return nil
	}
	out := make([]YieldedType, len(ys))
	for i, y := range ys {
		out[i] = YieldedType(y)
	}
	return out
}

// sendable is the lanes' sendable types without those yielded: the idle
// poll's.
func (r *Relay) sendable() []string {
	types := r.runner.Lanes().Sendable()
	ys := r.presence.Ownership().Yielded()
	if len(ys) == 0 {
		return types
	}
	return slices.DeleteFunc(types, func(t string) bool {
		return slices.ContainsFunc(ys, func(y session.Yield) bool { return y.Type == t })
	})
}
