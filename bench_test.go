package relay_test

// Benchmarks of the pass. They run only with -bench, on the package's test
// server (see TestMain), which runs with fsync=off: they measure what the relay
// costs on its side (round trips, CPU, allocations), not what a durable commit
// costs. For figures beside pgbench on a durable server, see cmd/relaybench and
// docs/performance.md.
//
//	go test -run xxx -bench . -benchtime 100x ./

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/xadm/relay"
	"github.com/xadm/relay/internal/testkit/pgserver"
	"github.com/xadm/relay/internal/tools/benchkit"
)

// benchWorld is one benchmark's table, pool and app; testing.B's counterpart of setup.
type benchWorld struct {
	pool  *pgxpool.Pool
	table string
	trips *benchkit.Tracer // each query and each batch is one round trip
	cfg   relay.Config
}

func benchSetup(b *testing.B, maxConns int32) *benchWorld {
	b.Helper()
	name := pgserver.Name(b)
	w := &benchWorld{table: name, trips: &benchkit.Tracer{}}
	w.pool = pgserver.Pool(b, server().URL, name, maxConns, func(pc *pgxpool.Config) { pc.ConnConfig.Tracer = w.trips })
	if err := relay.CreateTable(context.Background(), w.pool, name); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_, _ = w.pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+pgx.Identifier{name}.Sanitize())
	})
	w.cfg = relay.DefaultConfig()
	w.cfg.AppName = name
	w.cfg.Table = name
	w.cfg.Logger = slog.New(slog.DiscardHandler)
	return w
}

func (w *benchWorld) relay(b *testing.B, cfg relay.Config) *relay.Relay {
	b.Helper()
	r, err := relay.New(w.pool, cfg, benchkit.Noop("bench"))
	if err != nil {
		b.Fatal(err)
	}
	return r
}

// load writes n PENDING rows of distinct keys in one statement.
func (w *benchWorld) load(b *testing.B, n int) {
	b.Helper()
	_, err := w.pool.Exec(context.Background(), `INSERT INTO `+pgx.Identifier{w.table}.Sanitize()+`
		(type, natural_key, payload) SELECT 'bench', 'key-' || i || '-' || clock_timestamp(), jsonb_build_object('n', i)
		FROM generate_series(1, $1) i`, n)
	if err != nil {
		b.Fatal(err)
	}
}

// benchBatches runs pass over a fresh batch of n rows b.N times, loading each
// batch outside the timer, and reports messages per second and ns per message.
func benchBatches(b *testing.B, w *benchWorld, n int, pass func() (int, error)) {
	b.Helper()
	w.load(b, n) // warm up: connections open, statements prepared
	if got, err := pass(); err != nil || got != n {
		b.Fatalf("warm-up pass: %d rows, %v; want %d", got, err, n)
	}
	b.ReportAllocs()
	b.ResetTimer()
	var busy time.Duration
	var trips int64
	for range b.N {
		b.StopTimer()
		w.load(b, n)
		before := w.trips.Statements()
		b.StartTimer()
		start := time.Now()
		got, err := pass()
		busy += time.Since(start)
		trips += w.trips.Statements() - before
		if err != nil || got != n {
			b.Fatalf("pass: %d rows, %v; want %d", got, err, n)
		}
	}
	b.StopTimer()
	msgs := float64(b.N * n)
	b.ReportMetric(msgs/busy.Seconds(), "msgs/s")
	b.ReportMetric(float64(busy.Nanoseconds())/msgs, "ns/msg")
	b.ReportMetric(float64(trips)/msgs, "roundtrips/msg")
}

// BenchmarkPass is one direct pass (Run) of a batch of 100 rows with the
// defaults: Concurrency 1, one transaction per outcome.
func BenchmarkPass(b *testing.B) {
	w := benchSetup(b, 4)
	r := w.relay(b, w.cfg)
	benchBatches(b, w, 100, func() (int, error) { return r.Run(context.Background()) })
}

// BenchmarkGroupOutcomes is the pass of BenchmarkPass with the outcomes of the
// batch recorded in one statement (GroupOutcomes = BatchSize), beside the
// default of one transaction per outcome, with and without AsyncCommit.
func BenchmarkGroupOutcomes(b *testing.B) {
	for _, c := range []struct {
		name         string
		batch, group int
		async        bool
	}{
		{"batch=100/per-outcome", 100, 0, false},
		{"batch=100/per-outcome/async", 100, 0, true},
		{"batch=100/grouped", 100, 100, false},
		{"batch=100/grouped/async", 100, 100, true},
		{"batch=1000/grouped", 1000, 1000, false},
	} {
		b.Run(c.name, func(b *testing.B) {
			w := benchSetup(b, 4)
			cfg := w.cfg
			cfg.BatchSize, cfg.GroupOutcomes, cfg.AsyncCommit = c.batch, c.group, c.async
			r := w.relay(b, cfg)
			benchBatches(b, w, c.batch, func() (int, error) { return r.Run(context.Background()) })
		})
	}
}

