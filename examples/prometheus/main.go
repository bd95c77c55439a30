// Command prometheus shows the Prometheus adapter in place: a relay whose
// Observer is a [relayprom.Observer], and its metrics served on /metrics.
//
//	DATABASE_URL=postgres://... RELAY_APP_NAME=billing go run .
//	curl localhost:9090/metrics
package main

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/xadm/relay"
	"github.com/xadm/relay/examples/prometheus/relayprom"
)

func main() {
	if err := run(); err != nil {
		slog.Error("prometheus example", "error", err)
		os.Exit(1)
	}
}

func run() error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		return err
	}
	defer pool.Close()
	cfg, err := relay.ConfigFromEnv()
	if err != nil {
		return err
	}
	if err := relay.CreateTable(ctx, pool, cfg.Table); err != nil {
		return err
	}

	// The registration: one collector, set as the relay's Observer.
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	obs := relayprom.NewObserver(prometheus.Labels{"app": cfg.AppName})
	reg.MustRegister(obs)
	cfg.Observer = obs

	orders := relay.SenderFunc("order", func(ctx context.Context, m relay.Message) error {
		slog.InfoContext(ctx, "deliver", "id", m.ID, "key", m.Key) // a real service PUTs it somewhere
		return nil
	})
	r, err := relay.New(pool, cfg, orders)
	if err != nil {
		return err
	}
	if err := r.Start(ctx); err != nil {
		return err
	}
	defer func() { _ = r.Stop(context.Background()) }()

	srv := &http.Server{Addr: ":9090", Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}()
	if err := srv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
