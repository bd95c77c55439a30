package session_test

import (
	"context"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/xadm/relay"
	"github.com/xadm/relay/internal/testkit/harness"
	"github.com/xadm/relay/internal/testkit/pgserver"
	"github.com/xadm/relay/internal/testkit/testlog"
)

// The presence (presence.go), proven from outside: started relays, each
// listed by Admin.Replicas while it lives and gone with its session.

// TestMain gets a real PostgreSQL (RELAY_TEST_DATABASE_URL, a container, or
// the local binaries) and, after the tests, checks that no goroutine was left
// behind. TestPresenceKilledProcess's child, the test binary run again, gets
// the same server through RELAY_TEST_DATABASE_URL.
func TestMain(m *testing.M) { os.Exit(pgserver.Run(m, "RELAY_TEST_DATABASE_URL")) }

// TestPresenceListsLiveReplicas: a single-key relay (with wake-ups) and a
// partitioned one (without) of one app are listed between passes with their
// types, ceiling and Partitions; a relay of another app is not; Stop removes
// a replica before it returns.
func TestPresenceListsLiveReplicas(t *testing.T) {
	t.Parallel()
	b := harness.Setup(t)
	ctx := context.Background()

	single := b.Config
	single.MaxAttempts = 7
	r1 := b.NewRelay(t, single, harness.NewRecorder("order", nil))
	parted := b.Config
	parted.MaxAttempts = 7
	parted.Partitions = 4
	parted.WakeOnCommit = false
	r2 := b.NewRelay(t, parted, harness.NewRecorder("order", nil), harness.NewRecorder("invoice", nil))
	other := b.Config
	other.AppName = b.Config.AppName + "_other"
	r3 := b.NewRelay(t, other, harness.NewRecorder("payment", nil))
	for _, r := range []*relay.Relay{r1, r2, r3} {
		harness.StartRelay(t, r)
	}

	admin, err := relay.NewAdmin(b.Pool, b.Config)
	require.NoError(t, err)
	var reps []relay.Replica
	require.Eventually(t, func() bool {
		reps = harness.Replicas(t, admin)
		return len(reps) == 2 && (len(reps[0].Held) > 0 || len(reps[1].Held) > 0)
	}, 20*time.Second, 10*time.Millisecond, "both replicas of the app, and the partitioned one a member")
	byParts := map[int]relay.Replica{}
	for _, r := range reps {
		byParts[r.Partitions] = r
		require.Equal(t, 7, r.MaxAttempts)
		require.NotZero(t, r.PID)
		require.NotEmpty(t, r.ID)
		require.NotZero(t, r.Process)
		require.False(t, r.BackendStart.IsZero())
		require.Zero(t, r.UnnamedTypes)
	}
	require.Equal(t, []string{"order"}, byParts[1].Types)
	require.Equal(t, []string{"invoice", "order"}, byParts[4].Types)
	require.True(t, byParts[4].Elected, "a partitioned replica is a member for as long as it runs")
	require.NotEmpty(t, byParts[4].Held)

	otherAdmin, err := relay.NewAdmin(b.Pool, other)
	require.NoError(t, err)
	var oreps []relay.Replica
	require.Eventually(t, func() bool {
		oreps = harness.Replicas(t, otherAdmin)
		return len(oreps) == 1 && len(oreps[0].Types) > 0
	}, 20*time.Second, 10*time.Millisecond, "the other app's replica, once its presence is taken")
	require.Equal(t, []string{"payment"}, oreps[0].Types)

	// Stop lets go before it returns: no waiting here.
	require.NoError(t, r2.Stop(ctx))
	reps = harness.Replicas(t, admin)
	require.Len(t, reps, 1)
	require.Equal(t, 1, reps[0].Partitions)
	require.NoError(t, r1.Stop(ctx))
	require.Empty(t, harness.Replicas(t, admin))
}

// TestPresenceGoneWhenStoppedAtOnce: a relay stopped the moment its presence
// is listed (its listener may still be claiming its types on the session)
// is no longer listed when Stop returns.
func TestPresenceGoneWhenStoppedAtOnce(t *testing.T) {
	t.Parallel()
	b := harness.Setup(t)
	ctx := context.Background()
	admin, err := relay.NewAdmin(b.Pool, b.Config)
	require.NoError(t, err)
	for i := range 30 {
		r := b.NewRelay(t, b.Config, harness.NewRecorder("order", nil))
		require.NoError(t, r.Start(ctx))
		require.Eventually(t, func() bool { return len(harness.Replicas(t, admin)) == 1 }, 20*time.Second, time.Millisecond, "round %d: listed", i)
		require.NoError(t, r.Stop(ctx))
		require.Empty(t, harness.Replicas(t, admin), "round %d: listed after Stop returned", i)
	}
}

