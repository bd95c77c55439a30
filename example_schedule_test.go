package relay_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/xadm/relay"
)

// A Scheduler runs jobs on cron specs under the election: every replica adds
// the same jobs under the same keys, and each occurrence runs on one of them,
// once. RetentionJob is a ready-made job that purges the delivered history.
func ExampleScheduler() {
	ctx := context.Background()
	pool := connect(ctx) // the service's *pgxpool.Pool; it needs at least 2 connections
	defer pool.Close()
	cfg := relay.DefaultConfig() // the relays' own Config: the Admin reads their table
	if err := relay.CreateTable(ctx, pool, cfg.Table); err != nil {
		log.Fatal(err)
	}
	admin, err := relay.NewAdmin(pool, cfg)
	if err != nil {
		log.Fatal(err)
	}

	// Specs are read in UTC unless Location says otherwise; the lock of each
	// job is a PostgresGuard's on pool, keyed by hashtext(key).
	s, err := relay.NewScheduler(pool, relay.SchedulerConfig{})
	if err != nil {
		log.Fatal(err)
	}
	// Purge, every hour, the SENT rows delivered more than a week ago.
	if err := s.Add("mensagem_m2m_retention", "@hourly", relay.RetentionJob(admin, 7*24*time.Hour)); err != nil {
		log.Fatal(err)
	}
	ran := make(chan time.Time, 1)
	if err := s.Add("billing_heartbeat", "@every 1s", func(ctx context.Context) error {
		at, _ := relay.ScheduledAt(ctx) // the occurrence, the same on every replica
		select {
		case ran <- at:
		default:
		}
		return nil
	}); err != nil {
		log.Fatal(err)
	}
	fmt.Println(s.Add("billing_report", "0 25 * * *", func(context.Context) error { return nil }))

	if err := s.Start(ctx); err != nil {
		log.Fatal(err)
	}
	at := <-ran
	fmt.Println("the heartbeat's occurrence falls on a whole second:", at.Nanosecond() == 0)
	if err := s.Stop(ctx); err != nil { // waits for the runs in flight
		log.Fatal(err)
	}
	// Output:
	// relay: Scheduler.Add "billing_report": spec "0 25 * * *": end of range (25) above maximum (23): 25
	// the heartbeat's occurrence falls on a whole second: true
}
