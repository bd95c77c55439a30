package relay_test

import (
	"context"
	"runtime"
	"runtime/metrics"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/xadm/relay"
)

// BenchmarkLargePayloadMemory is one direct pass (Run) over rows of 50 MB
// with the default BatchBytes (64 MiB), a destination that takes the payload
// as given. It reports, above the heap before the pass and sampled every
// 200 µs from runtime/metrics, the peak of the live heap (/gc/heap/live:bytes,
// as each GC cycle marked it) and of the heap's objects, live and garbage not
// yet collected (/memory/classes/heap/objects:bytes, which GOGC lets grow to
// about twice the live heap), beside 2×BatchBytes: the batch in flight and
// the next one being read while its last message is sent. It fails when the
// live peak exceeds 2×BatchBytes + 16 MiB.
//
//	go test -run xxx -bench LargePayloadMemory -benchtime 3x ./
func BenchmarkLargePayloadMemory(b *testing.B) {
	const rows, size = 6, 50_000_000
	w := benchSetup(b, 4)
	ctx := context.Background()
	_, err := w.pool.Exec(ctx, `INSERT INTO `+pgx.Identifier{w.table}.Sanitize()+`
		(type, natural_key, payload) SELECT 'bench', 'key-' || i, jsonb_build_object('d', repeat('x', $1))
		FROM generate_series(1, $2) i`, size-len(`{"d": ""}`), rows)
	if err != nil {
		b.Fatal(err)
	}
	var got atomic.Int64
	r, err := relay.New(w.pool, w.cfg, relay.SenderFunc("bench", func(_ context.Context, m relay.Message) error {
		if len(m.Payload) != size {
			b.Errorf("payload of %d bytes, want %d", len(m.Payload), size)
		}
		got.Add(1)
		return nil
	}))
	if err != nil {
		b.Fatal(err)
	}
	sample := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}, {Name: "/gc/heap/live:bytes"}}
	heap := func() (uint64, uint64) {
		metrics.Read(sample)
		return sample[0].Value.Uint64(), sample[1].Value.Uint64()
	}
	var peak, peakLive uint64
	for range b.N {
		b.StopTimer()
		if _, err := w.pool.Exec(ctx, `UPDATE `+pgx.Identifier{w.table}.Sanitize()+` SET status = 'PENDING', sent_at = NULL`); err != nil {
			b.Fatal(err)
		}
		runtime.GC()
		base, baseLive := heap()
		var top, topLive atomic.Uint64
		done := make(chan struct{})
		var wg sync.WaitGroup
		wg.Go(func() {
			t := time.NewTicker(200 * time.Microsecond)
			defer t.Stop()
			for {
				h, l := heap()
				if h > top.Load() {
					top.Store(h)
				}
				if l > topLive.Load() {
					topLive.Store(l)
				}
				select {
				case <-done:
					return
				case <-t.C:
				}
			}
		})
		got.Store(0)
		b.StartTimer()
		n, err := r.Run(ctx)
		b.StopTimer()
		close(done)
		wg.Wait()
		if err != nil || n != rows || got.Load() != rows {
			b.Fatalf("Run: %d rows processed, %d sent, %v; want %d", n, got.Load(), err, rows)
		}
		if d := top.Load() - min(base, top.Load()); d > peak {
			peak = d
		}
		if d := topLive.Load() - min(baseLive, topLive.Load()); d > peakLive {
			peakLive = d
		}
	}
	if limit := uint64(2*w.cfg.BatchBytes + 16<<20); peakLive > limit {
		b.Errorf("peak live heap %d bytes above 2×BatchBytes + 16 MiB (%d)", peakLive, limit)
	}
	b.ReportMetric(float64(peak)/1e6, "peak-heap-MB")
	b.ReportMetric(float64(peakLive)/1e6, "peak-live-MB")
	b.ReportMetric(float64(2*w.cfg.BatchBytes)/1e6, "2xBatchBytes-MB")
}
