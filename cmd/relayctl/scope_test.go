package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/xadm/relay"
	"github.com/xadm/relay/internal/testkit/pgserver"
)

// TestAnotherAppsLiveRows is issue 36's scenario through relayctl: app B runs
// with MaxAttempts 1000 and one of its rows failed 50 times; app A has no
// live relay and a ceiling of 3. No verb of A, whatever types it names,
// touches B's rows: without types it asks for them, naming B's type is
// refused, every type leaves B's out, and says so.
func TestAnotherAppsLiveRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := setup(t)
	cfgB := w.cfg
	cfgB.AppName, cfgB.MaxAttempts, cfgB.Interval = w.app+"_b", 1000, time.Hour
	rb, err := relay.New(w.pool, cfgB, relay.SenderFunc("tb", func(context.Context, relay.Message) error { return errors.New("503") }))
	require.NoError(t, err)
	require.NoError(t, rb.Start(ctx))
	t.Cleanup(func() { _ = rb.Stop(context.Background()) })
	require.Eventually(t, func() bool {
		others, err := w.admin(t).OtherReplicas(ctx)
		require.NoError(t, err)
		return len(others) == 1 && others[0].Serves("tb")
	}, 10*time.Second, 10*time.Millisecond)
	w.rows(t, "tb", 1, "ERROR", 50, time.Minute)
	w.rows(t, "tb", 1, "SENT", 0, 40*24*time.Hour)
	w.rows(t, "ta", 1, "ERROR", ceiling, time.Minute)
	var bid int64
	require.NoError(t, w.pool.QueryRow(ctx, fmt.Sprintf("SELECT id FROM %q WHERE type = 'tb' AND status = 'ERROR'", w.table)).Scan(&bid))
	untouched := func(t *testing.T) {
		t.Helper()
		require.Equal(t, 1, w.count(t, "type = 'tb' AND status = 'ERROR' AND attempts >= 50"), "B's row is as B's relay keeps it")
		require.Equal(t, 1, w.count(t, "type = 'tb' AND status = 'SENT'"), "B's history is B's")
	}

	for _, tc := range []struct {
		name  string
		cmd   string
		flags []string
		code  int
		want  string
	}{
		{"RequeueAllNoTypes", "requeue", []string{"--all"}, exitUsage, "--types a,b"},
		{"RequeueIDNoTypes", "requeue", []string{"--id", fmt.Sprint(bid)}, exitUsage, "--types a,b"},
		{"PurgeNoTypes", "purge", []string{"--older-than", "0"}, exitUsage, "--all-types"},
		{"RequeueAllNamed", "requeue", []string{"--all", "--types", "tb"}, exitError, `live relays of app "` + cfgB.AppName + `" serve "tb"`},
		{"RequeueTypeNamed", "requeue", []string{"--type", "tb", "--types", "tb,ta"}, exitError, `serve "tb"`},
		{"RequeueIDNamed", "requeue", []string{"--id", fmt.Sprint(bid), "--types", "tb"}, exitError, `serve "tb"`},
		{"PurgeNamed", "purge", []string{"--older-than", "0", "--types", "tb"}, exitError, `serve "tb"`},
		{"RequeueTypeAllTypes", "requeue", []string{"--type", "tb", "--all-types"}, exitError, "only that app re-queues its rows"},
		{"RequeueIDAllTypes", "requeue", []string{"--id", fmt.Sprint(bid), "--all-types"}, exitError, `(type "tb") is app "` + cfgB.AppName + `"'s`},
		{"PurgeAllTypes", "purge", []string{"--older-than", "0", "--all-types"}, exitOK, "purged 0 SENT row(s)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := w.ctl(t, ctx, tc.cmd, append(tc.flags, "--yes")...)
			require.Equal(t, tc.code, code, "stdout %q stderr %q", stdout, stderr)
			require.Contains(t, stdout+stderr, tc.want)
			untouched(t)
		})
	}
	// Every type says whose types it leaves out, and re-queues A's own.
	code, stdout, stderr := w.ctl(t, ctx, "requeue", "--all", "--all-types", "--yes")
	require.Equal(t, exitOK, code, stderr)
	require.Contains(t, stderr, `every type (all apps' rows) but "tb", served by live relays of app "`+cfgB.AppName+`"`)
	require.Contains(t, stdout, "re-queued 1 dead row(s)")
	require.Equal(t, 1, w.count(t, "type = 'ta' AND status = 'ERROR' AND attempts = 0"), "re-queued: failed with 0 attempts")
	untouched(t)

	// status of A counts none of B's rows and names them.
	code, stdout, _ = w.ctl(t, ctx, "status", "--sample", "0")
	require.Contains(t, stdout, `Not counted here: the rows of "tb"`)
	require.Contains(t, stdout, `other app: app "`+cfgB.AppName+`" serves "tb" here`)
	require.NotEqual(t, statusWarning, code, "B's dead-looking row is not A's: %s", stdout)
	require.False(t, strings.Contains(stdout, "Besides,"), stdout)
}

