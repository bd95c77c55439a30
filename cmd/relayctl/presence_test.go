package main

import (
	"context"
	"encoding/json"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/xadm/relay"
)

// startRelay starts a relay of w's app serving types, delivering nothing
// anywhere (its senders succeed), until the test ends.
func (w *world) startRelay(t *testing.T, cfg relay.Config, types ...string) *relay.Relay {
	t.Helper()
	var senders []relay.Sender
	for _, typ := range types {
		senders = append(senders, relay.SenderFunc(typ, func(context.Context, relay.Message) error { return nil }))
	}
	r, err := relay.New(w.pool, cfg, senders...)
	require.NoError(t, err)
	require.NoError(t, r.Start(context.Background()))
	t.Cleanup(func() { _ = r.Stop(context.Background()) })
	return r
}

func (w *world) waitReplicas(t *testing.T, n int) {
	t.Helper()
	a := w.admin(t)
	require.Eventually(t, func() bool {
		reps, err := a.Replicas(context.Background())
		require.NoError(t, err)
		return len(reps) == n
	}, 10*time.Second, 10*time.Millisecond)
}

// TestStatusUnservedType is issue 18's scenario: a relay serving only
// "order" runs and delivers; one "invoice" row written by another producer
// waits. Before presence, status said OK for a minute and then blamed the
// election ("no relay takes the election"). Now the first look names the
// type no live replica serves, with its count and age, and exits 2 (CRITICAL).
func TestStatusUnservedType(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := setup(t)
	cfg := w.cfg
	cfg.Interval = 50 * time.Millisecond
	w.startRelay(t, cfg, "order")
	w.waitReplicas(t, 1)
	w.rows(t, "order", 3, "PENDING", 0, 0)
	w.rows(t, "invoice", 1, "PENDING", 0, 5*time.Second) // younger than --stall-after: presence alone tells
	require.Eventually(t, func() bool { return w.count(t, "type = 'order' AND status = 'SENT'") == 3 }, 10*time.Second, 10*time.Millisecond,
		"the relay delivers its own type")

	code, stdout, stderr := w.ctl(t, ctx, "status", "--sample", "0")
	require.Equal(t, statusCritical, code, stdout+stderr)
	require.Contains(t, stdout, `Rows of type "invoice" wait and no running relay of app`)
	require.Contains(t, stdout, `"invoice": 1 row(s), the oldest`)
	require.Contains(t, stdout, `serve "order"`)
	require.NotContains(t, stdout, "takes the election")
	require.Contains(t, stdout, "replicas: 1 relay(s) of app")

	code, stdout, _ = w.ctl(t, ctx, "status", "--sample", "0", "--json")
	require.Equal(t, statusCritical, code)
	var st struct {
		Cause    string `json:"cause"`
		Replicas []struct {
			Types []string `json:"types"`
		} `json:"replicas"`
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &st))
	require.Equal(t, "type-unserved", st.Cause)
	require.Len(t, st.Replicas, 1)
	require.Equal(t, []string{"order"}, st.Replicas[0].Types)
}

// TestStatusNoRelayRunning: rows wait too long and no relay of the app runs.
func TestStatusNoRelayRunning(t *testing.T) {
	t.Parallel()
	w := setup(t)
	w.rows(t, "order", 2, "PENDING", 0, 5*time.Minute)
	code, stdout, _ := w.ctl(t, context.Background(), "status", "--sample", "0", "--json")
	require.Equal(t, statusCritical, code)
	var st struct {
		Cause, Summary string
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &st))
	require.Equal(t, "no-relay-running", st.Cause)
	require.Contains(t, st.Summary, "no relay of app")
}

// TestWhoListsReplicas: who lists every live replica, partitioned ones
// included, with its types; a stopped one is gone.
func TestWhoListsReplicas(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := setup(t)
	w.startRelay(t, w.cfg, "order")
	parted := w.cfg
	parted.Partitions = 4
	r2 := w.startRelay(t, parted, "order", "invoice")
	w.waitReplicas(t, 2)

	code, stdout, _ := w.ctl(t, ctx, "who")
	require.Equal(t, exitOK, code)
	require.Contains(t, stdout, "replicas: 2 relay(s) of app")
	require.Contains(t, stdout, `types "order", MaxAttempts 3`)
	require.Contains(t, stdout, `types "invoice", "order", MaxAttempts 3`)

	require.NoError(t, r2.Stop(ctx))
	code, stdout, _ = w.ctl(t, ctx, "who", "--json")
	require.Equal(t, exitOK, code)
	var who struct {
		Replicas []struct {
			Partitions int      `json:"partitions"`
			Types      []string `json:"types"`
		} `json:"replicas"`
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &who))
	require.Len(t, who.Replicas, 1, "the stopped replica is gone")
	require.Equal(t, 1, who.Replicas[0].Partitions)
}

