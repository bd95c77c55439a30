package diagnose_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/xadm/relay"
	"github.com/xadm/relay/internal/tools/diagnose"
)

// aged is t with its oldest message not yet delivered age old.
func aged(t relay.TypeOverview, age time.Duration) relay.TypeOverview {
	t.Age = age
	t.Undelivered = &relay.RowHead{ID: 1, Status: "PENDING", WaitingSince: now.Add(-age)}
	return t
}

// TestAgeVerdict is the age's rows of the verdict table: below -w OK, past
// it WARNING, past -c CRITICAL, whatever the cause (here the destination:
// rows in their backoff, which are no relay's fault); per-type thresholds;
// and a STALLED verdict stays CRITICAL however young its rows.
func TestAgeVerdict(t *testing.T) {
	t.Parallel()
	relayLive := relay.Replica{ID: "1a2b3c4d", App: "billing", Types: []string{"order", "invoice"}, MaxAttempts: 10}
	look := func(types ...relay.TypeOverview) diagnose.Input {
		o := overview(types...)
		for _, ty := range types {
			o.Age = max(o.Age, ty.Age)
		}
		return diagnose.Input{Now: diagnose.Look{Overview: o, Replicas: []relay.Replica{relayLive}, PresenceKnown: true}}
	}
	for _, tc := range []struct {
		name       string
		in         diagnose.Input
		state      string
		verdict    diagnose.Verdict
		first      string
		thresholds diagnose.Thresholds
	}{
		{"Young", look(aged(retrying("order", 3, 7, 2, now.Add(time.Minute)), 4*time.Minute)), "OK", diagnose.OK, "OK: 3 waiting, oldest undelivered 4m00s", diagnose.Thresholds{}},
		{"PastWarning", look(aged(retrying("order", 3, 7, 2, now.Add(time.Minute)), 6*time.Minute)), "WARNING", diagnose.Late,
			"WARNING: order: oldest undelivered 6m00s (destination failing)", diagnose.Thresholds{}},
		{"PastCritical", look(aged(retrying("order", 3, 7, 2, now.Add(time.Minute)), 16*time.Minute)), "CRITICAL", diagnose.Late,
			"CRITICAL: order: oldest undelivered 16m00s (destination failing)", diagnose.Thresholds{}},
		{"PerType", look(aged(waiting("order", 1, 3, time.Second), 90*time.Second), aged(waiting("invoice", 1, 4, time.Second), 90*time.Second)),
			"WARNING", diagnose.Late, "WARNING: order: oldest undelivered 1m30s (relays behind)",
			diagnose.Thresholds{PerType: map[string]diagnose.Threshold{"order": {Warning: time.Minute}}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := tc.in
			in.Thresholds = tc.thresholds
			d := diagnose.Diagnose(in)
			require.Equal(t, tc.state, d.State, d.Summary)
			require.Equal(t, tc.verdict, d.Verdict, d.Summary)
			require.Equal(t, tc.first, d.FirstLine())
		})
	}

	// Stuck Sends: WARNING however young the rows, CRITICAL once their type
	// is paused for them (StuckSendsMax); a late type's CRITICAL still wins
	// over a WARNING of stuck Sends.
	stuck := func(age time.Duration, paused bool) diagnose.Input {
		in := look(aged(retrying("order", 3, 7, 2, now.Add(time.Minute)), age))
		r := relayLive
		r.Stuck = []relay.StuckSends{{Type: "order", Sends: 2, Since: now.Add(-time.Minute)}}
		if paused {
			r.Paused = []relay.PausedType{{Type: "order", Reason: "100 Sends ignored their context and still run, the relay's bound (StuckSendsMax)",
				Since: now.Add(-time.Minute), Until: now.Add(time.Second)}}
		}
		in.Now.Replicas = []relay.Replica{r}
		return in
	}
	for _, tc := range []struct {
		name    string
		in      diagnose.Input
		state   string
		verdict diagnose.Verdict
	}{
		{"StuckYoung", stuck(time.Second, false), "WARNING", diagnose.Stuck},
		{"StuckAtTheBound", stuck(time.Second, true), "CRITICAL", diagnose.Stuck},
		{"StuckAndLate", stuck(16*time.Minute, false), "CRITICAL", diagnose.Late},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := diagnose.Diagnose(tc.in)
			require.Equal(t, tc.state, d.State, d.Summary)
			require.Equal(t, tc.verdict, d.Verdict, d.Summary)
			i := slices.IndexFunc(d.Types, func(s diagnose.TypeState) bool { return s.Type == "order" })
			require.Equal(t, tc.state, d.Types[i].State, "the type's row")
			require.Contains(t, d.Summary, `2 Send(s) of "order" on replica 1a2b3c4d`)
			require.Contains(t, d.Summary, "The Sender must return when its context ends")
			if tc.verdict == diagnose.Stuck {
				require.Equal(t, tc.state+": 2 stuck Send(s) of order: a Sender ignores its context", d.FirstLine())
			}
		})
	}

	t.Run("StalledStaysCritical", func(t *testing.T) {
		o := overview(aged(waiting("order", 2, 3, time.Second), time.Second))
		d := diagnose.Diagnose(diagnose.Input{Now: diagnose.Look{Overview: o, PresenceKnown: true}})
		require.Equal(t, diagnose.Stalled, d.Verdict)
		require.Equal(t, "CRITICAL", d.State)
		require.Equal(t, `CRITICAL: order: nothing delivered, oldest undelivered 1s (no relay of app billing runs)`, d.FirstLine())
		require.Equal(t, "CRITICAL", d.Types[0].State, "the table's row says it too")
	})
}

// TestFirstLineAndPerfdata: the first line fits an SMS however long the
// type's name, and no type name breaks the performance data.
func TestFirstLineAndPerfdata(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("a-very-long-type-name-", 10)
	o := overview(aged(waiting(long, 1, 3, time.Second), time.Hour), aged(waiting("it's|x=1", 1, 4, time.Second), time.Hour))
	o.Age = time.Hour
	d := diagnose.Diagnose(diagnose.Input{Now: diagnose.Look{Overview: o, PresenceKnown: true,
		Replicas: []relay.Replica{{ID: "1", App: "billing", Types: []string{long, "it's|x=1"}}}}})
	require.Equal(t, "CRITICAL", d.State)
	require.LessOrEqual(t, len([]rune(d.FirstLine())), diagnose.FirstLineMax)
	require.NotContains(t, d.FirstLine(), "|")
	for _, p := range d.Perfdata() {
		label, value, ok := strings.Cut(p[1:], "'=")
		require.True(t, ok, p)
		require.NotContains(t, label, "'")
		require.NotContains(t, label, "=")
		require.NotContains(t, label, "|")
		require.Regexp(t, `^[0-9]+s?(;[0-9]*){2,4}$`, value)
	}
}
