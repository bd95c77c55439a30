package relay

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/xadm/relay/internal/store"
)

func TestElectionMark(t *testing.T) {
	t.Parallel()
	won := time.Date(2026, 11, 30, 10, 0, 0, 123, time.FixedZone("BRT", -3*3600))
	started := time.Date(2026, 11, 30, 13, 0, 5, 0, time.UTC)

	since, id, ok := parseElectionMark(store.HeartbeatSQL(won), started)
	require.True(t, ok)
	require.Empty(t, id)
	require.True(t, since.Equal(won.Truncate(time.Second)), "the heartbeat says when the election was won, to the second")

	since, id, ok = parseElectionMark(store.MarkReplica(store.HeartbeatSQL(won), "0a1b2c3d"), started)
	require.True(t, ok)
	require.Equal(t, "0a1b2c3d", id, "a marked heartbeat names its replica")
	require.True(t, since.Equal(won.Truncate(time.Second)))

	since, id, ok = parseElectionMark(store.MarkReplica(store.LockSQL, "0a1b2c3d"), started)
	require.True(t, ok)
	require.Equal(t, "0a1b2c3d", id)
	require.Equal(t, started, since, "right after winning, the lock statement's start")

	for _, q := range []string{"", "SELECT pg_try_advisory_lock(hashtext('billing_relay_m2m'))", "<insufficient privilege>",
		"select 1 /* relay election */"} {
		_, _, ok := parseElectionMark(q, started)
		require.False(t, ok, q)
	}
}

func TestClassify(t *testing.T) {
	t.Parallel()
	start := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	kind := func(name, query, app string) HolderKind {
		h := LockHolder{ApplicationName: name, BackendStart: start, query: query, queryStart: start}
		classify(&h, app)
		return h.Kind
	}
	beat := store.HeartbeatSQL(start)
	require.Equal(t, HolderRelay, kind("orders-1", beat, "billing"))
	require.Equal(t, HolderRelay, kind("", store.LockSQL, "billing"))
	require.Equal(t, HolderPause, kind("relayctl pause billing", "SELECT pg_try_advisory_lock(hashtext($1))", "billing"))
	require.Equal(t, HolderOther, kind("relayctl pause bill", "", "billing"), "a prefix counts only when PostgreSQL cut the name")
	long := strings.Repeat("a", 80)
	require.Equal(t, HolderPause, kind(("relayctl pause " + long)[:applicationNameMax], "", long))
	require.Equal(t, HolderOther, kind("PostgreSQL JDBC Driver", "SELECT pg_try_advisory_lock(hashtext(?))", "billing"))
	require.Equal(t, HolderOther, kind("", "", "billing"))
}
