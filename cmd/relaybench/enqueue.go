package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/xadm/relay"
	"github.com/xadm/relay/internal/tools/benchkit"
)

// The enqueue scenario (issue 21): the commits per second of 8 concurrent
// producers, each committing one message per transaction (Begin, one
// statement, Commit), written with Enqueue beside a plain single-row INSERT of
// the same columns, and beside the pieces of Enqueue's statement alone, so
// that the table shows where its cost is. The producers share one pool, one
// table and a listener (as a started relay LISTENs), and every round runs each
// variant once, in an order rotated from round to round, for -enqueue-slice:
// slices this short pair the variants under the same load on a shared
// machine. The table shows the medians of -enqueue-rounds rounds, and each
// variant's ratio to the plain INSERT of the same round (the median of those
// ratios).

// lastNotify is when a producer of the variant before issue 21 last notified without the token.
var lastNotify atomic.Int64

var (
	enqueueSlice  = flag.Duration("enqueue-slice", 300*time.Millisecond, "how long each variant runs in each round of the enqueue scenario")
	enqueueRounds = flag.Int("enqueue-rounds", 40, "rounds of the enqueue scenario")
)

// enqueueVariant is one way a producer writes a message.
type enqueueVariant struct {
	name  string
	write func(ctx context.Context, tx pgx.Tx, i int) error
}

// enqueueStatement is Enqueue's insert without the wake-up, as
// sql/producer.sql renders it for relaybench's table, without its RETURNING.
const enqueueStatement = `INSERT INTO "relaybench_enqueue" (direction, type, natural_key, payload, status, attempts)
SELECT 'OUT', $1, $2, $3::jsonb, 'PENDING', 0
FROM (SELECT pg_advisory_xact_lock(hashtext('relay:' || $4), hashtext($2))) AS key_order`

