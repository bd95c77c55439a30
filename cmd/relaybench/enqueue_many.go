package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/xadm/relay"
	"github.com/xadm/relay/internal/tools/benchkit"
)

// The enqueue-many scenario (issue 48): the rows per second of 8 concurrent
// producers, each committing transactions of -enqueue-many-batch messages of
// distinct keys (a fan-out), written with EnqueueMany beside a plain pgx
// INSERT … SELECT FROM unnest(…) of the same rows into the same table, and
// beside a loop of Enqueue in one transaction. As in the enqueue scenario, the
// producers share one pool, one table and a listener (as a started relay
// LISTENs), and every round runs each variant once, for -enqueue-many-slice,
// in an order rotated from round to round; the table is emptied before each
// slice, so that no variant writes into a larger table than another. The
// table shows the medians of -enqueue-many-rounds rounds, and each variant's
// ratio to the plain INSERT and to the loop of the same round (the medians
// of those ratios).

var (
	enqueueManyBatch  = flag.Int("enqueue-many-batch", 1000, "messages per transaction of the enqueue-many scenario")
	enqueueManySlice  = flag.Duration("enqueue-many-slice", time.Second, "how long each variant runs in each round of the enqueue-many scenario")
	enqueueManyRounds = flag.Int("enqueue-many-rounds", 9, "rounds of the enqueue-many scenario")
)

// batchVariant is one way a producer writes the messages of a transaction.
type batchVariant struct {
	name  string
	write func(ctx context.Context, tx pgx.Tx, b *batchRows) error
}

// batchRows are a transaction's messages, in both the shapes the variants
// take: relay.Outgoing, and the columns' arrays of the plain INSERT.
type batchRows struct {
	ms                    []relay.Outgoing
	types, keys, payloads []string
}

func newBatchRows(i, n int, payload string) *batchRows {
	b := &batchRows{ms: make([]relay.Outgoing, n), types: make([]string, n), keys: make([]string, n), payloads: make([]string, n)}
	prefix := "k" + strconv.Itoa(i) + "-"
	for j := range n {
		key := prefix + strconv.Itoa(j)
		b.ms[j] = relay.Outgoing{Type: benchType, Key: key, Payload: []byte(payload)}
		b.types[j], b.keys[j], b.payloads[j] = benchType, key, payload
	}
	return b
}

func runEnqueueMany(ctx context.Context, url string, admin *pgxpool.Pool) error {
	const table = "relaybench_enqueue_many"
	payload := `{"n": 1, "text": "` + string(slices.Repeat([]byte("x"), 64)) + `"}`
	variants := []batchVariant{
		{"plain INSERT … SELECT FROM unnest(…)", func(ctx context.Context, tx pgx.Tx, b *batchRows) error {
			_, err := tx.Exec(ctx, `INSERT INTO `+table+` (type, natural_key, payload)
SELECT u.type, u.key, u.payload::jsonb FROM unnest($1::text[], $2::text[], $3::text[]) AS u(type, key, payload)`, b.types, b.keys, b.payloads)
			return err
		}},
		{"EnqueueMany", func(ctx context.Context, tx pgx.Tx, b *batchRows) error {
			_, err := relay.EnqueueMany(ctx, tx, table, b.ms)
			return err
		}},
		{"EnqueueMany, WithoutWakeUp", func(ctx context.Context, tx pgx.Tx, b *batchRows) error {
			_, err := relay.EnqueueMany(ctx, tx, table, b.ms, relay.WithoutWakeUp())
			return err
		}},
		{"a loop of Enqueue", func(ctx context.Context, tx pgx.Tx, b *batchRows) error {
			for _, m := range b.ms {
				if _, err := relay.Enqueue(ctx, tx, table, m); err != nil {
					return err
				}
			}
			return nil
		}},
	}
	const plain, many, loop = 0, 1, 3
	pool, notified, done, err := producersTable(ctx, url, admin, table)
	if err != nil {
		return err
	}
	defer done()
	n := *enqueueManyBatch
	rates := make([][]float64, len(variants))
	toPlain := make([][]float64, len(variants))
	toLoop := make([][]float64, len(variants))
	notifies := make([][]float64, len(variants))
	for round := range *enqueueManyRounds {
		got := make([]float64, len(variants))
		for k := range variants {
			i := (k + round) % len(variants)
			if _, err := admin.Exec(ctx, "TRUNCATE "+table); err != nil {
				return err
			}
			before, start := notified.Load(), time.Now()
			tps, err := producersRateOn(ctx, pool, 8, *enqueueManySlice, func(ctx context.Context, tx pgx.Tx, t int) error {
				return variants[i].write(ctx, tx, newBatchRows(t, n, payload))
			})
			if err != nil {
				return fmt.Errorf("%s: %w", variants[i].name, err)
			}
			got[i] = tps * float64(n)
			notifies[i] = append(notifies[i], float64(notified.Load()-before)/time.Since(start).Seconds())
		}
		for i := range variants {
			rates[i] = append(rates[i], got[i])
			toPlain[i] = append(toPlain[i], got[i]/got[plain])
			toLoop[i] = append(toLoop[i], got[i]/got[loop])
		}
	}
	fmt.Printf("\nenqueue-many: rows/s of 8 concurrent producers on one pool, %d messages of distinct keys per transaction, %d rounds of %s per variant (interleaved, order rotated), medians\n",
		n, *enqueueManyRounds, *enqueueManySlice)
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "producers\trows/s (median)\trange\t× plain INSERT\t× loop of Enqueue\tNOTIFYs/s\t")
	for i, v := range variants {
		fmt.Fprintf(w, "%s\t%.0f\t%.0f–%.0f\t%.2f×\t%.2f×\t%.0f\t\n", v.name, benchkit.Median(rates[i]), slices.Min(rates[i]), slices.Max(rates[i]),
			benchkit.Median(toPlain[i]), benchkit.Median(toLoop[i]), benchkit.Median(notifies[i]))
	}
	w.Flush()
	ok := func(b bool) string {
		if b {
			return "met"
		}
		return "NOT met"
	}
	fmt.Printf("target (issue 48): EnqueueMany ≥ 0.8× plain INSERT: %s; ≥ 4× a loop of Enqueue: %s\n",
		ok(benchkit.Median(toPlain[many]) >= 0.8), ok(benchkit.Median(toLoop[many]) >= 4))
	return nil
}
