package relay

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestReplicasNamesAReplicaThatCameBetweenReads: Replicas reads the presence
// once for the replicas and the names their statements carry, and again to
// hash those names. A replica that comes up between two reads is seen by the
// second, with names it did not hash: it was listed with an unnamed type
// (internal/session's TestPresenceListsLiveReplicas, about once in 50 runs under load). It is
// named now, by a read more.
func TestReplicasNamesAReplicaThatCameBetweenReads(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, cfg := internalConfig(t)
	noop := func(context.Context, Message) error { return nil }
	start := func(types ...string) *Relay {
		var senders []Sender
		for _, typ := range types {
			senders = append(senders, SenderFunc(typ, noop))
		}
		r, err := New(pool, cfg, senders...)
		require.NoError(t, err)
		require.NoError(t, r.Start(ctx))
		t.Cleanup(func() { _ = r.Stop(context.Background()) })
		require.Eventually(t, func() bool { return presencePID(t, pool, r) != 0 }, time.Minute, 10*time.Millisecond, "its presence taken")
		return r
	}
	start("order")

	admin, err := NewAdmin(pool, cfg)
	require.NoError(t, err)
	reads := 0
	admin.afterRead = func() {
		if reads++; reads == 1 {
			start("invoice", "order") // after the first read, before the next
		}
	}
	reps, err := admin.Replicas(ctx)
	require.NoError(t, err)
	require.Len(t, reps, 2)
	for _, r := range reps {
		require.Zero(t, r.UnnamedTypes, "replica %s: %v", r.ID, r.Types)
	}
	require.ElementsMatch(t, [][]string{{"order"}, {"invoice", "order"}}, [][]string{reps[0].Types, reps[1].Types})
	require.Equal(t, 3, reads, "the replicas, their names hashed, then the newcomer's")
}
