package faultstest_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/xadm/relay"
	"github.com/xadm/relay/internal/testkit/pgserver"
)

// TestReadOnlyCutover turns the whole server read-only under a running relay
// with Concurrency 4, as a cutover does with default_transaction_read_only,
// for three seconds. The relay stops sending at once: only the messages in
// flight at the switch go out, their outcomes cannot be written, and they are
// not sent again before their backoff step, however many passes run. It says
// the server is read-only, and delivers everything once the server writes again.
func TestReadOnlyCutover(t *testing.T) {
	requireLocal(t)
	ctx := context.Background()
	w := newWorld(t)
	ids := w.insert(t, keys("k", 400)...)
	var logs logLines
	var switched atomic.Int64 // unix nanos when the server turned read-only
	var mu sync.Mutex
	sends := map[int64][]time.Time{}
	dest := newDestination(5 * time.Millisecond)
	dest.before = func(_ context.Context, m relay.Message) error {
		mu.Lock()
		sends[m.ID] = append(sends[m.ID], time.Now())
		mu.Unlock()
		return nil
	}
	cfg := w.config(logs.logger())
	cfg.Concurrency = 4
	cfg.GroupOutcomes = 1 // one transaction per outcome: at most 8 wait per worker (the bound below)
	pool := newPool(t, w.name, 8)
	r, err := relay.New(pool, cfg, dest)
	require.NoError(t, err)
	require.NoError(t, r.Start(ctx))
	require.Eventually(t, func() bool { return len(dest.counts()) >= 50 }, 10*time.Second, 5*time.Millisecond)

	admin := adminConn(t)
	setReadOnly(t, admin, true)
	switched.Store(time.Now().UnixNano())
	time.Sleep(3 * time.Second)
	mu.Lock()
	var during int
	for _, ts := range sends {
		for _, at := range ts {
			if at.UnixNano() > switched.Load() {
				during++
			}
		}
	}
	mu.Unlock()
	setReadOnly(t, admin, false)

	require.Eventually(t, func() bool { return w.countNot(t, "SENT") == 0 }, 30*time.Second, 10*time.Millisecond,
		"delivery resumes once the server writes again")
	require.NoError(t, r.Stop(ctx))
	require.LessOrEqual(t, during, cfg.Concurrency*(1+8), "after the switch, only the sends already under way")
	twice := 0
	for _, id := range ids {
		n := dest.counts()[id]
		require.GreaterOrEqual(t, n, 1, "row %d", id)
		require.LessOrEqual(t, n, 2, "row %d: sent again at most once, after its backoff step", id)
		if n == 2 {
			twice++
		}
	}
	// In flight at the switch: per worker, the message being sent and those
	// whose outcomes waited for its writer (outcomes.go, outcomePipeline: 8, with GroupOutcomes 1).
	require.LessOrEqual(t, twice, cfg.Concurrency*(1+8), "only the messages in flight at the switch are delivered twice")
	require.Positive(t, logs.count(t, "relay: pass failed", ""))
	var readOnlyLines int
	for _, rec := range logs.records(t) {
		if e, ok := rec["error"].(string); ok && strings.Contains(e, "read-only") {
			readOnlyLines++
		}
	}
	require.Positive(t, readOnlyLines, "the log says the server is read-only")
	t.Logf("read-only for 3s: %d sends after the switch, %d rows delivered twice, %d log lines name it", during, twice, readOnlyLines)
}

// TestHotStandby points a relay at a hot standby, as a stale DNS name does
// after a failover: it takes no election there (a lock on a standby excludes
// nobody on the primary) and sends nothing, and says why.
func TestHotStandby(t *testing.T) {
	requireLocal(t)
	ctx := context.Background()
	w := newWorld(t)
	w.insert(t, keys("k", 5)...)
	standby, err := server().StartStandby(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = standby.Stop() })
	pool := pgserver.Pool(t, standby.URL, w.name+"_standby", 4)
	require.Eventually(t, func() bool { // the standby has replayed the rows
		var n int
		return pool.QueryRow(ctx, "SELECT count(*) FROM "+w.table()).Scan(&n) == nil && n == 5
	}, 30*time.Second, 20*time.Millisecond)

	dest := newDestination(0)
	cfg := w.config(nil)
	cfg.Logger = nil
	r, err := relay.New(pool, cfg, dest)
	require.NoError(t, err)
	ran, err := r.RunIfElected(ctx)
	require.False(t, ran)
	require.ErrorIs(t, err, relay.ErrReadOnly)
	cfg.ClusterLock = false
	direct, err := relay.New(pool, cfg, dest)
	require.NoError(t, err)
	_, err = direct.Run(ctx)
	require.ErrorIs(t, err, relay.ErrReadOnly, "a direct pass sends nothing from a standby either")
	require.Empty(t, dest.counts())

	// The same relay, pointed at the primary, delivers.
	r, err = relay.New(w.pool, w.config(nil), dest)
	require.NoError(t, err)
	ran, err = r.RunIfElected(ctx)
	require.True(t, ran)
	require.NoError(t, err)
	require.Len(t, dest.counts(), 5)
}

func keys(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%03d", prefix, i)
	}
	return out
}

// adminConn is a superuser session of the test's own, immune to the
// read-only default it sets for everyone else.
func adminConn(t *testing.T) *pgx.Conn {
	t.Helper()
	c, err := pgx.Connect(context.Background(), server().URL)
	require.NoError(t, err)
	t.Cleanup(func() {
		setReadOnly(t, c, false)
		c.Close(context.Background())
	})
	_, err = c.Exec(context.Background(), "SET default_transaction_read_only = off")
	require.NoError(t, err)
	return c
}

// setReadOnly sets the server's default_transaction_read_only and waits until
// a new session sees it.
func setReadOnly(t *testing.T, c *pgx.Conn, on bool) {
	t.Helper()
	ctx := context.Background()
	stmt := "ALTER SYSTEM RESET default_transaction_read_only"
	if on {
		stmt = "ALTER SYSTEM SET default_transaction_read_only = on"
	}
	_, err := c.Exec(ctx, stmt)
	require.NoError(t, err)
	_, err = c.Exec(ctx, "SELECT pg_reload_conf()")
	require.NoError(t, err)
	want := "off"
	if on {
		want = "on"
	}
	require.Eventually(t, func() bool {
		probe, err := pgx.Connect(ctx, server().URL)
		if err != nil {
			return false
		}
		defer probe.Close(ctx)
		var got string
		return probe.QueryRow(ctx, "SHOW default_transaction_read_only").Scan(&got) == nil && got == want
	}, 10*time.Second, 10*time.Millisecond)
}
