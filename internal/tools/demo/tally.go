package demo

import (
	"strconv"
	"sync"
	"time"
)

// Tally counts the copies of each message a destination received, by
// Relay-Message-Id, with the Relay-Attempt of each copy.
type Tally struct {
	mu       sync.Mutex
	attempts map[int64][]int
	copies   int
	lastNew  time.Time // when a message arrived for the first time, the last time
}

// NewTally returns an empty Tally.
func NewTally() *Tally { return &Tally{attempts: make(map[int64][]int)} }

// Add counts one copy of message id, carrying the headers' values.
func (t *Tally) Add(id, attempt string) {
	n, err := strconv.ParseInt(id, 10, 64)
	if err != nil {
		n = -1 // counted, and never matching a row: the report shows it as lost
	}
	a, _ := strconv.Atoi(attempt)
	t.mu.Lock()
	if len(t.attempts[n]) == 0 {
		t.lastNew = time.Now()
	}
	t.attempts[n] = append(t.attempts[n], a)
	t.copies++
	t.mu.Unlock()
}

// Counts is what a destination saw.
type Counts struct {
	Copies     int // messages received, copies included
	Distinct   int // distinct message ids
	Duplicates int // copies of a message already received
	// Unexplained are the duplicates that carry an attempt number already
	// seen for their message: two replicas sending the same attempt at once
	// (what the election prevents), or a send whose outcome was never recorded.
	// The others are retries after a recorded failure: at-least-once delivery.
	Unexplained int
	LastNew     time.Time // when the last message never seen before arrived
}

// Counts returns what the tally counted so far.
func (t *Tally) Counts() Counts {
	t.mu.Lock()
	defer t.mu.Unlock()
	c := Counts{Copies: t.copies, Distinct: len(t.attempts), Duplicates: t.copies - len(t.attempts), LastNew: t.lastNew}
	for _, as := range t.attempts {
		seen := map[int]bool{}
		for _, a := range as {
			if seen[a] {
				c.Unexplained++
			}
			seen[a] = true
		}
	}
	return c
}

// Received reports whether message id arrived at least once.
func (t *Tally) Received(id int64) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.attempts[id]) > 0
}