// TestDeadShowsPermanent: a row that died of a permanent failure shows as
// "permanent, 1 attempt", not as its attempts at the ceiling.
func TestDeadShowsPermanent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := setup(t)
	w.rows(t, "order", 1, "ERROR", ceiling, time.Minute)
	w.exec(t, "UPDATE %s SET last_error = 'permanent after 1 attempt(s): PUT http://dest/order: 400 Bad Request'")
	code, stdout, _ := w.ctl(t, ctx, "dead")
	require.Equal(t, exitOK, code)
	require.Contains(t, stdout, "permanent, 1 attempt")
	code, stdout, _ = w.ctl(t, ctx, "dead", "--json")
	require.Equal(t, exitOK, code)
	require.Contains(t, stdout, `"permanent": true`)
	require.Contains(t, stdout, `"attempts_made": 1`)
	code, stdout, _ = w.ctl(t, ctx, "status", "--sample", "0")
	require.Equal(t, statusWarning, code)
	require.Contains(t, stdout, "died of a permanent failure after 1 attempt")
	require.NotContains(t, stdout, "reached MaxAttempts (3) after")
}

// TestStatusMissingIndexes: status names the relay's indexes the table lacks
// and the statements that add them.
func TestStatusMissingIndexes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := setup(t)
	_, err := w.pool.Exec(ctx, "DROP INDEX "+pgx.Identifier{w.table + "_outbox_pending"}.Sanitize())
	require.NoError(t, err)
	code, stdout, _ := w.ctl(t, ctx, "status", "--sample", "0")
	require.Equal(t, exitOK, code)
	require.Contains(t, stdout, "indexes:  MISSING 1 of the relay's indexes; add them with:")
	require.Contains(t, stdout, "CREATE INDEX IF NOT EXISTS \""+w.table+"_outbox_pending\"")
	code, stdout, _ = w.ctl(t, ctx, "status", "--sample", "0", "--json")
	require.Equal(t, exitOK, code)
	var st struct {
		Missing []struct{ Name, Statement string } `json:"missing_indexes"`
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &st))
	require.Len(t, st.Missing, 1)
	require.Equal(t, w.table+"_outbox_pending", st.Missing[0].Name)
}

// TestStatusPausedType is issue 34's visibility: a relay pauses "order",
// whose receiver keeps failing, and goes on delivering "invoice". status
// and who name the paused type, the replica, the reason and the probe's
// time; the paused rows wait for their destination, not for the relays:
// OK, not STALLED, though they were written five minutes ago.
func TestStatusPausedType(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := setup(t)
	cfg := w.cfg
	cfg.Interval, cfg.PauseAfter, cfg.RetryBackoff = 50*time.Millisecond, 2, time.Hour
	r, err := relay.New(w.pool, cfg,
		relay.SenderFunc("order", func(context.Context, relay.Message) error {
			return errors.New("PUT http://orders/1: 503 Service Unavailable")
		}),
		relay.SenderFunc("invoice", func(context.Context, relay.Message) error { return nil }))
	require.NoError(t, err)
	w.rows(t, "order", 4, "PENDING", 0, 5*time.Minute)
	w.rows(t, "invoice", 3, "PENDING", 0, 5*time.Minute)
	require.NoError(t, r.Start(ctx))
	t.Cleanup(func() { _ = r.Stop(context.Background()) })
	a := w.admin(t)
	require.Eventually(t, func() bool {
		reps, err := a.Replicas(ctx)
		require.NoError(t, err)
		return len(reps) == 1 && len(reps[0].Paused) == 1
	}, 20*time.Second, 20*time.Millisecond, "presence says the pause")
	require.Eventually(t, func() bool { return w.count(t, "type = 'invoice' AND status = 'SENT'") == 3 }, 20*time.Second, 10*time.Millisecond,
		"the other type goes on")

	// Past the warning threshold, the paused type pages: its messages have
	// waited five minutes, whatever for; the first line says why.
	code, stdout, stderr := w.ctl(t, ctx, "status", "--sample", "0")
	require.Equal(t, statusWarning, code, stdout+stderr)
	require.Regexp(t, `^WARNING: order: oldest undelivered 5m0\ds \(destination failing since \d\d:\d\dZ, type paused\)\n`, stdout)
	require.Contains(t, stdout, `type(s) a relay paused because their destination keeps failing: "order" (4 row(s); paused by replica `)
	// Below it, the pause alone is no page.
	code, stdout, stderr = w.ctl(t, ctx, "status", "--sample", "0", "-w", "10m", "-c", "20m")
	require.Equal(t, exitOK, code, stdout+stderr)
	require.Contains(t, stdout, `type(s) a relay paused because their destination keeps failing: "order" (4 row(s); paused by replica `)
	require.Contains(t, stdout, "503 Service Unavailable")
	require.Contains(t, stdout, `paused "order"`, "the replica's line")

	code, stdout, _ = w.ctl(t, ctx, "who", "--json")
	require.Equal(t, exitOK, code)
	var who struct {
		Replicas []struct {
			Paused []struct {
				Type   string    `json:"type"`
				Reason string    `json:"reason"`
				Until  time.Time `json:"until"`
			} `json:"paused"`
		} `json:"replicas"`
	}
	require.NoError(t, json.Unmarshal([]byte(stdout), &who))
	require.Len(t, who.Replicas, 1)
	require.Len(t, who.Replicas[0].Paused, 1)
	p := who.Replicas[0].Paused[0]
	require.Equal(t, "order", p.Type)
	require.Contains(t, p.Reason, "503 Service Unavailable")
	require.False(t, p.Until.IsZero(), "when it is probed")
	require.Equal(t, 4, w.count(t, "type = 'order' AND status <> 'SENT' AND attempts < 3"), "pausing is not failing: nothing died")
}

