package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/xadm/relay"
	"github.com/xadm/relay/internal/testkit/pgserver"
)

// perfItem is one item of Nagios performance data:
// 'label'=value[UOM];[warn];[crit];[min];[max].
var perfItem = regexp.MustCompile(`^'[^'=|]+'=-?[0-9]+(\.[0-9]+)?(s|ms|%|B|c)?(;(-?[0-9]+(\.[0-9]+)?)?){0,4}$`)

// plugin splits status's text as a Nagios plugin's output: the first line,
// the details, and the performance data after the "|".
func plugin(t *testing.T, stdout string) (first string, details string, perf []string) {
	t.Helper()
	first, rest, _ := strings.Cut(stdout, "\n")
	require.LessOrEqual(t, len([]rune(first)), 120, "the first line fits an SMS: %q", first)
	require.NotContains(t, first, "|", "the first line is the verdict alone")
	details, perfText, found := strings.Cut(rest, "\n| ")
	require.True(t, found, "performance data after a |: %s", stdout)
	for _, item := range splitPerf(strings.TrimSpace(perfText)) {
		require.Regexp(t, perfItem, item, "perfdata item")
		perf = append(perf, item)
	}
	return first, details, perf
}

// splitPerf splits perfdata on the spaces between items (a quoted label
// may hold spaces).
func splitPerf(s string) []string {
	var out []string
	var b strings.Builder
	quoted := false
	for _, r := range s {
		switch {
		case r == '\'':
			quoted = !quoted
		case r == ' ' && !quoted:
			out = append(out, b.String())
			b.Reset()
			continue
		}
		b.WriteRune(r)
	}
	if b.Len() > 0 {
		out = append(out, b.String())
	}
	return out
}

// TestPagerReceiverStopped is issue 46's outage, as an on-call meets it: the
// only type's receiver stops while messages wait. status says WARNING once
// the oldest is older than -w, CRITICAL past -c, each time with a first line
// that names the type, the age and the cause, and perfdata that parses;
// once the receiver is back, OK.
func TestPagerReceiverStopped(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := setup(t)
	var down atomic.Bool
	receiver := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if down.Load() {
			http.Error(rw, "receiver stopped", http.StatusServiceUnavailable)
			return
		}
		rw.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(receiver.Close)
	orders, err := relay.NewHTTPSender(relay.HTTPSenderConfig{Type: "order", URL: relay.URLWithKey(receiver.URL + "/orders")})
	require.NoError(t, err)
	cfg := w.cfg
	cfg.Interval, cfg.MaxAttempts, cfg.RetryBackoff = 50*time.Millisecond, 1000, 100*time.Millisecond
	r, err := relay.New(w.pool, cfg, orders)
	require.NoError(t, err)
	require.NoError(t, r.Start(ctx))
	t.Cleanup(func() { _ = r.Stop(context.Background()) })
	w.waitReplicas(t, 1)

	down.Store(true)
	for i := range 5 {
		_, err := relay.Enqueue(ctx, w.pool, w.table, relay.Outgoing{Type: "order", Key: fmt.Sprint("o", i), Payload: []byte(`{}`)})
		require.NoError(t, err)
	}
	status := func() (int, string) {
		code, stdout, stderr := w.ctl(t, ctx, "status", "--sample", "0", "-w", "3s", "-c", "6s")
		require.Contains(t, []int{statusOK, statusWarning, statusCritical}, code, stdout+stderr)
		return code, stdout
	}
	code, stdout := status()
	require.Equal(t, statusOK, code, "young messages: no page yet: %s", stdout)

	var first string
	require.Eventually(t, func() bool { code, stdout = status(); return code == statusWarning }, 20*time.Second, 100*time.Millisecond)
	first, details, perf := plugin(t, stdout)
	require.Regexp(t, `^WARNING: order: oldest undelivered [3-5]s \(destination failing`, first)
	require.Contains(t, details, "\nLATE: Users are waiting: ")
	require.Contains(t, perf[0], "'order age'=")
	require.Contains(t, perf[0], ";3;6;0")

	require.Eventually(t, func() bool { code, stdout = status(); return code == statusCritical }, 20*time.Second, 100*time.Millisecond)
	first, _, _ = plugin(t, stdout)
	require.Regexp(t, `^CRITICAL: order: oldest undelivered [6-9]s \(destination failing`, first)
	var s jsonStatus
	_, js, _ := w.ctl(t, ctx, "status", "--sample", "0", "-w", "3s", "-c", "6s", "--json")
	require.NoError(t, json.Unmarshal([]byte(js), &s))
	require.Equal(t, "CRITICAL", s.State)
	require.Equal(t, statusCritical, s.ExitCode)
	require.Equal(t, "late", s.Verdict)
	require.GreaterOrEqual(t, s.AgeSeconds, 6.0)
	require.Equal(t, "CRITICAL", s.Types[0].State)
	require.Contains(t, s.Types[0].Cause, "destination failing")
	require.True(t, strings.HasPrefix(s.FirstLine, "CRITICAL: order: oldest undelivered "), s.FirstLine)

	down.Store(false)
	require.Eventually(t, func() bool { code, stdout = status(); return code == statusOK }, 30*time.Second, 100*time.Millisecond,
		"the receiver is back: the backlog drains and the page ends")
	require.True(t, strings.HasPrefix(stdout, "OK: nothing waits to be delivered"), stdout)
}

