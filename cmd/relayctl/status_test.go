package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/xadm/relay"
	"github.com/xadm/relay/internal/testkit/pgserver"
)

// TestStatusVerdictTable is docs/operations.md's table "A status to page on"
// as status's exit codes, one row each: OK 0, DEAD 1 (WARNING), STALLED and
// PAUSED 2 (CRITICAL), UNKNOWN 3 when status cannot look. Each row's
// conditions are TestVerdictTable's (internal/tools/diagnose).
func TestStatusVerdictTable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	status := func(t *testing.T, w *world, flags ...string) (int, jsonStatus) {
		t.Helper()
		code, stdout, stderr := w.ctl(t, ctx, "status", append([]string{"--json", "--sample", "0"}, flags...)...)
		var s jsonStatus
		require.NoError(t, json.Unmarshal([]byte(stdout), &s), "%s%s", stdout, stderr)
		require.Equal(t, s.ExitCode, code, "the JSON says the exit code")
		return code, s
	}

	t.Run("OK", func(t *testing.T) {
		t.Parallel()
		w := setup(t)
		w.rows(t, "orders", 2, "SENT", 0, time.Minute)
		code, s := status(t, w)
		require.Equal(t, statusOK, code, s.Summary)
		require.Equal(t, "OK", s.State)
	})
	t.Run("DeadIsWarning", func(t *testing.T) {
		t.Parallel()
		w := setup(t)
		w.rows(t, "orders", 1, "ERROR", ceiling, time.Minute)
		code, s := status(t, w)
		require.Equal(t, statusWarning, code, s.Summary)
		require.Equal(t, "WARNING", s.State)
		require.Equal(t, "dead", s.Verdict)
	})
	t.Run("StalledIsCritical", func(t *testing.T) {
		t.Parallel()
		w := setup(t)
		w.rows(t, "orders", 1, "PENDING", 0, time.Second)
		w.rows(t, "invoices", 1, "ERROR", ceiling, time.Minute)
		code, s := status(t, w)
		require.Equal(t, statusCritical, code, s.Summary)
		require.Equal(t, "CRITICAL", s.State)
		require.Equal(t, "stalled", s.Verdict, "over the dead rows")
		require.Contains(t, s.Summary, "Besides, 1 row(s) are dead")
	})
	t.Run("PausedIsCritical", func(t *testing.T) {
		t.Parallel()
		w := setup(t)
		cc, err := pgx.ParseConfig(pgserver.Shared().URL)
		require.NoError(t, err)
		cc.RuntimeParams["application_name"] = pauseName(w.app)
		conn, err := pgx.ConnectConfig(ctx, cc)
		require.NoError(t, err)
		t.Cleanup(func() { _ = conn.Close(context.Background()) })
		_, err = conn.Exec(ctx, pauseLockSQL, w.app)
		require.NoError(t, err)
		code, s := status(t, w)
		require.Equal(t, statusCritical, code, s.Summary)
		require.Equal(t, "paused", s.Verdict)
	})
	t.Run("Unknown", func(t *testing.T) {
		t.Parallel()
		w := setup(t)
		code, _, stderr := w.ctl(t, ctx, "status", "--database-url", "postgres://nobody@127.0.0.1:1/none?connect_timeout=5")
		require.Equal(t, statusUnknown, code, stderr)
		code, _, _ = w.ctl(t, ctx, "status", "--table", "missing_table")
		require.Equal(t, statusUnknown, code, "no such table: no verdict")
		code, _, _ = w.ctl(t, ctx, "status", "--sample", "2m")
		require.Equal(t, statusUnknown, code, "a bad flag: no verdict")
	})
}

