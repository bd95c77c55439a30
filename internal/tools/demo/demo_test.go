package demo

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/xadm/relay/internal/testkit/pgserver"
)

func TestMain(m *testing.M) { os.Exit(pgserver.Run(m, "RELAY_TEST_DATABASE_URL")) }

// TestRun runs the scenario, shortened, to the HTTP receiver: the guarded run
// delivers every message, none lost and no duplicate a retry does not
// explain; the unguarded one loses nothing either.
func TestRun(t *testing.T) {
	p := DefaultParams(300)
	p.WriteFor, p.Rolls = 1500*time.Millisecond, 3
	p.Deadline = 90 * time.Second // a busy machine; a passing run never waits this long
	var buf bytes.Buffer
	out := NewProgress(&buf)
	results, err := Run(context.Background(), Options{App: "relay-demotest", Tables: "relay_demotest", Title: "an HTTP receiver",
		Start: StartHTTP(0), Dropped: "reached no receiver", Params: p, DBURL: pgserver.Shared().URL, Out: out,
		Logger: slog.New(slog.NewTextHandler(out, &slog.HandlerOptions{Level: slog.LevelError})), Unguarded: true})
	t.Logf("the demo printed:\n%s", buf.String())
	require.NoError(t, err)
	require.Len(t, results, 2)
	guarded := results[0]
	require.True(t, guarded.OK())
	require.Equal(t, 300, guarded.Written)
	require.Equal(t, 300, guarded.Counts.Distinct)
	require.Equal(t, 3, guarded.Rolls)
	require.GreaterOrEqual(t, guarded.Handed, int64(guarded.Counts.Copies), "every copy received was handed to a sender")
	unguarded := results[1]
	require.False(t, unguarded.Guarded)
	require.Zero(t, unguarded.Lost, "the escape hatch duplicates, it does not lose")
	require.Equal(t, unguarded.Written, unguarded.Counts.Distinct)
	require.Contains(t, buf.String(), "rolled pod-1")
}

func TestTally(t *testing.T) {
	t.Parallel()
	tl := NewTally()
	tl.Add("1", "1")
	tl.Add("2", "1")
	tl.Add("2", "2") // a retry after a recorded failure: explained
	tl.Add("3", "1")
	tl.Add("3", "1") // the same attempt twice: two replicas at once
	tl.Add("3", "1")
	c := tl.Counts()
	require.False(t, c.LastNew.IsZero())
	c.LastNew = time.Time{}
	require.Equal(t, Counts{Copies: 6, Distinct: 3, Duplicates: 3, Unexplained: 2}, c)
	require.True(t, tl.Received(2))
	require.False(t, tl.Received(4))
}