// TestConfirmation: requeue and purge say what they would change and ask on
// a terminal; "y" acts, anything else does nothing (exit 1); without a
// terminal they refuse unless --yes (exit 2), and --yes acts without asking.
func TestConfirmation(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := setup(t)
	w.rows(t, "orders", 2, "ERROR", ceiling, time.Minute)
	w.rows(t, "orders", 3, "SENT", 0, 40*24*time.Hour)
	ask := func(answer string, terminal bool, cmd string, flags ...string) (int, string, string) {
		var out, errOut strings.Builder
		args := append([]string{cmd, "--database-url", dsn(), "--app", w.app, "--table", w.table,
			"--max-attempts", fmt.Sprint(ceiling), "--all-types"}, flags...)
		code := runWith(ctx, args, input{r: strings.NewReader(answer), terminal: terminal}, &out, &errOut)
		return code, out.String(), errOut.String()
	}

	for _, tc := range []struct {
		cmd   string
		flags []string
		says  []string
	}{
		{"requeue", []string{"--all"}, []string{"re-queue 2 dead row(s)", "  2  orders", "Re-queue these 2 row(s)? [y/N] "}},
		{"purge", []string{"--older-than", "30d"}, []string{"delete 3 SENT row(s)", "(more than 30d ago)", "  3  orders", "Delete them? [y/N] "}},
	} {
		code, _, stderr := ask("", false, tc.cmd, tc.flags...)
		require.Equal(t, exitUsage, code, stderr)
		require.Contains(t, stderr, "stdin is not a terminal to answer on; pass --yes")
		code, _, stderr = ask("n\n", true, tc.cmd, tc.flags...)
		require.Equal(t, exitError, code, stderr)
		for _, s := range tc.says {
			require.Contains(t, stderr, s)
		}
		require.Contains(t, stderr, "not confirmed: nothing done")
		require.Equal(t, 2, w.count(t, "status = 'ERROR'"), "nothing re-queued")
		require.Equal(t, 3, w.count(t, "status = 'SENT'"), "nothing purged")
	}

	code, stdout, stderr := ask("y\n", true, "requeue", "--id", "1,2")
	require.Equal(t, exitOK, code, stderr)
	require.Contains(t, stderr, "  id 1  orders  3: PUT http://dest/orders")
	require.Contains(t, stdout, "re-queued 2 of the 2 row(s) given")
	code, stdout, stderr = ask("", false, "purge", "--older-than", "30d", "--yes")
	require.Equal(t, exitOK, code, stderr)
	require.NotContains(t, stderr, "[y/N]", "--yes asks nothing")
	require.Contains(t, stdout, "purged 3 SENT row(s)")
	require.Contains(t, stdout, "delivered more than 30d ago", "the age as it was given")

	code, stdout, _ = ask("", false, "purge", "--older-than", "1000d", "--dry-run")
	require.Equal(t, exitOK, code)
	require.Contains(t, stdout, "purge --older-than 1000d would delete 0 SENT row(s)", "not 24000h0m0s")
}

// dsn is the tests' database.
func dsn() string { return pgserver.Shared().URL }
