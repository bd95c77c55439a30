// Command echo is an endpoint to point examples/service at before you have
// your own: it prints every request it receives, with the relay's headers and
// the body, and answers 204 No Content, which the relay records as delivered.
//
//	go run ./examples/echo                  # listens on 127.0.0.1:8080
//	go run ./examples/echo -addr :9000
//
// Answer with another status to see what the relay does with it (a 4xx marks
// the message dead at once, a 5xx is retried with backoff):
//
//	go run ./examples/echo -status 503
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"
)

// headers are the ones the relay's HTTPSender sets, in the order printed.
var headers = []string{"Content-Type", "Idempotency-Key", "Relay-Message-Key", "Relay-Message-Id", "Relay-Message-Type", "Relay-Attempt"}

func main() {
	addr := flag.String("addr", "127.0.0.1:8080", "the address to listen on")
	status := flag.Int("status", http.StatusNoContent, "the status to answer every request with")
	flag.Parse()
	if http.StatusText(*status) == "" {
		fmt.Fprintf(os.Stderr, "-status %d is not an HTTP status\n", *status)
		os.Exit(2)
	}
	srv := &http.Server{Addr: *addr, Handler: echo(os.Stdout, *status), ReadHeaderTimeout: 10 * time.Second}
	fmt.Fprintf(os.Stderr, "Listening on http://%s, answering %d %s to every request.\n", *addr, *status, http.StatusText(*status))
	if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// echo returns a handler that prints each request to out and answers status.
func echo(out io.Writer, status int) http.Handler {
	var mu sync.Mutex
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20))
		if err != nil {
			http.Error(w, "the body must be at most 1 MiB", http.StatusRequestEntityTooLarge)
			return
		}
		var b strings.Builder
		fmt.Fprintf(&b, "%s %s\n", r.Method, r.URL.RequestURI())
		for _, h := range headers {
			if v := r.Header.Get(h); v != "" {
				fmt.Fprintf(&b, "  %s: %s\n", h, v)
			}
		}
		fmt.Fprintf(&b, "  %s\n-> %d %s\n", body, status, http.StatusText(status))
		mu.Lock()
		_, _ = io.WriteString(out, b.String())
		mu.Unlock()
		w.WriteHeader(status)
	})
}