// TestPresenceReconnects: a presence session that is terminated (a killed
// backend, a failover) is taken again by the reconnected listener.
func TestPresenceReconnects(t *testing.T) {
	t.Parallel()
	b := harness.Setup(t)
	for _, wake := range []bool{true, false} {
		cfg := b.Config
		cfg.WakeOnCommit = wake
		r := b.NewRelay(t, cfg, harness.NewRecorder("order", nil))
		harness.StartRelay(t, r)
		admin, err := relay.NewAdmin(b.Pool, cfg)
		require.NoError(t, err)
		var first relay.Replica
		require.Eventually(t, func() bool {
			reps := harness.Replicas(t, admin)
			if len(reps) == 1 {
				first = reps[0]
			}
			return len(reps) == 1
		}, 10*time.Second, 10*time.Millisecond)
		_, err = b.Pool.Exec(context.Background(), "SELECT pg_terminate_backend($1)", first.PID)
		require.NoError(t, err)
		require.Eventually(t, func() bool {
			reps := harness.Replicas(t, admin)
			return len(reps) == 1 && reps[0].PID != first.PID && reps[0].ID == first.ID
		}, 20*time.Second, 20*time.Millisecond, "wake %v: the reconnected session holds the presence again", wake)
		require.NoError(t, r.Stop(context.Background()))
	}
}

// TestPresenceInPass: while a replica's pass runs, Replicas says it is
// elected, through the replica id its election's statements carry.
func TestPresenceInPass(t *testing.T) {
	t.Parallel()
	b := harness.Setup(t)
	b.Insert(t, "order", "k1")
	release := make(chan struct{})
	sending := make(chan struct{}, 1)
	r := b.NewRelay(t, b.Config, harness.NewRecorder("order", func(ctx context.Context, m relay.Message) error {
		select {
		case sending <- struct{}{}:
		default:
		}
		<-release
		return nil
	}))
	harness.StartRelay(t, r)
	admin, err := relay.NewAdmin(b.Pool, b.Config)
	require.NoError(t, err)
	<-sending
	reps := harness.Replicas(t, admin)
	require.Len(t, reps, 1)
	require.True(t, reps[0].Elected, "in a pass")
	holders, err := admin.Election(context.Background())
	require.NoError(t, err)
	require.Len(t, holders, 1)
	require.Equal(t, reps[0].ID, holders[0].ReplicaID)
	close(release)
	require.Eventually(t, func() bool {
		reps := harness.Replicas(t, admin)
		return len(reps) == 1 && !reps[0].Elected
	}, 10*time.Second, 10*time.Millisecond, "between passes it is live but not elected")
}

// TestPresenceSilentCut: a replica cut off without a word (its proxy stops
// forwarding) disappears once the server ends its session, within the lease.
func TestPresenceSilentCut(t *testing.T) {
	t.Parallel()
	b := harness.Setup(t)
	proxy, viaProxy, err := pgserver.ProxyURL(harness.Server().URL)
	require.NoError(t, err)
	t.Cleanup(func() { proxy.Close() })
	pool := pgserver.Pool(t, viaProxy, pgserver.Name(t)+"_cut", 4)
	cfg := b.Config
	cfg.Enabled = true
	r, err := relay.New(pool, cfg, harness.NewRecorder("order", nil))
	require.NoError(t, err)
	harness.StartRelay(t, r)
	admin, err := relay.NewAdmin(b.Pool, cfg)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return len(harness.Replicas(t, admin)) == 1 }, 10*time.Second, 10*time.Millisecond)
	proxy.Freeze()
	cut := time.Now()
	require.Eventually(t, func() bool { return len(harness.Replicas(t, admin)) == 0 }, 30*time.Second, 50*time.Millisecond)
	took := time.Since(cut)
	t.Logf("a silently cut replica left the list after %s", took.Round(time.Millisecond))
	require.Less(t, took, 15*time.Second, "the lease (idle_session_timeout 10s) bounds it")
	proxy.Thaw()
}

