package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
)

// The two message types the soak writes and its replicas deliver, each to a
// path of its own on the receiver.
const (
	// typeOrder carries a key's whole state: the receiver keeps each key's
	// newest, with the inbox's stale-drop.
	typeOrder = "order"
	// typeLedger carries an amount: the receiver adds it to its key's sum,
	// with the inbox's KeepStale. Every message must take effect exactly
	// once; none may be dropped as stale.
	typeLedger = "ledger"
)

// msgTypes are the types, in the order the relays register their senders.
var msgTypes = []string{typeOrder, typeLedger}

// message is one message the producer committed.
type message struct {
	typ    string
	key    string
	amount int64 // a ledger message's amount; 0 for order
}

// keySpace says which keys each type writes: of the n keys k0 … k(n-1),
// order writes the first two thirds and ledger the last two thirds, so that
// the middle third gets both types and their per-key order is one.
type keySpace struct{ n int }

// pick returns a key of typ.
func (ks keySpace) pick(rng *rand.Rand, typ string) string {
	lo, hi := ks.bounds(typ)
	return fmt.Sprintf("k%d", lo+rng.IntN(hi-lo))
}

// bounds returns typ's keys: from lo up to hi, hi excluded.
func (ks keySpace) bounds(typ string) (lo, hi int) {
	if typ == typeOrder {
		return 0, ks.n - ks.n/3
	}
	return ks.n / 3, ks.n
}

// newMessage returns the n-th message of typ with its payload: order's
// counts, ledger's is a random amount, never 0, so that a lost or doubled
// effect moves the key's sum.
func newMessage(rng *rand.Rand, ks keySpace, typ string, n int) (message, []byte) {
	m := message{typ: typ, key: ks.pick(rng, typ)}
	if typ == typeOrder {
		return m, fmt.Appendf(nil, `{"n": %d}`, n)
	}
	m.amount = rng.Int64N(1999) - 999
	if m.amount >= 0 {
		m.amount++
	}
	return m, fmt.Appendf(nil, `{"n": %d, "amount": %d}`, n, m.amount)
}

// ledgerAmount reads a ledger message's amount from its body.
func ledgerAmount(body []byte) (int64, error) {
	var p struct {
		Amount *int64 `json:"amount"`
	}
	if err := json.Unmarshal(body, &p); err != nil {
		return 0, fmt.Errorf("ledger body: %w", err)
	}
	if p.Amount == nil {
		return 0, errors.New("ledger body: no amount")
	}
	return *p.Amount, nil
}
