package inbox_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/xadm/relay/inbox"
)

// BenchmarkReceive compares a message received through the inbox with the
// same apply (one INSERT) in a transaction of its own, on one connection at a
// time: ns/op is a message's latency, allocs/op the inbox's Go-side cost.
// cmd/relaybench -scenarios inbox measures requests/s through HTTP.
func BenchmarkReceive(b *testing.B) {
	bb := setup(b)
	var next atomic.Int64
	msg := func() inbox.Message {
		id := next.Add(1)
		return inbox.Message{IdempotencyKey: fmt.Sprintf("public.outbox/%d", id), ID: id, Key: fmt.Sprintf("k%d", id%500),
			Body: []byte(`{"id": "order-1", "total_cents": 1250}`)}
	}
	ctx := context.Background()
	b.Run("without", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			m := msg()
			if err := pgx.BeginFunc(ctx, bb.pool, func(tx pgx.Tx) error { return bb.apply(ctx, tx, m) }); err != nil {
				b.Fatal(err)
			}
		}
	})
	for _, keepStale := range []bool{false, true} {
		ib, err := inbox.New(bb.pool, inbox.Config{Table: bb.table, KeepStale: keepStale})
		if err != nil {
			b.Fatal(err)
		}
		b.Run(fmt.Sprintf("inbox/KeepStale=%v", keepStale), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := ib.Receive(ctx, msg(), bb.apply); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
