package main

import (
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// delivery is one request the receiver accepted.
type delivery struct {
	id      int64
	typ     string    // its type (the URL's first segment)
	key     string    // its natural key (the URL's last segment)
	replica int       // the replica that sent it (the Soak-Replica header)
	at      time.Time // when the request arrived
}

// receiver is the destination: an HTTP server on 127.0.0.1 that accepts
// PUT /{type}/{key} for each of the soak's types, spends delay on each
// request as a real service would, and records every delivery by its
// Relay-Message-Id header. A real receiver would deduplicate by the
// Idempotency-Key and drop a key's stale messages by Relay-Message-Id
// (docs/receivers.md); this one counts. While told to fail a type (fail), it
// answers that type's requests 503 and records nothing.
type receiver struct {
	URL   string
	delay time.Duration
	srv   *http.Server
	done  chan struct{}

	mu         sync.Mutex
	deliveries map[int64][]delivery
	total      int
	failUntil  map[string]time.Time // per type, until when it answers 503
	refused    map[string]int       // per type, the requests answered 503
}

func startReceiver(delay time.Duration) (*receiver, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	rc := &receiver{URL: "http://" + l.Addr().String(), delay: delay, deliveries: map[int64][]delivery{}, done: make(chan struct{}),
		failUntil: map[string]time.Time{}, refused: map[string]int{}}
	mux := http.NewServeMux()
	for _, typ := range msgTypes {
		mux.HandleFunc("PUT /"+typ+"/{key}", func(w http.ResponseWriter, r *http.Request) { rc.put(w, r, typ) })
	}
	rc.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		defer close(rc.done)
		if err := rc.srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			panic(err)
		}
	}()
	return rc, nil
}

func (rc *receiver) put(w http.ResponseWriter, r *http.Request, typ string) {
	at := time.Now()
	rc.mu.Lock()
	failing := at.Before(rc.failUntil[typ])
	if failing {
		rc.refused[typ]++
	}
	rc.mu.Unlock()
	if failing {
		http.Error(w, "soak: the receiver fails "+typ+" on purpose", http.StatusServiceUnavailable)
		return
	}
	id, err := strconv.ParseInt(r.Header.Get("Relay-Message-Id"), 10, 64)
	if err != nil {
		http.Error(w, "missing or bad Relay-Message-Id", http.StatusBadRequest)
		return
	}
	replica, _ := strconv.Atoi(r.Header.Get("Soak-Replica"))
	_, _ = io.Copy(io.Discard, r.Body)
	time.Sleep(rc.delay)
	rc.mu.Lock()
	rc.deliveries[id] = append(rc.deliveries[id], delivery{id: id, typ: typ, key: r.PathValue("key"), replica: replica, at: at})
	rc.total++
	rc.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

// fail makes the receiver answer 503 to each of types for d from now.
func (rc *receiver) fail(types []string, d time.Duration) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	for _, t := range types {
		rc.failUntil[t] = time.Now().Add(d)
	}
}

// refusals returns, per type, the requests answered 503.
func (rc *receiver) refusals() map[string]int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return cloneMap(rc.refused)
}

// counts returns how many distinct messages and how many requests it accepted.
func (rc *receiver) counts() (distinct, total int) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return len(rc.deliveries), rc.total
}

// snapshot returns every delivery, by message id, in arrival order.
func (rc *receiver) snapshot() map[int64][]delivery {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	out := make(map[int64][]delivery, len(rc.deliveries))
	for id, ds := range rc.deliveries {
		out[id] = append([]delivery(nil), ds...)
	}
	return out
}

func (rc *receiver) close() {
	_ = rc.srv.Close()
	<-rc.done
}