func runEnqueue(ctx context.Context, url string, admin *pgxpool.Pool) error {
	const table = "relaybench_enqueue"
	payload := []byte(`{"n":1}`)
	key := func(i int) string { return fmt.Sprint("k", i) }
	raw := func(stmt string) func(ctx context.Context, tx pgx.Tx, i int) error {
		return func(ctx context.Context, tx pgx.Tx, i int) error {
			_, err := tx.Exec(ctx, stmt, benchType, key(i), string(payload))
			return err
		}
	}
	variants := []enqueueVariant{
		{"plain INSERT", raw(`INSERT INTO ` + table + ` (type, natural_key, payload) VALUES ($1, $2, $3::jsonb)`)},
		{"Enqueue", func(ctx context.Context, tx pgx.Tx, i int) error {
			_, err := relay.Enqueue(ctx, tx, table, relay.Outgoing{Type: benchType, Key: key(i), Payload: payload})
			return err
		}},
		{"Enqueue, WithoutWakeUp", func(ctx context.Context, tx pgx.Tx, i int) error {
			_, err := relay.Enqueue(ctx, tx, table, relay.Outgoing{Type: benchType, Key: key(i), Payload: payload}, relay.WithoutWakeUp())
			return err
		}},
		{"INSERT + the key's order lock", raw(`INSERT INTO ` + table + ` (type, natural_key, payload)
SELECT $1, $2, $3::jsonb FROM (SELECT pg_advisory_xact_lock(hashtext('relay:` + table + `'), hashtext($2))) k`)},
		// Enqueue's statement (WithoutWakeUp) sent by plain pgx, with and
		// without reading its id back: what the id costs, and what
		// Enqueue's Go side costs beside the QueryRow variant.
		{"Enqueue's statement by plain pgx, QueryRow (RETURNING id)", func(ctx context.Context, tx pgx.Tx, i int) error {
			var id int64
			return tx.QueryRow(ctx, enqueueStatement+"\nRETURNING id", benchType, key(i), string(payload), table).Scan(&id)
		}},
		{"Enqueue's statement by plain pgx, Exec (no id back)", func(ctx context.Context, tx pgx.Tx, i int) error {
			_, err := tx.Exec(ctx, enqueueStatement, benchType, key(i), string(payload), table)
			return err
		}},
		{"INSERT + NOTIFY in every transaction", raw(`INSERT INTO ` + table + ` (type, natural_key, payload)
SELECT $1, $2, $3::jsonb FROM (SELECT pg_notify('relay:` + table + `', $1)) k`)},
		{"Enqueue's statement before issue 21 (every transaction tries the token)", func(ctx context.Context, tx pgx.Tx, i int) error {
			due := false // and notifies without it once per 10ms per process
			now := time.Now().UnixNano()
			if last := lastNotify.Load(); now-last >= int64(10*time.Millisecond) {
				due = lastNotify.CompareAndSwap(last, now)
			}
			_, err := tx.Exec(ctx, `INSERT INTO `+table+` (direction, type, natural_key, payload, status, attempts)
SELECT 'OUT', $1, $2, $3::jsonb, 'PENDING', 0
FROM (SELECT pg_advisory_xact_lock(hashtext('relay:' || $4), hashtext($2)),
  CASE WHEN pg_try_advisory_xact_lock(hashtext('relay:wake'), hashtext($5)) THEN pg_notify($5, $1)
  WHEN $6::bool THEN pg_notify($5, $1) END) AS key_order
RETURNING id`, benchType, key(i), string(payload), table, "relay:"+table, due)
			return err
		}},
	}
	pool, notified, done, err := producersTable(ctx, url, admin, table)
	if err != nil {
		return err
	}
	defer done()
	rates := make([][]float64, len(variants))
	ratios := make([][]float64, len(variants))
	notifies := make([][]float64, len(variants))
	for round := range *enqueueRounds {
		got := make([]float64, len(variants))
		for k := range variants {
			i := (k + round) % len(variants)
			before, start := notified.Load(), time.Now()
			rate, err := producersRateOn(ctx, pool, 8, *enqueueSlice, variants[i].write)
			if err != nil {
				return fmt.Errorf("%s: %w", variants[i].name, err)
			}
			got[i] = rate
			notifies[i] = append(notifies[i], float64(notified.Load()-before)/time.Since(start).Seconds())
		}
		for i := range variants {
			rates[i] = append(rates[i], got[i])
			ratios[i] = append(ratios[i], got[i]/got[0])
		}
	}
	fmt.Printf("\nenqueue: commits/s of 8 concurrent producers on one pool, one message per transaction, %d rounds of %s per variant (interleaved, order rotated), medians\n",
		*enqueueRounds, *enqueueSlice)
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "producers\tcommits/s (median)\trange\t× plain INSERT (median of the rounds' ratios)\tNOTIFYs/s\t")
	for i, v := range variants {
		fmt.Fprintf(w, "%s\t%.0f\t%.0f–%.0f\t%.2f×\t%.0f\t\n", v.name, benchkit.Median(rates[i]), slices.Min(rates[i]), slices.Max(rates[i]), benchkit.Median(ratios[i]), benchkit.Median(notifies[i]))
	}
	w.Flush()
	fmt.Println("target (issue 37, replacing issue 21's 0.95×): Enqueue ≥ 0.9× plain INSERT")
	return nil
}

// producersTable makes table anew for the producer scenarios, with a pool of
// 8 for their producers and a count of the wake-ups they send; done closes
// both.
func producersTable(ctx context.Context, url string, admin *pgxpool.Pool, table string) (pool *pgxpool.Pool, notified *atomic.Int64, done func(), err error) {
	if err := freshTable(ctx, admin, table, 0, "PENDING"); err != nil {
		return nil, nil, nil, err
	}
	if pool, err = benchkit.Pool(ctx, url, "relaybench", 8); err != nil {
		return nil, nil, nil, err
	}
	notified, stopListening, err := countNotifications(ctx, url, "relay:"+table)
	if err != nil {
		pool.Close()
		return nil, nil, nil, err
	}
	return pool, notified, func() { stopListening(); pool.Close() }, nil
}

// countNotifications LISTENs on channel, as a started relay does, and counts
// the notifications until stop, which returns the count.
func countNotifications(ctx context.Context, url, channel string) (count *atomic.Int64, stop func() int64, err error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, nil, err
	}
	if _, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{channel}.Sanitize()); err != nil {
		conn.Close(ctx)
		return nil, nil, err
	}
	count = new(atomic.Int64)
	lctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			if _, err := conn.WaitForNotification(lctx); err != nil {
				return
			}
			count.Add(1)
		}
	}()
	var once sync.Once
	return count, func() int64 {
		once.Do(func() {
			cancel()
			<-done
			conn.Close(context.Background())
		})
		return count.Load()
	}, nil
}
