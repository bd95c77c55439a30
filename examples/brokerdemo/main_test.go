package main

import (
	"bytes"
	"context"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/xadm/relay/internal/testkit/pgserver"
	"github.com/xadm/relay/internal/tools/demo"
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
			p := demo.DefaultParams(300)
			p.WriteFor, p.Rolls = 1500*time.Millisecond, 3
			p.Deadline = 90 * time.Second // a busy machine; a passing run never waits this long
			var out bytes.Buffer
			results, err := runDemo(context.Background(), &out, pgserver.Shared().URL, to, p, true)
			t.Logf("the demo printed:\n%s", out.String())
			require.NoError(t, err)
			require.Len(t, results, 2)

			guarded := results[0]
			require.True(t, guarded.OK(), "the guarded run must pass")
			require.Equal(t, 300, guarded.Written)
			require.Equal(t, 300, guarded.Counts.Distinct)
			require.Zero(t, guarded.Lost)
			require.Zero(t, guarded.Counts.Unexplained)
			require.GreaterOrEqual(t, guarded.Handed, int64(guarded.Counts.Copies), "every copy consumed was handed to a sender")

			unguarded := results[1]
			require.Zero(t, unguarded.Lost, "the escape hatch duplicates, it does not lose")
			require.Equal(t, unguarded.Written, unguarded.Counts.Distinct)
		})
	}
}