// TestPagerLockedTable: a migration holds the table ACCESS EXCLUSIVE; status
// answers UNKNOWN (exit 3) within 15 s with the defaults, naming the lock and
// its holder, where it used to hang.
func TestPagerLockedTable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := setup(t)
	w.rows(t, "order", 2, "PENDING", 0, time.Second)
	conn, err := pgx.Connect(ctx, pgserver.Shared().URL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	_, err = tx.Exec(ctx, "LOCK TABLE "+pgx.Identifier{w.table}.Sanitize()+" IN ACCESS EXCLUSIVE MODE")
	require.NoError(t, err)
	var pid int
	require.NoError(t, tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid))

	start := time.Now()
	code, stdout, stderr := w.ctl(t, ctx, "status")
	took := time.Since(start)
	t.Logf("status beside an ACCESS EXCLUSIVE lock: exit %d after %s: %s", code, took.Round(time.Millisecond), strings.TrimSpace(stdout))
	require.Equal(t, statusUnknown, code, stdout+stderr)
	require.Less(t, took, 15*time.Second)
	require.Regexp(t, `^UNKNOWN: `+w.table+` is locked: waited 3s for it; ACCESS EXCLUSIVE held by pid `+fmt.Sprint(pid), stdout)
	require.LessOrEqual(t, len([]rune(strings.SplitN(stdout, "\n", 2)[0])), 120)
}

// TestPagerSilentServer: a server that accepts connections and never
// answers. status answers UNKNOWN within its timeout, saying it waited for
// the connection; and so through a proxy that stops forwarding.
func TestPagerSilentServer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := setup(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		var held []net.Conn
		defer func() {
			for _, c := range held {
				_ = c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held = append(held, c) // accepted, never answered
		}
	}()
	silent := fmt.Sprintf("postgres://relay@%s/relay?sslmode=disable", ln.Addr())
	proxy, viaProxy, err := pgserver.ProxyURL(pgserver.Shared().URL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = proxy.Close() })
	proxy.Freeze()

	for _, url := range []string{silent, viaProxy} {
		start := time.Now()
		code, stdout, stderr := w.ctl(t, ctx, "status", "--database-url", url)
		took := time.Since(start)
		t.Logf("status against a silent server: exit %d after %s: %s", code, took.Round(time.Millisecond), strings.TrimSpace(stdout))
		require.Equal(t, statusUnknown, code, stdout+stderr)
		require.Less(t, took, 15*time.Second)
		require.True(t, strings.HasPrefix(stdout, "UNKNOWN: no answer within 10s while "), stdout)
	}
	proxy.Thaw()
}

