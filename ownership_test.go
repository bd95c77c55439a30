package relay_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/xadm/relay"
)

// deliveries records what the relays of several apps delivered, by id: a
// second delivery of an id, or a key's message after a later one of its
// key, is a failure of one type, one app.
type deliveries struct {
	mu    sync.Mutex
	by    map[int64]string // id -> the app that delivered it
	last  map[string]int64 // key -> the last id delivered
	dups  int
	order int
}

func newDeliveries() *deliveries {
	return &deliveries{by: map[int64]string{}, last: map[string]int64{}}
}

// sender is app's sender of typ into d.
func (d *deliveries) sender(app, typ string) relay.Sender {
	return relay.SenderFunc(typ, func(_ context.Context, m relay.Message) error {
		d.mu.Lock()
		defer d.mu.Unlock()
		if _, ok := d.by[m.ID]; ok {
			d.dups++
		}
		d.by[m.ID] = app
		if m.ID < d.last[m.Key] {
			d.order++
		}
		d.last[m.Key] = max(d.last[m.Key], m.ID)
		return nil
	})
}

func (d *deliveries) count(app string) (n int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, a := range d.by {
		if a == app {
			n++
		}
	}
	return n
}

func (d *deliveries) check(t *testing.T, want int) {
	t.Helper()
	d.mu.Lock()
	defer d.mu.Unlock()
	require.Equal(t, want, len(d.by), "every message delivered")
	require.Zero(t, d.dups, "no message delivered twice")
	require.Zero(t, d.order, "no key's message after a later one of its key")
}

// yields waits until r yields typ to app.
func yields(t *testing.T, r *relay.Relay, typ, app string) {
	t.Helper()
	require.Eventually(t, func() bool {
		for _, y := range r.Stats().Yielded {
			if y.Type == typ && y.App == app {
				return true
			}
		}
		return false
	}, 10*time.Second, 10*time.Millisecond, "the relay yields %q to app %q: %+v", typ, app, r.Stats().Yielded)
}

// TestOneTypeOneApp: two apps with a sender for one type on one table,
// started in either order. The first delivers it; the second yields it (and
// says so in Stats and presence), takes it over once the first has stopped,
// and the first, started again, yields it in turn. Nothing is delivered
// twice or out of its key's order, and the registry says who delivers.
func TestOneTypeOneApp(t *testing.T) {
	t.Parallel()
	for _, first := range []string{"a", "b"} {
		t.Run("First"+first, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ctx := context.Background()
			d := newDeliveries()
			cfg := func(app string) relay.Config {
				c := b.cfg
				c.AppName = b.cfg.AppName + "_" + app
				return c
			}
			second := map[string]string{"a": "b", "b": "a"}[first]
			r1 := b.newRelay(t, cfg(first), d.sender(first, "y"))
			startRelay(t, r1)
			require.Eventually(t, func() bool { return ownerOf(t, b, "y") == cfg(first).AppName }, 10*time.Second, 10*time.Millisecond)
			r2 := b.newRelay(t, cfg(second), d.sender(second, "y"))
			startRelay(t, r2)
			yields(t, r2, "y", cfg(first).AppName)
			require.Empty(t, r1.Stats().Yielded)

			admin, err := relay.NewAdmin(b.pool, cfg(second))
			require.NoError(t, err)
			require.Eventually(t, func() bool {
				reps := replicasOf(t, admin)
				return len(reps) == 1 && len(reps[0].Yielded) == 1 && reps[0].Yielded[0].App == cfg(first).AppName
			}, 10*time.Second, 10*time.Millisecond, "presence says the type yielded")

			keys := func(from, n int) (ks []string) {
				for i := from; i < from+n; i++ {
					ks = append(ks, fmt.Sprint("k", i%7))
				}
				return ks
			}
			b.insert(t, "y", keys(0, 50)...)
			require.Eventually(t, func() bool { return d.count(first) == 50 }, 10*time.Second, 10*time.Millisecond)
			require.Zero(t, d.count(second), "the second app delivers none while the first runs")

			require.NoError(t, r1.Stop(ctx))
			require.Eventually(t, func() bool { return len(r2.Stats().Yielded) == 0 }, 10*time.Second, 10*time.Millisecond,
				"the second takes the type over once the first has stopped")
			require.Equal(t, cfg(second).AppName, ownerOf(t, b, "y"), "the registry hands the type over")
			b.insert(t, "y", keys(50, 50)...)
			require.Eventually(t, func() bool { return d.count(second) == 50 }, 10*time.Second, 10*time.Millisecond)

			r1 = b.newRelay(t, cfg(first), d.sender(first, "y"))
			startRelay(t, r1)
			yields(t, r1, "y", cfg(second).AppName)
			b.insert(t, "y", keys(100, 20)...)
			require.Eventually(t, func() bool { return d.count(second) == 70 }, 10*time.Second, 10*time.Millisecond)
			d.check(t, 120)
		})
	}
}

