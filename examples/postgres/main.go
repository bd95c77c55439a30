// Command postgres runs a throwaway PostgreSQL for trying the relay, the way
// the demo and the tests get theirs, and prints its DATABASE_URL:
//
//	go run ./examples/postgres
//
// It uses the local PostgreSQL server binaries (Debian: apt-get install -y postgresql; it starts a cluster
// of its own from them, nothing needs to be running). The server lives until
// Ctrl-C, which removes it with its data: it is for trying things out, with
// durability off for speed, never for data you want to keep.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/xadm/relay/internal/testkit/pgserver"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	fmt.Fprintln(os.Stderr, "Starting a throwaway PostgreSQL from the local binaries…")
	startCtx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	server, err := pgserver.Start(startCtx, "")
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Fprintf(os.Stderr, "PostgreSQL is ready (%s). In another terminal:\n\n", server.Kind)
	fmt.Printf("export DATABASE_URL='%s'\n\n", server.URL)
	fmt.Fprintln(os.Stderr, "Ctrl-C stops it and removes its data.")
	<-ctx.Done()
	if err := server.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "stopping PostgreSQL:", err)
		os.Exit(1)
	}
	fmt.Fprintln(os.Stderr, "PostgreSQL stopped and removed.")
}
