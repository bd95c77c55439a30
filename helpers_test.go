package relay_test

import (
	"context"
	"os"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/xadm/relay"
	"github.com/xadm/relay/internal/testkit/harness"
	"github.com/xadm/relay/internal/testkit/pgserver"
	"github.com/xadm/relay/internal/testkit/testlog"
)

// TestMain gets a real PostgreSQL (RELAY_TEST_DATABASE_URL, a container, or the
// local binaries) and fails, never skips, when none can be had. After the tests
// it checks that no goroutine was left behind.
func TestMain(m *testing.M) { os.Exit(pgserver.Run(m, "RELAY_TEST_DATABASE_URL")) }

// The helpers below are the root's short names for internal/testkit/harness,
// which the tests beside each mechanism share: the code is there.

// server is the package's throwaway PostgreSQL.
func server() *pgserver.Server { return harness.Server() }

// bundle is one test's world (harness.Bundle): its own pool, table and app
// name, so tests run in parallel without seeing each other's rows or elections.
type bundle struct {
	h     *harness.Bundle
	pool  *pgxpool.Pool
	table string
	cfg   relay.Config
}

func setup(t *testing.T) *bundle {
	t.Helper()
	h := harness.Setup(t)
	return &bundle{h: h, pool: h.Pool, table: h.Table, cfg: h.Config}
}

func (b *bundle) newRelay(t *testing.T, cfg relay.Config, senders ...relay.Sender) *relay.Relay {
	t.Helper()
	return b.h.NewRelay(t, cfg, senders...)
}

// insert writes outbound rows of typ with keys as plain SQL would, in order.
func (b *bundle) insert(t testing.TB, typ string, keys ...string) []int64 {
	t.Helper()
	return b.h.Insert(t, typ, keys...)
}

func (b *bundle) exec(t testing.TB, sql string, args ...any) {
	t.Helper()
	b.h.Exec(t, sql, args...)
}

// state is a row as the table holds it.
type state = harness.State

func (b *bundle) state(t testing.TB, id int64) state {
	t.Helper()
	return b.h.State(t, id)
}

func (b *bundle) countStatus(t testing.TB, status string) int {
	t.Helper()
	return b.h.CountStatus(t, status)
}

// deadCount counts the rows at or above the ceiling.
func (b *bundle) deadCount(t testing.TB, ceiling int) int {
	t.Helper()
	return b.h.DeadCount(t, ceiling)
}

// trickle writes n messages of type "t" one at a time through Enqueue, each
// once rec sent the one before (harness.Bundle.Trickle).
func (b *bundle) trickle(t *testing.T, rec *recorder, from, n int) []int64 {
	t.Helper()
	return b.h.Trickle(t, rec.Recorder, from, n)
}

func (b *bundle) statusOfKey(t testing.TB, key string) string {
	t.Helper()
	return b.h.StatusOfKey(t, key)
}

var (
	newPool = harness.NewPool
	// holdLikeJVM takes the election from a separate session exactly as the
	// JVM relay does, and returns a func that releases it.
	holdLikeJVM = harness.HoldLikeJVM
	// lockFree reports whether another session can take app's election now.
	lockFree = harness.LockFree
	// advisoryLocksHeldBy counts the advisory locks held by the pool's sessions.
	advisoryLocksHeldBy = harness.AdvisoryLocksHeldBy
	distinctKeys        = harness.DistinctKeys
	// electionHolders returns the backends holding app's election.
	electionHolders = harness.ElectionHolders
	// holdersOf is electionHolders for a sender's goroutine.
	holdersOf = harness.HoldersOf
	// testLogger logs through t.Log until the test ends.
	testLogger = harness.TestLogger
	// startRelay starts a relay and stops it at the test's end.
	startRelay = harness.StartRelay
	// replicasOf reads the live replicas of an Admin's app.
	replicasOf = harness.Replicas
	// listenOn opens a session of the test's own that LISTENs on a channel.
	listenOn = harness.ListenOn
	// appNameOf is the application_name a pool's sessions carry.
	appNameOf = harness.AppNameOf
	// startBouncer starts a PgBouncer in a pool mode; bouncerPool opens a
	// pool through it.
	startBouncer = harness.StartBouncer
	bouncerPool  = harness.BouncerPool
)

// recorder is a Sender that records what it was asked to send.
type recorder struct{ *harness.Recorder }

func newRecorder(typ string, fn func(ctx context.Context, m relay.Message) error) *recorder {
	return &recorder{harness.NewRecorder(typ, fn)}
}

func (r *recorder) ids() []int64     { return r.IDs() }
func (r *recorder) count() int       { return r.Count() }
func (r *recorder) maxInFlight() int { return r.MaxInFlight() }

// logBuffer collects log lines for assertions.
type logBuffer = testlog.Buffer
