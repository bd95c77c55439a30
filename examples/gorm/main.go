// Command gorm is a service built on GORM that writes its outbox messages
// in the transactions of its business data, with relay.Enqueue and
// relay.EnqueueMany, and the relay that delivers them:
//
//	cd examples/gorm && go run .
//
// It gets a throwaway PostgreSQL by itself (DATABASE_URL if set, else a fresh
// cluster from the local PostgreSQL binaries, removed at the end), places
// three orders, one of which a business rule refuses after its message was
// written, and prints what the relay delivers: the messages of the two
// orders that committed, never one of the order that rolled back.
//
// The part to copy is PlaceOrder. A GORM transaction's tx.Statement.ConnPool
// is its *sql.Tx; relay.FromSQL makes it what Enqueue writes through, so the
// message commits with the order, or not at all. Bun users pass their
// bun.Tx's *sql.Tx (relay.FromSQL(tx.Tx)), sqlx users their *sqlx.Tx.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/xadm/relay"
	"github.com/xadm/relay/internal/testkit/pgserver"
)

// outbox is the example's outbox table (relay.TableDefault in a service of
// your own, or any name: the relay's Config.Table says which).
const outbox = "gorm_example_outbox"

// Order is the business data: an order, written by GORM.
type Order struct {
	ID         string `gorm:"primaryKey"`
	TotalCents int64
}

func (Order) TableName() string { return "gorm_example_orders" }

// Stock is what an order takes from the warehouse; it cannot go below zero.
type Stock struct {
	SKU       string `gorm:"primaryKey"`
	Available int    `gorm:"check:available >= 0"`
}

func (Stock) TableName() string { return "gorm_example_stock" }

// Line is one SKU of an order.
type Line struct {
	SKU      string `json:"sku"`
	Quantity int    `json:"quantity"`
}

// PlaceOrder writes the order, takes its lines from the stock, and writes
// its messages in the same transaction: one to the billing service (type
// "order", keyed by the order) and one per line to the warehouse (type
// "stock", keyed by the SKU), all of them in one statement. If any write
// fails, the transaction rolls back, messages included.
func PlaceOrder(ctx context.Context, db *gorm.DB, o Order, lines []Line) error {
	return db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := tx.Create(&o).Error; err != nil {
			return err
		}
		// The transaction's *sql.Tx: what relay writes through.
		out := relay.FromSQL(tx.Statement.ConnPool)

		payload, err := json.Marshal(map[string]any{"id": o.ID, "total_cents": o.TotalCents, "lines": lines})
		if err != nil {
			return err
		}
		if _, err := relay.Enqueue(ctx, out, outbox, relay.Outgoing{Type: "order", Key: o.ID, Payload: payload}); err != nil {
			return err
		}

		stock := make([]relay.Outgoing, 0, len(lines))
		for _, l := range lines {
			taken := tx.Model(&Stock{}).Where("sku = ?", l.SKU).Update("available", gorm.Expr("available - ?", l.Quantity))
			if taken.Error != nil {
				return fmt.Errorf("take %d of %s: %w", l.Quantity, l.SKU, taken.Error)
			}
			if taken.RowsAffected == 0 {
				return fmt.Errorf("take %d of %s: no such SKU", l.Quantity, l.SKU)
			}
			payload, err := json.Marshal(map[string]any{"order": o.ID, "sku": l.SKU, "taken": l.Quantity})
			if err != nil {
				return err
			}
			stock = append(stock, relay.Outgoing{Type: "stock", Key: l.SKU, Payload: payload})
		}
		_, err = relay.EnqueueMany(ctx, out, outbox, stock)
		return err
	})
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if _, err := run(ctx, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "gorm example:", err)
		os.Exit(1)
	}
}