// TestPresenceKeysConflictWithNothing: with presence held, the JVM's lock,
// the election and the partitions' locks are all still free.
func TestPresenceKeysConflictWithNothing(t *testing.T) {
	t.Parallel()
	b := harness.Setup(t)
	r := b.NewRelay(t, b.Config, harness.NewRecorder("order", nil))
	harness.StartRelay(t, r)
	admin, err := relay.NewAdmin(b.Pool, b.Config)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return len(harness.Replicas(t, admin)) == 1 }, 10*time.Second, 10*time.Millisecond)
	require.NoError(t, r.Stop(context.Background()))
	require.NoError(t, r.Start(context.Background()))
	require.Eventually(t, func() bool { return len(harness.Replicas(t, admin)) == 1 }, 10*time.Second, 10*time.Millisecond)
	conn, err := pgx.Connect(context.Background(), harness.Server().URL)
	require.NoError(t, err)
	defer conn.Close(context.Background())
	// Every exclusive key of the library's other locks, taken from another
	// session while the presence is held: none is refused.
	var ok bool
	key := b.Config.AppName + "_relay_m2m"
	require.NoError(t, conn.QueryRow(context.Background(), `SELECT bool_and(x) FROM (
	  SELECT pg_try_advisory_lock(hashtext($1)) x
	  UNION ALL SELECT pg_try_advisory_lock(hashtext($1), (4 << 16) | p) FROM generate_series(0, 3) p
	  UNION ALL SELECT pg_try_advisory_lock(hashtext($1), -1)
	  UNION ALL SELECT pg_try_advisory_lock(hashtext('relay:' || $2), hashtext('k'))
	  UNION ALL SELECT pg_try_advisory_lock(hashtext('relay:wake'), hashtext('relay:' || $2))) s`, key, b.Table).Scan(&ok))
	require.True(t, ok)
	_, err = conn.Exec(context.Background(), "SELECT pg_advisory_unlock_all()")
	require.NoError(t, err)
}

// TestPresenceKilledProcess: a replica whose process is killed (SIGKILL on
// Unix) disappears from the list with its session; the other stays.
func TestPresenceKilledProcess(t *testing.T) {
	t.Parallel()
	b := harness.Setup(t)
	stay := b.NewRelay(t, b.Config, harness.NewRecorder("order", nil))
	harness.StartRelay(t, stay)

	var out testlog.Buffer
	child := exec.Command(os.Args[0], "-test.run=^TestPresenceKilledProcessChild$", "-test.v")
	child.Env = append(os.Environ(), "RELAY_PRESENCE_CHILD=1", "RELAY_TEST_DATABASE_URL="+harness.Server().URL, "RELAY_PRESENCE_TABLE="+b.Table)
	child.Stdout, child.Stderr = &out, &out
	require.NoError(t, child.Start())
	t.Cleanup(func() {
		_ = child.Process.Kill()
		_ = child.Wait()
		if t.Failed() {
			t.Logf("the child's output:\n%s", out.String())
		}
	})
	admin, err := relay.NewAdmin(b.Pool, b.Config)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return len(harness.Replicas(t, admin)) == 2 }, 60*time.Second, 20*time.Millisecond)
	var childID string
	for _, r := range harness.Replicas(t, admin) {
		if r.Process == child.Process.Pid {
			childID = r.ID
			require.Equal(t, []string{"invoice"}, r.Types)
		}
	}
	require.NotEmpty(t, childID, "the child's replica says its process id")

	require.NoError(t, child.Process.Kill())
	killed := time.Now()
	require.Eventually(t, func() bool {
		reps := harness.Replicas(t, admin)
		return len(reps) == 1 && reps[0].ID != childID
	}, 20*time.Second, 10*time.Millisecond)
	t.Logf("a killed replica left the list after %s", time.Since(killed).Round(time.Millisecond))
}

// TestPresenceKilledProcessChild is the replica TestPresenceKilledProcess
// kills; it runs only as that test's child process.
func TestPresenceKilledProcessChild(t *testing.T) {
	if os.Getenv("RELAY_PRESENCE_CHILD") == "" {
		t.Skip("the killed replica of TestPresenceKilledProcess; it runs only as that test's child process")
	}
	table := os.Getenv("RELAY_PRESENCE_TABLE")
	cfg := relay.DefaultConfig()
	cfg.AppName, cfg.Table = table, table
	r, err := relay.New(pgserver.Pool(t, harness.Server().URL, table+"_child", 4), cfg, harness.NewRecorder("invoice", nil))
	require.NoError(t, err)
	require.NoError(t, r.Start(context.Background()))
	select {} // until the parent kills it
}
