// Command service is a complete service that runs the relay: copy it into
// your own and keep what you need.
//
// It reads its configuration from the environment:
//
//	DATABASE_URL     required. The PostgreSQL URL, in pgx's syntax (pool_max_conns=… is
//	                 honoured, raised if needed to the Concurrency + 2 connections the relay needs).
//	DESTINATION_URL  required. The base URL of the receiving service: a message of type T
//	                 and natural key K is delivered by PUT $DESTINATION_URL/T/K, with the
//	                 message's own id in the Idempotency-Key header and K in Relay-Message-Key
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
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/xadm/relay"
)

// shutdownTimeout bounds the graceful stop. Past it, the sends still in flight
// are cancelled and their rows are sent again by the next elected pass.
const shutdownTimeout = 20 * time.Second

func main() {
	logger := slog.New(slog.NewJSONHandler(os.Stdout, &slog.HandlerOptions{Level: logLevel()}))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, logger); err != nil {
		logger.Error("service stopped", slog.String("error", err.Error()))
		stop()
		os.Exit(1)
	}
	logger.Info("service stopped")
}

func run(ctx context.Context, logger *slog.Logger) error {
	cfg, err := relay.ConfigFromEnv()
	if err != nil {
		return err
	}
	cfg.Logger = logger
	dbURL, err := requireEnv("DATABASE_URL")
	if err != nil {
		return err
	}
	senders, err := httpSenders()
	if err != nil {
		return err
	}

	pc, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return fmt.Errorf("DATABASE_URL: %w", err)
	}
	// The relay needs Concurrency + 2 connections (docs/operations.md): the
	// election holds one for the whole pass, and each message in flight
	// records its outcome on another.
	pc.MaxConns = max(pc.MaxConns, int32(cfg.Concurrency)+2)
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return fmt.Errorf("DATABASE_URL: %w", err)
	}
	defer pool.Close()
	if err := pool.Ping(ctx); err != nil {
		return fmt.Errorf("connect to the database: %w", err)
	}
	if err := relay.CreateTable(ctx, pool, cfg.Table); err != nil {
		return err
	}

	r, err := relay.New(pool, cfg, senders...)
	if err != nil {
		return err
	}
	// Not ctx: a signal must stop the relay gracefully, through Stop, rather
	// than cancel the sends in flight.
	if err := r.Start(context.WithoutCancel(ctx)); err != nil {
		return err
	}
	<-ctx.Done()

	logger.Info("stopping: waiting for the pass in flight", slog.Duration("timeout", shutdownTimeout))
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

// httpSenders returns one HTTP sender per type in RELAY_TYPES, each delivering
// to DESTINATION_URL/<type>/<key>.
func httpSenders() ([]relay.Sender, error) {
	base, err := requireEnv("DESTINATION_URL")
	if err != nil {
		return nil, err
	}
	if u, err := url.Parse(base); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("DESTINATION_URL=%q: want an absolute http or https URL", base)
	}
	types, err := requireEnv("RELAY_TYPES")
	if err != nil {
		return nil, err
	}
	var senders []relay.Sender
	for _, typ := range strings.Split(types, ",") {
		typ = strings.TrimSpace(typ)
		if typ == "" {
			continue
		}
		s, err := relay.NewHTTPSender(relay.HTTPSenderConfig{
			Type: typ,
			URL:  relay.URLWithKey(strings.TrimRight(base, "/") + "/" + url.PathEscape(typ)),
		})
		if err != nil {
			return nil, err
		}
		senders = append(senders, s)
	}
	if len(senders) == 0 {
		return nil, errors.New("RELAY_TYPES names no type")
	}
	return senders, nil
}

func requireEnv(name string) (string, error) {
	v := strings.TrimSpace(os.Getenv(name))
	if v == "" {
		return "", fmt.Errorf("%s is not set", name)
	}
	return v, nil
}

func logLevel() slog.Level {
	var l slog.Level
	if err := l.UnmarshalText([]byte(os.Getenv("LOG_LEVEL"))); err != nil {
		return slog.LevelInfo
	}
	return l
}