// run places the orders and returns what the relay delivered: "type key"
// for each message, in the order sent.
func run(ctx context.Context, out io.Writer) (delivered []string, err error) {
	fmt.Fprintln(out, "Starting PostgreSQL (DATABASE_URL, else the local binaries)…")
	srv, err := pgserver.Start(ctx, "DATABASE_URL")
	if err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, srv.Stop()) }()

	// The service's GORM, and the relay's own pgx pool on the same database.
	db, err := gorm.Open(postgres.Open(srv.URL), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		return nil, err
	}
	sqlDB, err := db.DB()
	if err != nil {
		return nil, err
	}
	defer sqlDB.Close()
	pool, err := pgxpool.New(ctx, srv.URL)
	if err != nil {
		return nil, err
	}
	defer pool.Close()

	if err := db.Migrator().DropTable(&Order{}, &Stock{}, outbox); err != nil {
		return nil, err
	}
	if err := db.AutoMigrate(&Order{}, &Stock{}); err != nil {
		return nil, err
	}
	if err := relay.CreateTable(ctx, pool, outbox); err != nil {
		return nil, err
	}
	if err := db.Create([]Stock{{SKU: "sku-a", Available: 10}, {SKU: "sku-b", Available: 5}}).Error; err != nil {
		return nil, err
	}

	// The relay: senders that print what they deliver (an HTTPSender to
	// the billing and warehouse services in a real one).
	var mu sync.Mutex
	arrived := make(chan struct{}, 16)
	deliver := func(_ context.Context, m relay.Message) error {
		mu.Lock()
		delivered = append(delivered, m.Type+" "+m.Key)
		fmt.Fprintf(out, "  delivered %-5s %-8s %s\n", m.Type, m.Key, m.Payload)
		mu.Unlock()
		arrived <- struct{}{}
		return nil
	}
	cfg := relay.DefaultConfig()
	cfg.AppName = "gorm-example"
	cfg.Table = outbox
	cfg.Logger = slog.New(slog.DiscardHandler)
	r, err := relay.New(pool, cfg, relay.SenderFunc("order", deliver), relay.SenderFunc("stock", deliver))
	if err != nil {
		return nil, err
	}
	if err := r.Start(ctx); err != nil {
		return nil, err
	}
	defer func() { err = errors.Join(err, r.Stop(context.WithoutCancel(ctx))) }() // on an early return; a second Stop does nothing

	orders := []struct {
		order Order
		lines []Line
	}{
		{Order{ID: "order-1", TotalCents: 2500}, []Line{{"sku-a", 2}, {"sku-b", 1}}},
		{Order{ID: "order-2", TotalCents: 9900}, []Line{{"sku-a", 1}, {"sku-b", 9}}}, // only 4 of sku-b left
		{Order{ID: "order-3", TotalCents: 1250}, []Line{{"sku-a", 1}}},
	}
	want := 0
	for _, o := range orders {
		if err := PlaceOrder(ctx, db, o.order, o.lines); err != nil {
			mu.Lock() // the relay's senders print beside this loop
			fmt.Fprintf(out, "%s refused, rolled back with its messages: %v\n", o.order.ID, err)
			mu.Unlock()
			continue
		}
		want += 1 + len(o.lines)
		mu.Lock()
		fmt.Fprintf(out, "%s placed: %d messages\n", o.order.ID, 1+len(o.lines))
		mu.Unlock()
	}

	wait := time.NewTimer(30 * time.Second)
	defer wait.Stop()
	for range want {
		select {
		case <-arrived:
		case <-wait.C:
			mu.Lock()
			defer mu.Unlock()
			return nil, fmt.Errorf("the relay delivered %d of %d messages in 30s", len(delivered), want)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	if err := r.Stop(ctx); err != nil { // waits for the pass in flight: every outcome is written
		return nil, err
	}
	var left int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+outbox+" WHERE status <> 'SENT'").Scan(&left); err != nil {
		return nil, err
	}
	fmt.Fprintf(out, "The relay delivered %d messages, none of order-2: %t; rows left to deliver: %d\n",
		len(delivered), !slices.Contains(delivered, "order order-2"), left)
	return delivered, nil
}
