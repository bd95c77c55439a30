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
	key     string    // its natural key (the URL's last segment)
	replica int       // the replica that sent it (the Soak-Replica header)
	at      time.Time // when the request arrived
}

// receiver is the destination: an HTTP server on 127.0.0.1 that accepts
// PUT /m/{key}, spends delay on each request as a real service would, and
// records every delivery by its Relay-Message-Id header. A real receiver
// would deduplicate by the Idempotency-Key and drop a key's stale messages by
// Relay-Message-Id (docs/receivers.md); this one counts.
type receiver struct {
	URL   string
	delay time.Duration
	srv   *http.Server
	done  chan struct{}

	mu         sync.Mutex
	deliveries map[int64][]delivery
	total      int
}

func startReceiver(delay time.Duration) (*receiver, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	rc := &receiver{URL: "http://" + l.Addr().String(), delay: delay, deliveries: map[int64][]delivery{}, done: make(chan struct{})}
	mux := http.NewServeMux()
	mux.HandleFunc("PUT /m/{key}", rc.put)
	rc.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		defer close(rc.done)
		if err := rc.srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			panic(err)
		}
	}()
	return rc, nil
}

func (rc *receiver) put(w http.ResponseWriter, r *http.Request) {
	at := time.Now()
	id, err := strconv.ParseInt(r.Header.Get("Relay-Message-Id"), 10, 64)
	if err != nil {
		http.Error(w, "missing or bad Relay-Message-Id", http.StatusBadRequest)
		return
	}
	replica, _ := strconv.Atoi(r.Header.Get("Soak-Replica"))
	_, _ = io.Copy(io.Discard, r.Body)
	time.Sleep(rc.delay)
	rc.mu.Lock()
	rc.deliveries[id] = append(rc.deliveries[id], delivery{id: id, key: r.PathValue("key"), replica: replica, at: at})
	rc.total++
	rc.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
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
