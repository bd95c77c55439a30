package schedule

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestScheduleOccurrences pins down which instants a spec names, in which
// zone, and each occurrence's window: what every replica must agree on.
func TestScheduleOccurrences(t *testing.T) {
	t.Parallel()
	saoPaulo := time.FixedZone("BRT", -3*3600)
	utc := func(s string) time.Time {
		t.Helper()
		v, err := time.Parse(time.RFC3339Nano, s)
		require.NoError(t, err)
		return v
	}
	for _, tc := range []struct {
		name     string
		spec     string
		location *time.Location
		from     string
		want     string
		window   time.Duration // with a tolerance of 10s
	}{
		{"FiveFieldsInTheLocation", "0 2 * * *", saoPaulo, "2026-03-01T10:00:00Z", "2026-03-02T05:00:00Z", 10 * time.Second},
		{"FiveFieldsInUTC", "0 2 * * *", time.UTC, "2026-03-01T10:00:00Z", "2026-03-02T02:00:00Z", 10 * time.Second},
		{"SpecZoneWins", "CRON_TZ=UTC 0 2 * * *", saoPaulo, "2026-03-01T10:00:00Z", "2026-03-02T02:00:00Z", 10 * time.Second},
		{"DailyIsTheLocationsMidnight", "@daily", saoPaulo, "2026-03-01T10:00:00Z", "2026-03-02T03:00:00Z", 10 * time.Second},
		{"Hourly", "@hourly", time.UTC, "2026-03-01T10:59:59.999Z", "2026-03-01T11:00:00Z", 10 * time.Second},
		{"EveryFallsOnMultiples", "@every 5m", time.UTC, "2026-03-01T10:03:17.5Z", "2026-03-01T10:05:00Z", 10 * time.Second},
		{"EveryFromAnotherStart", "@every 5m", time.UTC, "2026-03-01T10:00:00.001Z", "2026-03-01T10:05:00Z", 10 * time.Second},
		{"EveryOnAnOccurrence", "@every 5m", saoPaulo, "2026-03-01T10:05:00Z", "2026-03-01T10:10:00Z", 10 * time.Second},
		{"EverySecond", "@every 1s", time.UTC, "2026-03-01T10:00:00.3Z", "2026-03-01T10:00:01Z", 500 * time.Millisecond},
		{"EveryTenSeconds", "@every 10s", time.UTC, "2026-03-01T10:00:01Z", "2026-03-01T10:00:10Z", 5 * time.Second},
		{"EverySubSecondRoundsUp", "@every 300ms", time.UTC, "2026-03-01T10:00:00.3Z", "2026-03-01T10:00:01Z", 500 * time.Millisecond},
		{"UnevenGaps", "59 9,10 * * *", time.UTC, "2026-03-01T10:00:00Z", "2026-03-01T10:59:00Z", 10 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			schedule, err := parseSpec(tc.spec)
			require.NoError(t, err)
			s := &Scheduler{location: tc.location, tolerance: toleranceDefault}
			j := &scheduledJob{schedule: schedule}
			next := s.next(j, utc(tc.from))
			require.True(t, next.Equal(utc(tc.want)), "next %s, want %s", next, tc.want)
			require.Equal(t, tc.window, s.window(j, next))
		})
	}
}