// ownerOf is the app the registry names for typ; "" when none.
func ownerOf(t *testing.T, b *bundle, typ string) string {
	t.Helper()
	var app string
	err := b.pool.QueryRow(context.Background(), "SELECT app FROM "+pgx.Identifier{b.table + "_types"}.Sanitize()+" WHERE type = $1", typ).Scan(&app)
	if err == pgx.ErrNoRows {
		return ""
	}
	require.NoError(t, err)
	return app
}

// TestRenameInARollingDeploy is issue 46's rename: two replicas of app
// "orders" deliver type y under a steady stream of writes; two replicas of
// "orders-v2" start beside them, then the old ones stop one at a time. The
// new app takes the type over once the last old replica has stopped: no
// message is delivered twice or out of its key's order.
func TestRenameInARollingDeploy(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	d := newDeliveries()
	old, renamed := b.cfg, b.cfg
	old.AppName, renamed.AppName = b.cfg.AppName+"_orders", b.cfg.AppName+"_orders-v2"
	old.Concurrency, renamed.Concurrency = 2, 2
	o1, o2 := b.newRelay(t, old, d.sender("old", "y")), b.newRelay(t, old, d.sender("old", "y"))
	startRelay(t, o1)
	startRelay(t, o2)

	var written int
	var mu sync.Mutex
	wctx, stopWriting := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; wctx.Err() == nil; i++ {
			_, err := relay.Enqueue(ctx, b.pool, b.table, relay.Outgoing{Type: "y", Key: fmt.Sprint("k", i%13), Payload: []byte(`{}`)})
			if err != nil {
				t.Errorf("enqueue: %v", err)
				return
			}
			mu.Lock()
			written++
			mu.Unlock()
			time.Sleep(2 * time.Millisecond)
		}
	}()
	require.Eventually(t, func() bool { return d.count("old") > 50 }, 10*time.Second, 10*time.Millisecond)

	n1, n2 := b.newRelay(t, renamed, d.sender("new", "y")), b.newRelay(t, renamed, d.sender("new", "y"))
	startRelay(t, n1)
	startRelay(t, n2)
	yields(t, n1, "y", old.AppName)
	yields(t, n2, "y", old.AppName)
	require.NoError(t, o1.Stop(ctx))
	require.Eventually(t, func() bool { return d.count("old") > 100 }, 10*time.Second, 10*time.Millisecond, "o2 delivers alone")
	require.NotEmpty(t, n1.Stats().Yielded, "one old replica still runs: the new app still yields")
	require.NoError(t, o2.Stop(ctx))
	require.Eventually(t, func() bool { return d.count("new") > 50 }, 15*time.Second, 10*time.Millisecond, "the new app takes over")
	stopWriting()
	wg.Wait()
	mu.Lock()
	n := written
	mu.Unlock()
	require.Eventually(t, func() bool { return b.countStatus(t, "SENT") == n }, 15*time.Second, 10*time.Millisecond)
	d.check(t, n)
}
