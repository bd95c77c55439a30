package relay_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/xadm/relay"
)

// The Admin's scope (admin_scope.go): the types an Admin acts on, learnt
// from its app's live relays, and the rows of another app's live relays,
// which it never touches.

// TestAdminActsOnItsAppsTypes: two apps share a table. The Admin of app A
// learns A's types from A's live relay and re-queues and purges only them;
// app B's dead and SENT rows are left alone. Without a live relay and
// without types named it writes nothing, and says why; and it refuses a
// re-queue when the live relays' MaxAttempts is not its own.
func TestAdminActsOnItsAppsTypes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	cfgA := b.cfg
	cfgA.MaxAttempts = adminCeiling

	admin, err := relay.NewAdmin(b.pool, cfgA)
	require.NoError(t, err)
	scope, err := admin.Scope(ctx)
	require.NoError(t, err)
	require.True(t, scope.Unknown && !scope.All, "no live relay of A: nothing tells its types")
	require.ErrorIs(t, scope.Err(), relay.ErrScopeUnknown)
	require.Contains(t, scope.String(), "no type: no live relay of the app")

	ids := b.insert(t, "order", "a-dead", "a-sent")
	bids := b.insert(t, "invoice", "b-dead", "b-sent")
	b.exec(t, "UPDATE %s SET status = 'ERROR', attempts = $2, last_error = 'boom' WHERE id = ANY($1)", []int64{ids[0], bids[0]}, adminCeiling)
	b.exec(t, "UPDATE %s SET status = 'SENT', sent_at = now() - interval '2 days' WHERE id = ANY($1)", []int64{ids[1], bids[1]})
	for name, write := range map[string]func() error{
		"RequeueAll":  func() error { _, err := admin.RequeueAll(ctx); return err },
		"RequeueType": func() error { _, err := admin.RequeueType(ctx, "invoice"); return err },
		"RequeueIDs":  func() error { _, err := admin.RequeueIDs(ctx, bids[0]); return err },
		"PurgeSent":   func() error { _, err := admin.PurgeSent(ctx, 0); return err },
		"Estimate":    func() error { _, err := admin.EstimatePurge(ctx, 0); return err },
	} {
		err := write()
		require.ErrorIs(t, err, relay.ErrScopeUnknown, name)
		require.ErrorContains(t, err, "relayctl --types", name)
	}
	require.Equal(t, "ERROR", b.state(t, bids[0]).Status, "nothing written without a scope")
	require.True(t, b.rowExists(t, bids[1]))

	// A's relay serves "order" but delivers nothing here: Enabled stays on for
	// its presence, the sender refuses so a re-queued row dies again slowly.
	cfgA.Interval = time.Hour
	ra := b.newRelay(t, cfgA, newRecorder("order", nil))
	startRelay(t, ra)
	require.Eventually(t, func() bool { return len(replicasOf(t, admin)) == 1 }, 10*time.Second, 10*time.Millisecond)

	scope, err = admin.Scope(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{"order"}, scope.Types)
	require.Contains(t, scope.String(), `"order" (live replicas)`)

	n, err := admin.RequeueAll(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, n, "only A's dead row")
	require.Zero(t, b.state(t, ids[0]).Attempts, "A's dead row re-queued: 0 attempts")
	require.Equal(t, adminCeiling, b.state(t, bids[0]).Attempts, "B's dead row is left alone")
	_, err = admin.RequeueType(ctx, "invoice")
	require.ErrorContains(t, err, `type "invoice" is not among the types this Admin acts on`)
	n, err = admin.RequeueIDs(ctx, bids[0])
	require.NoError(t, err)
	require.Zero(t, n)
	n, err = admin.PurgeSent(ctx, time.Hour)
	require.NoError(t, err)
	require.EqualValues(t, 1, n, "only A's SENT row")
	require.True(t, b.rowExists(t, bids[1]))

	// Asked explicitly, an Admin acts on every type.
	all, err := relay.NewAdmin(b.pool, cfgA, relay.AdminAllTypes())
	require.NoError(t, err)
	n, err = all.RequeueIDs(ctx, bids[0])
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	_, err = relay.NewAdmin(b.pool, cfgA, relay.AdminAllTypes(), relay.AdminTypes("x"))
	require.Error(t, err)
	_, err = relay.NewAdmin(b.pool, cfgA, relay.AdminTypes(" "))
	require.ErrorContains(t, err, "AdminTypes")

	// An Admin whose ceiling is not the live relays' refuses to re-queue.
	cfgHigh := cfgA
	cfgHigh.MaxAttempts = 1000
	high, err := relay.NewAdmin(b.pool, cfgHigh, relay.AdminTypes("order"))
	require.NoError(t, err)
	_, err = high.RequeueAll(ctx)
	require.ErrorIs(t, err, relay.ErrCeilingDiffers)
	require.ErrorContains(t, err, "MaxAttempts 3")
}