// TestPagerOtherAppsRelaysDown is issue 46's second scenario: apps A and B
// share a table; B's relay ran once (so the registry knows its type) and is
// stopped. A's status counts none of B's rows, A's dead and re-queue leave
// them alone and say whose they are (a re-queue by id of B's row exits
// non-zero), unless the operator names B and confirms.
func TestPagerOtherAppsRelaysDown(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := setup(t)
	cfgB := w.cfg
	cfgB.AppName = w.app + "_billing"
	rb := w.startRelay(t, cfgB, "invoice")
	ra := w.startRelay(t, w.cfg, "order")
	require.Eventually(t, func() bool {
		owners, err := w.admin(t).Owners(ctx)
		require.NoError(t, err)
		return len(owners) == 2
	}, 10*time.Second, 10*time.Millisecond, "both apps registered their types")
	require.NoError(t, rb.Stop(ctx))
	require.NoError(t, ra.Stop(ctx))

	w.rows(t, "invoice", 4, "PENDING", 0, time.Hour) // B's backlog: an hour old, nobody to deliver it
	w.rows(t, "invoice", 1, "ERROR", ceiling, time.Hour)
	w.rows(t, "order", 1, "SENT", 0, time.Minute)
	w.rows(t, "invoice", 2, "SENT", 0, 40*24*time.Hour)
	var bid int64
	require.NoError(t, w.pool.QueryRow(ctx, fmt.Sprintf("SELECT id FROM %q WHERE type = 'invoice' AND status = 'ERROR'", w.table)).Scan(&bid))

	code, stdout, _ := w.ctl(t, ctx, "status", "--sample", "0")
	require.Equal(t, statusOK, code, "B's outage is not A's page: %s", stdout)
	require.True(t, strings.HasPrefix(stdout, "OK: nothing waits to be delivered\n"), stdout)
	require.Contains(t, stdout, fmt.Sprintf("not counted: \"invoice\", app %q's: 4 waiting, 1 dead", cfgB.AppName))

	code, stdout, _ = w.ctl(t, ctx, "dead")
	require.Equal(t, exitOK, code)
	require.Regexp(t, fmt.Sprintf(`%d\s+invoice\s+%s\s`, bid, regexp.QuoteMeta(cfgB.AppName)), stdout, "dead marks each row's app")
	require.NotContains(t, stdout, fmt.Sprintf("relayctl requeue --id %d", bid), "it suggests no re-queue of another app's row")

	code, stdout, stderr := w.ctl(t, ctx, "requeue", "--id", fmt.Sprint(bid), "--yes")
	require.Equal(t, exitError, code, stdout+stderr)
	require.Contains(t, stdout+stderr, fmt.Sprintf("row %d (type \"invoice\") is app %q's, not %q's; its relays are down", bid, cfgB.AppName, w.app))
	code, stdout, stderr = w.ctl(t, ctx, "requeue", "--all", "--types", "invoice", "--yes")
	require.Equal(t, exitError, code, stdout+stderr)
	require.Contains(t, stdout+stderr, "gives \"invoice\" to app")
	require.Equal(t, 1, w.count(t, "type = 'invoice' AND status = 'ERROR' AND attempts > 0"), "B's dead row untouched")
	code, stdout, stderr = w.ctl(t, ctx, "purge", "--older-than", "0", "--all-types", "--yes")
	require.Equal(t, exitOK, code, stdout+stderr)
	require.Contains(t, stderr, `but "invoice", another app's by the registry of types (app "`+cfgB.AppName+`")`)
	require.Equal(t, 2, w.count(t, "type = 'invoice' AND status = 'SENT'"), "B's history untouched")
	require.Equal(t, 0, w.count(t, "type = 'order' AND status = 'SENT'"), "A's own purged")

	// The operator takes B's rows over, naming B; the confirmation says so.
	code, stdout, stderr = w.ctl(t, ctx, "requeue", "--id", fmt.Sprint(bid), "--other-app", cfgB.AppName, "--yes")
	require.Equal(t, exitOK, code, stdout+stderr)
	require.Contains(t, stderr, fmt.Sprintf("rows of app %q", cfgB.AppName))
	require.Equal(t, 1, w.count(t, "type = 'invoice' AND status = 'ERROR' AND attempts = 0"), "re-queued: failed with 0 attempts")

	// B's own status pages for its backlog while its relays are down.
	code, stdout, _ = w.ctl(t, ctx, "status", "--sample", "0", "--app", cfgB.AppName)
	require.Equal(t, statusCritical, code, stdout)
	require.True(t, strings.HasPrefix(stdout, "CRITICAL: invoice: "), stdout)
}

