// Command receiver is a receiving service built on the inbox: point
// examples/service at it instead of examples/echo, and each message is
// applied once to a table of its own, whatever the relay re-delivers.
//
//	DATABASE_URL=postgres://… go run ./examples/receiver   # listens on 127.0.0.1:8080
//	DATABASE_URL=postgres://… go run ./examples/receiver -addr :9000
//
// It serves PUT /relay/{type}/{key}, where examples/service sends, and keeps
// the latest state of each (type, key) in the table relay_receiver_state of
// DATABASE_URL (its own database; the outbox's will do for a try): the
// message's payload, its Relay-Message-Id and when it was applied. The inbox
// (github.com/xadm/relay/inbox) records each message in the same transaction,
// so a duplicate and a stale message change nothing, and answers the relay:
// 204 for applied, duplicate and stale, 422 for a body that is not JSON, 400
// or 413 for a request it cannot read, 503 while its database is away. It
// prints one line per request:
//
//	PUT /relay/order/order-2  public.mensagem_m2m/1  attempt 1  -> 204 applied
//
// A job of the relay's Scheduler deletes the inbox's records older than
// -retention, hourly, on one replica of the receiver at a time.
//
// It creates its tables if they are missing, and stops gracefully on SIGINT
// or SIGTERM. Exit codes: 0 after a clean stop, 1 when it cannot start, 2 for
// bad flags or environment.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/xadm/relay"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:8080", "the address to listen on")
	retention := flag.Duration("retention", 7*24*time.Hour, "how long the inbox keeps a message's record")
	flag.Parse()
	dbURL := os.Getenv("DATABASE_URL")
	if dbURL == "" {
		fmt.Fprintln(os.Stderr, "receiver: DATABASE_URL is not set: the receiver's own PostgreSQL, as in postgres://postgres:secret@localhost:5432/postgres")
		os.Exit(2)
	}
	if *retention <= 0 {
		fmt.Fprintf(os.Stderr, "receiver: -retention must be positive, got %s\n", *retention)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "receiver:", err)
		os.Exit(1)
	}
	if err := run(ctx, ln, dbURL, *retention, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "receiver:", err)
		os.Exit(1)
	}
}

// run serves ln until ctx ends, then stops gracefully.
func run(ctx context.Context, ln net.Listener, dbURL string, retention time.Duration, out, logs io.Writer) error {
	defer ln.Close()
	logger := slog.New(slog.NewTextHandler(logs, nil))
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return fmt.Errorf("DATABASE_URL: %w", err)
	}
	defer pool.Close()
	rc, err := newReceiver(ctx, pool, logger, out)
	if err != nil {
		return err
	}

	sched, err := relay.NewScheduler(pool, relay.SchedulerConfig{Logger: logger})
	if err != nil {
		return err
	}
	if err := sched.Add("relay_receiver_inbox_retention", "@hourly", rc.inbox.RetentionJob(retention)); err != nil {
		return err
	}
	if err := sched.Start(context.WithoutCancel(ctx)); err != nil {
		return err
	}

	srv := &http.Server{Handler: rc.routes(), ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	fmt.Fprintf(logs, "Listening on http://%s: PUT /relay/{type}/{key}, each message applied once to relay_receiver_state.\n", ln.Addr())

	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-served:
	}
	stopCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = srv.Shutdown(stopCtx) // lets the requests in flight finish their transactions
	if serveErr == nil {
		serveErr = <-served
	}
	if errors.Is(serveErr, http.ErrServerClosed) {
		serveErr = nil
	}
	return errors.Join(serveErr, err, sched.Stop(stopCtx))
}
