// Command service is a complete service that runs the relay: copy it into
// your own and keep what you need.
//
// It reads its configuration from the environment:
//
//	DATABASE_URL     required. The PostgreSQL URL, in pgx's syntax (pool_max_conns=… is
//	                 honoured, raised if needed to the Concurrency + 2 connections the relay needs).
//	DESTINATION_URL  required. The base URL of the receiving service: a message of type T
//	                 and natural key K is delivered by PUT $DESTINATION_URL/T/K (each
//	                 path-escaped), the payload as the JSON body, with the headers
//	                 Idempotency-Key (this one message), Relay-Message-Key (K),
//	                 Relay-Message-Id, Relay-Message-Type and Relay-Attempt
//	                 (docs/receivers.md: what the receiver must do with them).
//	RELAY_TYPES      required. The message types this service delivers, comma-separated
//	                 ("order,invoice"). The relay drains only these types.
//	RELAY_*          The relay's settings, read by relay.ConfigFromEnv, among them
//	                 RELAY_APP_NAME (names the election: the same on every replica of
//	                 the service, and on its JVM relay), RELAY_TABLE, RELAY_INTERVAL,
//	                 RELAY_CONCURRENCY and the escape hatch RELAY_CLUSTER_LOCK=false.
//	                 The README's configuration table lists them all.
//	LOG_LEVEL        debug, info (the default), warn or error.
//
// A variable that is missing or malformed stops it before it starts, with one
// message on stderr that names every such variable at once.
//
// It logs JSON lines to stdout. It creates the outbox table if it is missing,
// starts the relay and runs until SIGINT or SIGTERM; then it stops the relay
// gracefully: no new message starts, the messages in flight finish and their
// outcomes are recorded, the election is released. That takes at most
// shutdownTimeout, which fits within Kubernetes' default grace period of 30s.
//
// Exit codes: 0 after a clean shutdown; 1 when the configuration is invalid,
// the database cannot be reached, or the relay did not stop within shutdownTimeout.
//
// In a real service the relay runs next to the service's own work (an HTTP
// server, consumers); start it after them and stop it before them, as here.
package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/xadm/relay"
)

// shutdownTimeout bounds the graceful stop. Past it, the sends still in flight
// are cancelled and their rows are sent again by the next elected pass.
const shutdownTimeout = 20 * time.Second

func main() {
	cfg, err := loadConfig()
	if err != nil {
		// Plain text, before any JSON log line: a person reads this one.
		fmt.Fprintln(os.Stderr, "service:", err)
		os.Exit(1)
	}
	logger := slog.New(slog.NewJSONHandler(os.Stdout, &slog.HandlerOptions{Level: cfg.logLevel}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, logger, cfg); err != nil {
		logger.Error("service stopped", slog.String("error", err.Error()))
		stop()
		os.Exit(1)
	}
	logger.Info("service stopped")
}

// run connects to the database, creates the outbox table if it is missing and
// runs the relay until ctx ends; then it stops the relay gracefully.
func run(ctx context.Context, logger *slog.Logger, cfg config) error {
	cfg.relay.Logger = logger
	pool, err := pgxpool.NewWithConfig(ctx, cfg.pool)
	if err != nil {
		return fmt.Errorf("DATABASE_URL: %w", err)
	}
	defer pool.Close()
	if err := pool.Ping(ctx); err != nil {
		return fmt.Errorf("connect to the database (DATABASE_URL): %w", err)
	}
	if err := relay.CreateTable(ctx, pool, cfg.relay.Table); err != nil {
		return err
	}

	r, err := relay.New(pool, cfg.relay, cfg.senders...)
	if err != nil {
		return err
	}
	// Not ctx: a signal must stop the relay gracefully, through Stop, rather
	// than cancel the sends in flight.
	if err := r.Start(context.WithoutCancel(ctx)); err != nil {
		return err
	}
	logger.Info("delivering", slog.String("destination", cfg.destination+"/<type>/<key>"),
		slog.String("app", cfg.relay.AppName), slog.String("table", cfg.relay.Table))
	<-ctx.Done()

	logger.Info("stopping: waiting for the pass in flight", slog.String("timeout", shutdownTimeout.String()))
	stopCtx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	if err := r.Stop(stopCtx); err != nil {
		return err
	}
	st := r.Stats()
	logger.Info("relay stopped", slog.Int64("sent", st.Sent), slog.Int64("failed", st.Failed),
		slog.Int64("dead", st.Dead), slog.Int64("passes_run", st.PassesElected), slog.Int64("passes_coalesced", st.PassesCoalesced))
	return nil
}
