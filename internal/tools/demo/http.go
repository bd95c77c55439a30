package demo

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/xadm/relay"
)

// httpDest is an HTTP receiver on 127.0.0.1 that takes PUT /orders/{key},
// spends delay on each request as a real service would, and counts the
// copies of each message by Relay-Message-Id. A real receiver would
// deduplicate by the Idempotency-Key and drop stale messages
// (docs/receivers.md); this one counts, so that the demo can show every
// duplicate.
type httpDest struct {
	url   string
	delay time.Duration
	srv   *http.Server
	t     *Tally
}

// StartHTTP starts an HTTP receiver on a free port of 127.0.0.1 whose
// senders are relay.HTTPSenders, each request costing it delay.
func StartHTTP(delay time.Duration) func(context.Context) (Destination, error) {
	return func(context.Context) (Destination, error) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		d := &httpDest{url: "http://" + l.Addr().String(), delay: delay, t: NewTally()}
		mux := http.NewServeMux()
		mux.HandleFunc("PUT /orders/{key}", d.put)
		d.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go func() {
			if err := d.srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
				panic(err)
			}
		}()
		return d, nil
	}
}

func (d *httpDest) put(w http.ResponseWriter, r *http.Request) {
	id := r.Header.Get("Relay-Message-Id")
	if id == "" {
		http.Error(w, "missing Relay-Message-Id", http.StatusBadRequest)
		return
	}
	_, _ = io.Copy(io.Discard, r.Body)
	time.Sleep(d.delay) // the destination's own work
	d.t.Add(id, r.Header.Get("Relay-Attempt"))
	w.WriteHeader(http.StatusNoContent)
}

func (d *httpDest) Sender() (relay.Sender, func(), error) {
	s, err := relay.NewHTTPSender(relay.HTTPSenderConfig{Type: OrderType, URL: relay.URLWithKey(d.url + "/orders")})
	if err != nil {
		return nil, nil, err
	}
	return s, func() {}, nil
}

func (d *httpDest) Tally() *Tally { return d.t }

// Close stops the server, waiting up to a few seconds for requests in flight.
func (d *httpDest) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if err := d.srv.Shutdown(ctx); err != nil {
		_ = d.srv.Close()
	}
}
