// Command console shows the operator's console of a running relay, with one
// command and nothing to set up:
//
//	cd examples/console && go run .
//
// It gets a throwaway PostgreSQL by itself (DATABASE_URL if set, else a fresh
// cluster from the local PostgreSQL binaries: Debian apt-get install -y
// postgresql), creates an outbox table, runs a relay whose "order" messages
// are delivered and whose every third "invoice" is refused for good (so the
// console has dead rows to show and re-queue), writes a few messages, mounts
// the console at /relay/ on an HTTP server on 127.0.0.1 and prints its URL:
// open it in a browser. Ctrl-C stops everything it started (and drops the
// table it created on a DATABASE_URL).
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
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/xadm/relay"
	"github.com/xadm/relay/console"
	"github.com/xadm/relay/internal/testkit/pgserver"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	addr := flag.String("addr", "127.0.0.1:8080", "where the console listens (a free port if that one is taken)")
	table := flag.String("table", "relay_console_example", "the outbox table to create and show")
	flag.Parse()
	err := run(ctx, *addr, *table, os.Stdout, func(string) {})
	if err != nil && !errors.Is(err, context.Canceled) {
		fmt.Fprintln(os.Stderr, "console example:", err)
		os.Exit(1)
	}
}

// run starts everything, calls ready with the console's URL and serves until
// ctx ends.
func run(ctx context.Context, addr, table string, out io.Writer, ready func(url string)) (err error) {
	fmt.Fprintln(out, "Starting PostgreSQL (DATABASE_URL, else the local binaries)…")
	startCtx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	server, err := pgserver.Start(startCtx, "DATABASE_URL")
	cancel()
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, server.Stop()) }()

	pool, err := pgxpool.New(ctx, server.URL)
	if err != nil {
		return err
	}
	defer pool.Close()
	var existed bool
	if err := pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", table).Scan(&existed); err != nil {
		return err
	}
	if err := relay.CreateTable(ctx, pool, table); err != nil {
		return err
	}
	if !existed && server.Kind == "env" {
		defer func() {
			_, dropErr := pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+pgx.Identifier(strings.Split(table, ".")).Sanitize())
			err = errors.Join(err, dropErr)
		}()
	}

	cfg := relay.DefaultConfig()
	cfg.AppName = "console-example"
	cfg.Table = table
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	orders := relay.SenderFunc("order", func(context.Context, relay.Message) error { return nil })
	invoices := relay.SenderFunc("invoice", func(_ context.Context, m relay.Message) error {
		if m.ID%3 == 0 {
			return relay.Permanent(fmt.Errorf("invoice %s: the billing service answers 422 Unprocessable Entity", m.Key))
		}
		return nil
	})
	r, err := relay.New(pool, cfg, orders, invoices)
	if err != nil {
		return err
	}
	for i := 1; i <= 12; i++ {
		typ := "order"
		if i%2 == 0 {
			typ = "invoice"
		}
		m := relay.Outgoing{Type: typ, Key: fmt.Sprintf("%s-%d", typ, i), Payload: fmt.Appendf(nil, `{"n":%d}`, i)}
		if _, err := relay.Enqueue(ctx, pool, table, m); err != nil {
			return err
		}
	}
	if err := r.Start(ctx); err != nil {
		return err
	}
	defer func() { err = errors.Join(err, r.Stop(context.Background())) }()

	admin, err := relay.NewAdmin(pool, cfg)
	if err != nil {
		return err
	}
	c, err := console.New(console.Options{
		Sources: []console.Source{{Admin: admin, Relay: r}},
		Prefix:  "/relay",
		Actions: true,
		// The example listens on 127.0.0.1 only: whoever reaches it may act.
		// A service mounts the console behind its own authentication instead.
		Authorize: func(*http.Request) (string, bool, bool) { return "you", true, true },
	})
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/relay/", c)
	mux.Handle("/{$}", http.RedirectHandler("/relay/", http.StatusFound))

	ln, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintf(out, "%s is taken (%v): listening on a free port instead\n", addr, err)
		if ln, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			return err
		}
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	url := "http://" + ln.Addr().String() + "/relay/"
	fmt.Fprintf(out, "PostgreSQL: %s (%s)\nThe console: %s\nCtrl-C stops it.\n", redact(server.URL), server.Kind, url)
	ready(url)

	select {
	case <-ctx.Done():
	case err := <-served:
		return err
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return srv.Shutdown(shutdownCtx)
}

// redact hides a URL's password.
func redact(u string) string {
	if cfg, err := pgx.ParseConfig(u); err == nil {
		return fmt.Sprintf("%s@%s:%d/%s", cfg.User, cfg.Host, cfg.Port, cfg.Database)
	}
	return "(the URL does not parse)"
}