// produce writes one row of typ every 200 ms (5 a second) until the test
// ends.
func (w *world) produce(t *testing.T, typ string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			_, err := relay.Enqueue(ctx, w.pool, w.table, relay.Outgoing{Type: typ, Key: fmt.Sprint("s", i), Payload: []byte(`{}`)})
			if err != nil && ctx.Err() == nil {
				t.Errorf("enqueue: %v", err)
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
}

// TestStatusStableBesideAStream is issue 36's: one row died of a 400 after
// one attempt, beside a steady stream of 5 rows a second that the relay
// delivers. Eight status calls in a row all say DEAD (exit 1), where the
// verdict used to follow whether a streamed row happened to wait; and each
// says the dead row made one attempt, in its text and its JSON.
func TestStatusStableBesideAStream(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := setup(t)
	cfg := w.cfg
	cfg.Interval = time.Second
	bad := relay.SenderFunc("refunds", func(context.Context, relay.Message) error {
		return relay.Permanent(errors.New("PUT http://refunds/1: 400 Bad Request"))
	})
	r, err := relay.New(w.pool, cfg, relay.SenderFunc("orders", func(context.Context, relay.Message) error { return nil }), bad)
	require.NoError(t, err)
	require.NoError(t, r.Start(ctx))
	t.Cleanup(func() { _ = r.Stop(context.Background()) })
	w.waitReplicas(t, 1)
	_, err = relay.Enqueue(ctx, w.pool, w.table, relay.Outgoing{Type: "refunds", Key: "r1", Payload: []byte(`{}`)})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return w.count(t, "type = 'refunds' AND status = 'ERROR'") == 1 }, 30*time.Second, 20*time.Millisecond)
	w.produce(t, "orders")

	codes := map[int]int{}
	for i := range 8 {
		flags := []string{"--sample", "1s"}
		if i%2 == 1 {
			flags = append(flags, "--json")
		}
		code, stdout, stderr := w.ctl(t, ctx, "status", flags...)
		codes[code]++
		if i%2 == 1 {
			var s jsonStatus
			require.NoError(t, json.Unmarshal([]byte(stdout), &s), stderr)
			require.Equal(t, "dead", s.Verdict, s.Summary)
			var dead *jsonHead
			for _, ty := range s.Types {
				if ty.Type == "refunds" {
					dead = ty.FirstDead
				}
			}
			require.NotNil(t, dead, stdout)
			require.Equal(t, 1, dead.AttemptsMade, "one attempt was made")
			require.True(t, dead.Permanent)
			require.Equal(t, ceiling, dead.Attempts, "the column keeps the ceiling, which makes it dead for the JVM too")
		} else {
			require.Contains(t, stdout, "died of a permanent failure after 1 attempt", stdout)
			require.NotContains(t, stdout, "failed 3 times")
		}
	}
	require.Equal(t, map[int]int{statusWarning: 8}, codes, "one code, call after call")
}

// TestStatusAfterTheLastRelayStops is issue 36's first scenario: rows keep
// arriving and the last relay of the app stops (a deploy gone wrong). Where
// status said OK for a minute, the first look after Stop says STALLED, and
// why: presence is let go before Stop returns.
func TestStatusAfterTheLastRelayStops(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := setup(t)
	cfg := w.cfg
	cfg.Interval = time.Second
	r, err := relay.New(w.pool, cfg, relay.SenderFunc("orders", func(context.Context, relay.Message) error { return nil }))
	require.NoError(t, err)
	require.NoError(t, r.Start(ctx))
	w.waitReplicas(t, 1)
	w.produce(t, "orders")
	require.Eventually(t, func() bool { return w.count(t, "status = 'SENT'") > 0 }, 30*time.Second, 20*time.Millisecond)
	code, stdout, _ := w.ctl(t, ctx, "status", "--sample", "500ms")
	require.Equal(t, statusOK, code, "delivering: %s", stdout)

	require.NoError(t, r.Stop(ctx))
	require.Eventually(t, func() bool { return w.count(t, "status = 'PENDING'") > 0 }, 30*time.Second, 20*time.Millisecond,
		"rows arrive with nobody to deliver them")
	code, stdout, _ = w.ctl(t, ctx, "status")
	require.Equal(t, statusCritical, code, stdout)
	require.True(t, strings.HasPrefix(stdout, "CRITICAL: orders: nothing delivered, oldest undelivered "), stdout)
	require.Contains(t, stdout, "\nSTALLED: Nothing is delivered because no relay of app", stdout)
}