// TestAdminNeverTouchesAnotherAppsLiveRows is issue 36's scenario: app B runs
// with MaxAttempts 1000, one of its rows failed 50 times; app A, whose relays
// are down, names B's type, or every type, or B's row by id: none of its
// re-queues or purges touches B's rows while B's relays live, and it says
// whose they are. Once B's relays stop, every type means B's too again.
func TestAdminNeverTouchesAnotherAppsLiveRows(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	cfgB := b.cfg
	cfgB.AppName, cfgB.MaxAttempts, cfgB.Interval = b.cfg.AppName+"_b", 1000, time.Hour
	// B's destination answers 503: its row stays ERROR, retried (at most once
	// more here: Interval is an hour).
	rb := b.newRelay(t, cfgB, newRecorder("tb", func(context.Context, relay.Message) error { return errors.New("503") }))
	startRelay(t, rb)

	bids := b.insert(t, "tb", "b-retrying", "b-sent")
	b.exec(t, "UPDATE %s SET status = 'ERROR', attempts = 50, last_error = '503' WHERE id = $1", bids[0])
	b.exec(t, "UPDATE %s SET status = 'SENT', sent_at = now() - interval '2 days' WHERE id = $1", bids[1])
	aid := b.insert(t, "ta", "a-dead")[0]
	b.exec(t, "UPDATE %s SET status = 'ERROR', attempts = 10, last_error = 'boom' WHERE id = $1", aid)

	cfgA := b.cfg
	cfgA.MaxAttempts = 10
	all, err := relay.NewAdmin(b.pool, cfgA, relay.AdminAllTypes())
	require.NoError(t, err)
	named, err := relay.NewAdmin(b.pool, cfgA, relay.AdminTypes("tb"))
	require.NoError(t, err)

	var others []relay.Replica
	require.Eventually(t, func() bool {
		others, err = all.OtherReplicas(ctx)
		require.NoError(t, err)
		for _, r := range others {
			if r.App == cfgB.AppName && r.Table == b.table && r.Serves("tb") {
				return true
			}
		}
		return false
	}, 10*time.Second, 10*time.Millisecond, "B's relay is listed among the other apps' with its table and type")

	scope, err := all.Scope(ctx)
	require.NoError(t, err)
	require.True(t, scope.All)
	require.Equal(t, []string{"tb"}, scope.Excluded)
	require.False(t, scope.Includes("tb"))
	require.True(t, scope.Includes("ta"))
	require.Contains(t, scope.String(), `but "tb", served by live relays of app "`+cfgB.AppName+`"`)
	n, err := all.RequeueIDs(ctx, bids[0], aid)
	require.ErrorIs(t, err, relay.ErrOtherApp, "B's row among the ids: refused, and said")
	require.ErrorContains(t, err, fmt.Sprintf("row %d (type \"tb\") is app %q's", bids[0], cfgB.AppName))
	require.Zero(t, n)
	n, err = all.RequeueIDs(ctx, aid)
	require.NoError(t, err)
	require.EqualValues(t, 1, n, "A's dead row")
	n, err = all.RequeueAll(ctx)
	require.NoError(t, err)
	require.Zero(t, n)
	_, err = all.RequeueType(ctx, "tb")
	require.ErrorIs(t, err, relay.ErrOtherApp)
	est, err := all.EstimatePurge(ctx, 0)
	require.NoError(t, err)
	require.Zero(t, est.Rows, "B's SENT row is not A's to purge")
	n, err = all.PurgeSent(ctx, 0)
	require.NoError(t, err)
	require.Zero(t, n)

	for name, write := range map[string]func() error{
		"RequeueAll": func() error { _, err := named.RequeueAll(ctx); return err },
		"RequeueIDs": func() error { _, err := named.RequeueIDs(ctx, bids[0]); return err },
		"PurgeSent":  func() error { _, err := named.PurgeSent(ctx, 0); return err },
	} {
		err := write()
		require.ErrorIs(t, err, relay.ErrOtherApp, name)
		require.ErrorContains(t, err, `app "`+cfgB.AppName+`"`, name)
	}
	s := b.state(t, bids[0])
	require.Equal(t, "ERROR", s.Status, "B's row is left as B's relays keep it")
	require.GreaterOrEqual(t, s.Attempts, 50)
	require.True(t, b.rowExists(t, bids[1]))

	// A relay of B on another table is not B's here.
	other := relay.DefaultConfig()
	other.AppName, other.Table, other.Interval = cfgB.AppName+"_elsewhere", b.table+"_x", time.Hour
	require.NoError(t, relay.CreateTable(ctx, b.pool, other.Table))
	t.Cleanup(func() { _, _ = b.pool.Exec(context.Background(), "DROP TABLE "+other.Table) })
	rx := b.newRelay(t, other, newRecorder("ta", nil))
	startRelay(t, rx)
	xAdmin, err := relay.NewAdmin(b.pool, other)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return len(replicasOf(t, xAdmin)) == 1 }, 10*time.Second, 10*time.Millisecond)
	others, err = all.OtherReplicas(ctx)
	require.NoError(t, err)
	for _, r := range others {
		require.NotEqual(t, other.AppName, r.App, "a relay of another table is not listed")
	}
	scope, err = all.Scope(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{"tb"}, scope.Excluded, "the other table's relay serves ta there, not here")

	// With B down, the registry still says tb is B's: every type leaves it
	// out, until the operator names B and so takes its rows over.
	require.NoError(t, rb.Stop(ctx))
	n, err = all.RequeueIDs(ctx, bids[0])
	require.ErrorIs(t, err, relay.ErrOtherApp)
	require.Zero(t, n)
	scope, err = all.Scope(ctx)
	require.NoError(t, err)
	require.Equal(t, []string{"tb"}, scope.Registered)
	require.Contains(t, scope.String(), `but "tb", another app's by the registry of types (app "`+cfgB.AppName+`")`)
	takeOver, err := relay.NewAdmin(b.pool, cfgA, relay.AdminAllTypes(), relay.AdminOtherApp(cfgB.AppName))
	require.NoError(t, err)
	n, err = takeOver.RequeueIDs(ctx, bids[0])
	require.NoError(t, err)
	require.EqualValues(t, 1, n, "with B down and named, its rows are the operator's to take over")
}
