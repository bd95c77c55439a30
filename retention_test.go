package relay_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/xadm/relay"
)

// TestRetentionRunsItself: with Config.Retention, a started relay purges the
// SENT rows of its own types older than the retention, on its schedule, and
// says so in Stats and presence; recent rows, live rows and another type's
// rows are left alone. Off by default.
func TestRetentionRunsItself(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	require.Zero(t, relay.DefaultConfig().Retention, "off by default")
	old := b.insert(t, "order", "o1", "o2", "o3")
	recent := b.insert(t, "order", "o4")
	foreign := b.insert(t, "refund", "r1")
	for _, id := range append(append(old, foreign...), recent...) {
		b.exec(t, "UPDATE %s SET status = 'SENT', sent_at = now() - interval '2 hours' WHERE id = $1", id)
	}
	b.exec(t, "UPDATE %s SET sent_at = now() - interval '1 minute' WHERE id = $1", recent[0])
	live := b.insert(t, "order", "o5")[0]
	b.exec(t, "UPDATE %s SET status = 'ERROR', attempts = 1, updated_at = now() + interval '1 hour' WHERE id = $1", live)

	cfg := b.cfg
	cfg.Retention, cfg.RetentionSchedule = time.Hour, "@every 1s"
	r := b.newRelay(t, cfg, newRecorder("order", nil))
	startRelay(t, r)
	require.Eventually(t, func() bool { st := r.Stats(); return st.Retention != nil && st.Retention.Err == "" }, 20*time.Second, 20*time.Millisecond)
	st := r.Stats().Retention
	require.EqualValues(t, 3, st.Total, "the three old SENT rows of its type")
	require.Equal(t, time.Hour, st.Age)
	for _, id := range old {
		require.False(t, b.rowExists(t, id))
	}
	require.True(t, b.rowExists(t, recent[0]), "within the retention")
	require.True(t, b.rowExists(t, foreign[0]), "not its type")
	require.True(t, b.rowExists(t, live), "not SENT")

	admin, err := relay.NewAdmin(b.pool, cfg)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		reps := replicasOf(t, admin)
		return len(reps) == 1 && reps[0].Retention != nil && reps[0].Retention.Total == 3
	}, 10*time.Second, 10*time.Millisecond, "presence says the last run")
	h, err := admin.Health(ctx)
	require.NoError(t, err)
	require.NotNil(t, h.Retention)
	require.EqualValues(t, 3, h.Retention.Total)
}

// TestRetentionConfig: RELAY_RETENTION takes days; a negative retention is
// refused, naming the field.
func TestRetentionConfig(t *testing.T) {
	t.Setenv("RELAY_RETENTION", "30d")
	cfg, err := relay.ConfigFromEnv()
	require.NoError(t, err)
	require.Equal(t, 30*24*time.Hour, cfg.Retention)
	require.Equal(t, "@hourly", cfg.RetentionSchedule)
	t.Setenv("RELAY_RETENTION", "-1h")
	_, err = relay.ConfigFromEnv()
	require.ErrorContains(t, err, "Config.Retention must not be negative")
	require.ErrorContains(t, err, "RELAY_RETENTION")
}
