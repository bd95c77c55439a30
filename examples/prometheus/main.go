// Command prometheus shows the Prometheus adapter in place: a relay whose
// Observer is a [relayprom.Observer], beside a [relayprom.TableCollector] of
// its table, and their metrics served on /metrics, for the alerting rules of
// relayprom/alerts.yml.
//
//	DATABASE_URL=postgres://... RELAY_APP_NAME=billing go run .
//	curl localhost:9090/metrics
//
// With -collector-only it runs no relay: only the table's collector, so that
// an outage of every relay of the app still pages (its relays' processes
// export nothing then).
package main

import (
	"context"
	"errors"
	"flag"
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
	collectorOnly := flag.Bool("collector-only", false, "run no relay: export the table's metrics only")
	flag.Parse()
	if err := relay.CreateTable(ctx, pool, cfg.Table); err != nil {
		return err
	}

	// The registration: the table's collector (what the alerts page on),
	// and an Observer of the relay's passes, set as the relay's Observer.
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	admin, err := relay.NewAdmin(pool, cfg)
	if err != nil {
		return err
	}
	reg.MustRegister(relayprom.NewTableCollector(admin, relayprom.TableOptions{Every: cfg.Interval}))
	if *collectorOnly {
		return serve(ctx, reg)
	}
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
	return serve(ctx, reg)
}

// serve serves reg's metrics on :9090/metrics until ctx ends.
func serve(ctx context.Context, reg *prometheus.Registry) error {
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