// BenchmarkLockLossCost is the price of the election and of watching for its
// loss, per message: an elected pass (RunIfElected) of 100 messages beside a
// direct pass (Run) of the same 100 messages. Compare their ns/msg.
func BenchmarkLockLossCost(b *testing.B) {
	const n = 100
	b.Run("direct", func(b *testing.B) {
		w := benchSetup(b, 4)
		r := w.relay(b, w.cfg)
		benchBatches(b, w, n, func() (int, error) { return r.Run(context.Background()) })
	})
	b.Run("elected", func(b *testing.B) {
		w := benchSetup(b, 4)
		obs := benchkit.NewDrainObserver(0) // counts the messages recorded SENT
		cfg := w.cfg
		cfg.Observer = obs
		r := w.relay(b, cfg)
		benchBatches(b, w, n, func() (int, error) {
			before := obs.Sent.Load()
			ran, err := r.RunIfElected(context.Background())
			if err == nil && !ran {
				b.Fatal("the elected pass coalesced")
			}
			return int(obs.Sent.Load() - before), err
		})
	})
}

// benchEmpty times one empty pass and reports its round trips.
func benchEmpty(b *testing.B, w *benchWorld, pass func() error) {
	b.Helper()
	for range 5 { // warm up: connections open, statements prepared
		if err := pass(); err != nil {
			b.Fatal(err)
		}
	}
	before := w.trips.Statements()
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		if err := pass(); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(w.trips.Statements()-before)/float64(b.N), "roundtrips/op")
}

// BenchmarkDirectEmptyPass is Run on a table with nothing to deliver: the fetch alone.
func BenchmarkDirectEmptyPass(b *testing.B) {
	w := benchSetup(b, 4)
	r := w.relay(b, w.cfg)
	benchEmpty(b, w, func() error { _, err := r.Run(context.Background()); return err })
}

// BenchmarkElectedEmptyPass is RunIfElected winning the election on a table
// with nothing to deliver: lock, fetch, unlock.
func BenchmarkElectedEmptyPass(b *testing.B) {
	w := benchSetup(b, 4)
	r := w.relay(b, w.cfg)
	benchEmpty(b, w, func() error {
		ran, err := r.RunIfElected(context.Background())
		if err == nil && !ran {
			b.Fatal("the elected pass coalesced")
		}
		return err
	})
}

// BenchmarkCoalescedPass is RunIfElected while another session (a JVM relay,
// another replica) holds the election: the try of the lock alone.
func BenchmarkCoalescedPass(b *testing.B) {
	w := benchSetup(b, 4)
	r := w.relay(b, w.cfg)
	ctx := context.Background()
	holder, err := pgx.Connect(ctx, server().URL)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = holder.Close(context.Background()) })
	var locked bool
	if err := holder.QueryRow(ctx, "SELECT pg_try_advisory_lock(hashtext($1))", w.cfg.AppName+relay.LockKeySuffix).Scan(&locked); err != nil || !locked {
		b.Fatalf("hold the election: %v, %v", locked, err)
	}
	benchEmpty(b, w, func() error {
		ran, err := r.RunIfElected(ctx)
		if err == nil && ran {
			b.Fatal("the pass ran while another session held the election")
		}
		return err
	})
}

// BenchmarkPassBesideDeadAndForeignRows is a pass delivering 10 rows from a
// table that holds only them, beside the same pass on a table that also holds
// 100,000 dead rows of the relay's own type and 100,000 waiting rows of
// another app's type: a pass costs what its live work costs. Compare ns/op.
func BenchmarkPassBesideDeadAndForeignRows(b *testing.B) {
	for _, c := range []struct {
		name          string
		dead, foreign int
	}{
		{"only-the-10", 0, 0},
		{"beside-100k-dead-100k-foreign", 100_000, 100_000},
	} {
		b.Run(c.name, func(b *testing.B) {
			w := benchSetup(b, 4)
			ctx := context.Background()
			t := pgx.Identifier{w.table}.Sanitize()
			if _, err := w.pool.Exec(ctx, `INSERT INTO `+t+` (type, natural_key, payload, status, attempts)
				SELECT 'bench', 'dead-' || i, '{}', 'ERROR', 10 FROM generate_series(1, $1) i`, c.dead); err != nil {
				b.Fatal(err)
			}
			if _, err := w.pool.Exec(ctx, `INSERT INTO `+t+` (type, natural_key, payload)
				SELECT 'other-app', 'other-' || i, '{}' FROM generate_series(1, $1) i`, c.foreign); err != nil {
				b.Fatal(err)
			}
			if _, err := w.pool.Exec(ctx, `ANALYZE `+t); err != nil {
				b.Fatal(err)
			}
			r := w.relay(b, w.cfg)
			benchBatches(b, w, 10, func() (int, error) { return r.Run(ctx) })
		})
	}
}
