package main

import (
	"fmt"
	"math/rand/v2"
)

// The two message types the soak writes and its replicas deliver, each to a
// path of its own on the receiver. The receiver treats them alike; they are
// two so that one can be paused while the other drains, and a key's order
// is one across both.
const (
	typeOrder  = "order"
	typeLedger = "ledger"
)

// msgTypes are the types, in the order the replicas register their senders.
var msgTypes = []string{typeOrder, typeLedger}

// keyOf returns a key of typ among n keys k0 … k(n-1): order writes the
// first two thirds and ledger the last two thirds, so that the middle third
// gets both types.
func keyOf(rng *rand.Rand, n int, typ string) string {
	lo, hi := 0, n-n/3
	if typ == typeLedger {
		lo, hi = n/3, n
	}
	return fmt.Sprintf("k%d", lo+rng.IntN(hi-lo))
}