// TestPagerOverlap: apps orders and orders-v2 both have a sender for "y" on
// one table, a rename in a rolling deploy. The status of either is WARNING
// (OVERLAP) while it lasts, and names both apps; who says which yields.
func TestPagerOverlap(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := setup(t)
	renamed := w.cfg
	renamed.AppName = w.app + "-v2"
	w.startRelay(t, w.cfg, "y")
	w.waitReplicas(t, 1)
	w.startRelay(t, renamed, "y")
	var stdout string
	// The second app is listed once it holds its presence, and says it
	// yields once its claim of its types, which follows, has decided.
	require.Eventually(t, func() bool {
		var code int
		code, stdout, _ = w.ctl(t, ctx, "status", "--sample", "0")
		return code == statusWarning && strings.Contains(stdout, "(yields it)")
	}, 10*time.Second, 50*time.Millisecond)
	first, details, _ := plugin(t, stdout)
	require.Equal(t, "WARNING: type y served by two apps on "+w.table, first)
	require.Contains(t, details, fmt.Sprintf(`type "y" by apps %q (delivers it) and %q (yields it)`, w.app, renamed.AppName))

	code, stdout, _ := w.ctl(t, ctx, "status", "--sample", "0", "--app", renamed.AppName)
	require.Equal(t, statusWarning, code, stdout)
	require.Contains(t, stdout, fmt.Sprintf(`type "y" by apps %q (yields it) and %q (delivers it)`, renamed.AppName, w.app))
	require.NotRegexp(t, `\ny\s+OK`, stdout, "the yielding app does not count the type: the other app delivers it")

	_, stdout, _ = w.ctl(t, ctx, "who", "--app", renamed.AppName)
	require.Contains(t, stdout, fmt.Sprintf(`yields "y" to app %q`, w.app))
}

// TestPagerThresholdsFromEnv: RELAY_STATUS_WARNING and RELAY_STATUS_CRITICAL
// set the thresholds, per type too, and the flags win; a warning above the
// critical threshold, or an age that is none, is a usage error (UNKNOWN).
func TestPagerThresholdsFromEnv(t *testing.T) {
	ctx := context.Background()
	w := setup(t)
	w.rows(t, "order", 1, "PENDING", 0, 10*time.Second)
	w.startRelay(t, w.cfg, "invoice") // a live relay: "order" is unserved, but young
	w.waitReplicas(t, 1)
	t.Setenv(envWarning, "1h,order=5s")
	t.Setenv(envCritical, "2h")
	code, stdout, _ := w.ctl(t, ctx, "status", "--sample", "0", "--json")
	var s jsonStatus
	require.NoError(t, json.Unmarshal([]byte(stdout), &s))
	require.Equal(t, 3600.0, s.Thresholds.WarningSeconds)
	require.Equal(t, 7200.0, s.Thresholds.CriticalSeconds)
	require.Equal(t, jsonThreshold{5, 7200}, s.Thresholds.PerType["order"])
	require.Equal(t, statusCritical, code, "unserved: STALLED, whatever the age")

	code, _, stderr := w.ctl(t, ctx, "status", "--sample", "0", "-w", "3h")
	require.Equal(t, statusUnknown, code)
	require.Contains(t, stderr, "the warning threshold (3h0m0s) is above the critical one (2h0m0s)")
	code, _, stderr = w.ctl(t, ctx, "status", "--sample", "0", "-c", "soon")
	require.Equal(t, statusUnknown, code)
	require.Contains(t, stderr, `"soon" is not an age`)
	t.Setenv(envTimeout, "never")
	code, _, stderr = w.ctl(t, ctx, "status", "--sample", "0")
	require.Equal(t, statusUnknown, code)
	require.Contains(t, stderr, "RELAY_STATUS_TIMEOUT")
}
