package main

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"time"
)

// receiver is the destination of the demo: an HTTP server on 127.0.0.1 that
// takes PUT /orders/{key}, spends delay on each request as a real service
// would, and counts the deliveries of each natural key (the Relay-Message-Key
// header the relay's HTTPSender sets; the demo writes one message per key). A
// real receiver would deduplicate by the Idempotency-Key and drop stale
// messages (docs/receivers.md); this one counts, so that the demo can show
// every duplicate.
type receiver struct {
	URL   string // base URL, as in http://127.0.0.1:41234
	delay time.Duration
	srv   *http.Server

	mu       sync.Mutex
	seen     map[string]int // deliveries per natural key
	requests int
	lastNew  time.Time // when a key was received for the first time, the last time
}

// startReceiver listens on a free port of 127.0.0.1 and serves until close.
func startReceiver(delay time.Duration) (*receiver, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	rc := &receiver{URL: "http://" + l.Addr().String(), delay: delay, seen: make(map[string]int)}
	mux := http.NewServeMux()
	mux.HandleFunc("PUT /orders/{key}", rc.put)
	rc.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := rc.srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			panic(err)
		}
	}()
	return rc, nil
}

func (rc *receiver) put(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Relay-Message-Key")
	if key == "" {
		http.Error(w, "missing Relay-Message-Key", http.StatusBadRequest)
		return
	}
	_, _ = io.Copy(io.Discard, r.Body)
	time.Sleep(rc.delay) // the destination's own work
	rc.mu.Lock()
	rc.requests++
	rc.seen[key]++
	if rc.seen[key] == 1 {
		rc.lastNew = time.Now()
	}
	rc.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

// counts is what the receiver saw.
type counts struct {
	requests   int // PUTs answered
	distinct   int // distinct natural keys
	duplicates int // PUTs of a key already received
	lastNew    time.Time
}

func (rc *receiver) counts() counts {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return counts{requests: rc.requests, distinct: len(rc.seen), duplicates: rc.requests - len(rc.seen), lastNew: rc.lastNew}
}

// received reports whether key was delivered at least once.
func (rc *receiver) received(key string) bool {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.seen[key] > 0
}

// close stops the server, waiting up to a few seconds for requests in flight.
func (rc *receiver) close() {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if err := rc.srv.Shutdown(ctx); err != nil {
		_ = rc.srv.Close()
	}
}