// TestStatusStuckSend is issue 45's last case: Concurrency 1, and one Send
// (key "order-1") that ignores its context and never returns. The relay
// gives it up at SendTimeout: the type's other keys are still delivered,
// the stuck key's next message waits behind it, and status is not OK: the
// first line names the stuck Send, the words say which type, on which
// replica, since when and what to do.
func TestStatusStuckSend(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := setup(t)
	cfg := w.cfg
	cfg.Concurrency, cfg.Interval, cfg.SendTimeout, cfg.RetryBackoff = 1, 50*time.Millisecond, 100*time.Millisecond, 0
	release := make(chan struct{})
	t.Cleanup(func() { close(release) }) // after Stop: the stuck goroutine returns
	var stuckCalls atomic.Int32
	r, err := relay.New(w.pool, cfg,
		relay.SenderFunc("order", func(_ context.Context, m relay.Message) error {
			if m.Key == "order-1" {
				stuckCalls.Add(1)
				<-release // ignores its context
			}
			return nil
		}))
	require.NoError(t, err)
	w.rows(t, "order", 1, "PENDING", 0, 0)                                                     // order-1's first message: stuck
	w.exec(t, `INSERT INTO %s (type, natural_key, payload) VALUES ('order', 'order-1', '{}')`) // its second: waits
	w.rows(t, "order", 6, "PENDING", 0, 0)                                                     // order-1..6 again: order-1's third, and five other keys
	require.NoError(t, r.Start(ctx))
	t.Cleanup(func() { _ = r.Stop(context.Background()) })

	require.Eventually(t, func() bool { return w.count(t, "natural_key <> 'order-1' AND status = 'SENT'") == 5 }, 20*time.Second, 10*time.Millisecond,
		"the type's other keys are delivered past the stuck Send, with one worker")
	require.Eventually(t, func() bool {
		reps, err := w.admin(t).Replicas(ctx)
		require.NoError(t, err)
		return len(reps) == 1 && len(reps[0].Stuck) == 1
	}, 20*time.Second, 20*time.Millisecond, "presence says the stuck Send")
	require.Equal(t, int32(1), stuckCalls.Load(), "the stuck key's next messages wait behind it: no second Send of order-1")
	require.Zero(t, w.count(t, "natural_key = 'order-1' AND status = 'SENT'"))

	code, stdout, stderr := w.ctl(t, ctx, "status", "--sample", "0")
	require.Equal(t, statusWarning, code, stdout+stderr)
	require.Regexp(t, `^WARNING: 1 stuck Send\(s\) of order: a Sender ignores its context\n`, stdout)
	require.Regexp(t, `1 Send\(s\) of "order" on replica \S+, the oldest since \d\d:\d\dZ`, stdout)
	require.Contains(t, stdout, "The Sender must return when its context ends")
	require.Contains(t, stdout, "'order stuck'=1;;;0", "perfdata")
	require.Contains(t, stdout, "stuck Sends since", "the type's line names the cause")

	code, stdout, _ = w.ctl(t, ctx, "status", "--sample", "0", "--json")
	require.Equal(t, statusWarning, code)
	require.Contains(t, stdout, `"verdict": "stuck"`)
	require.Contains(t, stdout, `"cause": "stuck-sends"`)
}
