package relay

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestRelayMark(t *testing.T) {
	t.Parallel()
	won := time.Date(2026, 11, 30, 10, 0, 0, 123, time.FixedZone("BRT", -3*3600))
	m := relayMark(won, "orders-replica-1")
	require.Equal(t, "relay@2026-11-30T13:00:00Z orders-replica-1", m, "UTC, to the second")
	since, orig, ok := parseRelayMark(m)
	require.True(t, ok)
	require.True(t, since.Equal(won.Truncate(time.Second)))
	require.Equal(t, "orders-replica-1", orig)

	m = relayMark(won, "")
	require.Equal(t, "relay@2026-11-30T13:00:00Z", m)
	_, orig, ok = parseRelayMark(m)
	require.True(t, ok)
	require.Empty(t, orig)

	m = relayMark(won, strings.Repeat("r", 100))
	require.Len(t, m, applicationNameMax, "cut as PostgreSQL cuts it")
	_, orig, ok = parseRelayMark(m)
	require.True(t, ok)
	require.Equal(t, strings.Repeat("r", applicationNameMax-len("relay@2026-11-30T13:00:00Z ")), orig)

	for _, name := range []string{"", "relay", "relay@", "relay@yesterday app", "PostgreSQL JDBC Driver", "xrelay@2026-11-30T13:00:00Z"} {
		_, _, ok := parseRelayMark(name)
		require.False(t, ok, name)
	}
}

func TestClassify(t *testing.T) {
	t.Parallel()
	start := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	kind := func(name, app string) HolderKind {
		h := LockHolder{ApplicationName: name, BackendStart: start}
		classify(&h, app)
		return h.Kind
	}
	require.Equal(t, HolderRelay, kind("relay@2026-11-30T10:00:00Z x", "billing"))
	require.Equal(t, HolderPause, kind("relayctl pause billing", "billing"))
	require.Equal(t, HolderOther, kind("relayctl pause bill", "billing"), "a prefix counts only when PostgreSQL cut the name")
	long := strings.Repeat("a", 80)
	require.Equal(t, HolderPause, kind(("relayctl pause " + long)[:applicationNameMax], long))
	require.Equal(t, HolderOther, kind("PostgreSQL JDBC Driver", "billing"))
	require.Equal(t, HolderOther, kind("", "billing"))
}
