package main

import (
	"bytes"
	"context"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/xadm/relay/internal/pgserver"
)

// TestMain gets a real PostgreSQL (RELAY_TEST_DATABASE_URL, a container, or
// the local binaries) and checks, after the tests, that no goroutine was left
// behind: no broker, client, consumer or relay.
func TestMain(m *testing.M) { os.Exit(pgserver.Run(m, "RELAY_TEST_DATABASE_URL")) }

// TestDemo runs the demo, shortened, to each destination: the guarded run must
// deliver every message, none lost and no duplicate that a retry does not
// explain; the unguarded one must lose nothing either.
func TestDemo(t *testing.T) {
	for _, to := range []string{"kafka", "nats", "http"} {
		t.Run(to, func(t *testing.T) {
			p := defaultParams(300)
			p.writeFor, p.rolls = 1500*time.Millisecond, 3
			p.deadline = 90 * time.Second // a busy machine; a passing run never waits this long
			var out bytes.Buffer
			results, err := demo(context.Background(), &out, pgserver.Shared().URL, to, p, true)
			t.Logf("the demo printed:\n%s", out.String())
			require.NoError(t, err)
			require.Len(t, results, 2)

			guarded := results[0]
			require.True(t, guarded.ok(), "the guarded run must pass")
			require.Equal(t, 300, guarded.written)
			require.Equal(t, 300, guarded.counts.distinct)
			require.Zero(t, guarded.lost)
			require.Zero(t, guarded.counts.unexplained)
			require.GreaterOrEqual(t, guarded.handed, int64(guarded.counts.copies), "every copy consumed was handed to a sender")

			unguarded := results[1]
			require.Zero(t, unguarded.lost, "the escape hatch duplicates, it does not lose")
			require.Equal(t, unguarded.written, unguarded.counts.distinct)
		})
	}
}

func TestTally(t *testing.T) {
	t.Parallel()
	tl := newTally()
	tl.add("1", "1")
	tl.add("2", "1")
	tl.add("2", "2") // a retry after a recorded failure: explained
	tl.add("3", "1")
	tl.add("3", "1") // the same attempt twice: two replicas at once
	tl.add("3", "1")
	require.Equal(t, counts{copies: 6, distinct: 3, duplicates: 3, unexplained: 2}, tl.counts())
	require.True(t, tl.received(2))
	require.False(t, tl.received(4))
}
