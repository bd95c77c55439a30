package diagnose_test

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/xadm/relay"
	"github.com/xadm/relay/internal/tools/diagnose"
)

var now = time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)

// overview is app "billing" with the given types, read at now.
func overview(types ...relay.TypeOverview) relay.Overview {
	o := relay.Overview{AppName: "billing", Table: "mensagem_m2m", MaxAttempts: 10, At: now, Types: types}
	for _, t := range types {
		o.Pending += t.Pending
		o.Retrying += t.Retrying
		o.Backoff += t.Backoff
		o.Dead += t.Dead
		o.Lag = max(o.Lag, t.Lag)
	}
	return o
}

// waiting is a type with n pending rows, the oldest id head, lag old.
func waiting(typ string, n, head int64, lag time.Duration) relay.TypeOverview {
	h := &relay.RowHead{ID: head, Status: "PENDING", CreatedAt: now.Add(-lag), WaitingSince: now.Add(-lag)}
	return relay.TypeOverview{Type: typ, Pending: n, Lag: lag, Next: h, Oldest: h}
}

// retrying is a type with n rows retried after a 503, in their backoff
// until next, the first failed attempts times.
func retrying(typ string, n, head int64, attempts int, next time.Time) relay.TypeOverview {
	return relay.TypeOverview{Type: typ, Retrying: n, Backoff: n, NextRetry: next,
		Next: &relay.RowHead{ID: head, Status: "ERROR", Attempts: attempts, AttemptsMade: attempts, CreatedAt: now.Add(-time.Hour),
			WaitingSince: now.Add(-time.Hour), NextAttempt: next, LastError: "PUT http://orders/1: 503 Service Unavailable"}}
}

func holder(kind relay.HolderKind, pid int, name string) relay.LockHolder {
	h := relay.LockHolder{Key: "billing_relay_m2m", Mode: relay.LockExclusive, Granted: true, Kind: kind, PID: pid,
		ApplicationName: name, User: "app", ClientAddr: "10.0.0.5", BackendStart: now.Add(-time.Hour),
		State: "idle", StateChange: now.Add(-10 * time.Minute), At: now}
	switch kind {
	case relay.HolderPause:
		h.Since = h.BackendStart
	case relay.HolderRelay:
		h.Since, h.Replica = now.Add(-10*time.Minute), "billing-7f9c"
	}
	return h
}

// member is a replica of a partitioned election of n partitions, holding parts.
func member(pid, n int, parts ...int) relay.LockHolder {
	h := holder(relay.HolderRelay, pid, "billing")
	h.Mode, h.Partitions, h.PartitionsOf = relay.LockShared, parts, n
	return h
}

func TestPartitionsText(t *testing.T) {
	t.Parallel()
	require.Equal(t, "partitions 0-3, 8, 10-11 of 16", diagnose.PartitionsText([]int{0, 1, 2, 3, 8, 10, 11}, 16))
	require.Equal(t, "no partition", diagnose.PartitionsText(nil, 16))
	require.Contains(t, diagnose.Holder(member(42, 16, 4, 5)), "pid 42, partitions 4-5 of 16")
}

func TestDiagnose(t *testing.T) {
	t.Parallel()
	late := 5 * time.Minute
	dead := relay.TypeOverview{Type: "invoices", Dead: 3,
		FirstDead: &relay.RowHead{ID: 7, Status: "ERROR", Attempts: 10, LastError: "PUT http://x/invoices/1: 422 Unprocessable Entity"}}

	for _, tc := range []struct {
		name     string
		in       diagnose.Input
		verdict  diagnose.Verdict
		cause    string
		contains []string
	}{
		{
			name:    "Idle",
			in:      diagnose.Input{Now: diagnose.Look{Overview: overview()}},
			verdict: diagnose.OK, cause: diagnose.CauseIdle,
			contains: []string{"mensagem_m2m has no outbound rows"},
		},
		{
			name: "AllSent",
			in: diagnose.Input{Now: diagnose.Look{Overview: func() relay.Overview {
				o := overview(relay.TypeOverview{Type: "orders", Sent: 12})
				o.Sent = 12
				return o
			}()}},
			verdict: diagnose.OK, cause: diagnose.CauseIdle,
			contains: []string{"every outbound row of mensagem_m2m is SENT"},
		},
		{
			name:    "OnlyDeadRows",
			in:      diagnose.Input{Now: diagnose.Look{Overview: overview(dead)}},
			verdict: diagnose.Dead, cause: diagnose.CauseDeadRows,
			contains: []string{"3 row(s) are dead", "invoices 3", "422 Unprocessable Entity", "relayctl requeue"},
		},
		{
			name: "Paused",
			in: diagnose.Input{Now: diagnose.Look{Overview: overview(waiting("orders", 4, 100, time.Second)),
				Holders: []relay.LockHolder{holder(relay.HolderPause, 42, "relayctl pause billing")}}},
			verdict: diagnose.Paused, cause: diagnose.CausePaused,
			contains: []string{"paused", "relayctl pause [pid 42", "relayctl resume", "4 row(s) wait"},
		},
		{
			name: "JVMHoldsLate",
			in: diagnose.Input{Now: diagnose.Look{Overview: overview(waiting("orders", 4, 100, late)),
				Holders: []relay.LockHolder{holder(relay.HolderOther, 42, "PostgreSQL JDBC Driver")}}},
			verdict: diagnose.Stalled, cause: diagnose.CauseHeldByOther,
			contains: []string{"another client", `"PostgreSQL JDBC Driver"`, "JVM relay", "pg_terminate_backend(42)", "from 10.0.0.5", "idle for 10m00s"},
		},
		{
			name: "JVMHoldsFreshRowsOneLook",
			in: diagnose.Input{Now: diagnose.Look{Overview: overview(waiting("orders", 4, 100, time.Second)),
				Holders: []relay.LockHolder{holder(relay.HolderOther, 42, "PostgreSQL JDBC Driver")}}},
			verdict: diagnose.OK, cause: diagnose.CauseDelivering,
			contains: []string{"Probably delivering", "next look"},
		},
		{
			name: "JVMHoldsThroughTwoLooks",
			in: diagnose.Input{
				Now: diagnose.Look{Overview: overview(waiting("orders", 4, 100, 3*time.Second)),
					Holders: []relay.LockHolder{holder(relay.HolderOther, 42, "PostgreSQL JDBC Driver")}},
				Before: &diagnose.Look{Overview: withAt(overview(waiting("orders", 4, 100, time.Second)), now.Add(-2*time.Second)),
					Holders: []relay.LockHolder{holder(relay.HolderOther, 42, "PostgreSQL JDBC Driver")}},
			},
			verdict: diagnose.Stalled, cause: diagnose.CauseHeldByOther,
			contains: []string{"nothing moves", "In the last 2s no waiting row was delivered"},
		},
		{
			name: "GoRelayStuck",
			in: diagnose.Input{Now: diagnose.Look{Overview: overview(waiting("orders", 4, 100, late)),
				Holders: []relay.LockHolder{holder(relay.HolderRelay, 42, "relay@2026-11-30T09:50:00Z billing-7f9c")}}},
			verdict: diagnose.Stalled, cause: diagnose.CauseRelayStuck,
			contains: []string{`a Go relay (application_name "billing-7f9c")`, "since 2026-11-30T09:50:00Z (10m00s)", "stuck", "pg_terminate_backend(42)"},
		},
		{
			name: "GoRelayDelivering",
			in: diagnose.Input{Now: diagnose.Look{Overview: overview(waiting("orders", 4, 100, time.Second)),
				Holders: []relay.LockHolder{holder(relay.HolderRelay, 42, "relay@2026-11-30T09:50:00Z billing-7f9c")}}},
			verdict: diagnose.OK, cause: diagnose.CauseDelivering,
			contains: []string{"Delivering: a Go relay"},
		},
		{
			name: "PartitionedDelivering",
			in: diagnose.Input{Now: diagnose.Look{Overview: overview(waiting("orders", 4, 100, time.Second)),
				Holders: []relay.LockHolder{member(42, 16, 0, 1, 2, 3, 8), member(43, 16, 4, 5, 6, 7)}}},
			verdict: diagnose.OK, cause: diagnose.CauseDelivering,
			contains: []string{"Delivering: 2 partitioned replica(s) share the election, holding 9 of its 16 partitions",
				"7 partition(s) are held by no replica right now"},
		},
		{
			name: "PartitionedStuck",
			in: diagnose.Input{Now: diagnose.Look{Overview: overview(waiting("orders", 4, 100, late)),
				Holders: []relay.LockHolder{member(42, 2, 0), member(43, 2, 1)}}},
			verdict: diagnose.Stalled, cause: diagnose.CauseRelayStuck,
			contains: []string{"Nothing is delivered although 2 partitioned replica(s) share the election, holding 2 of its 2 partitions"},
		},
		{
			name:    "NoRelay",
			in:      diagnose.Input{Now: diagnose.Look{Overview: overview(waiting("orders", 4, 100, late))}},
			verdict: diagnose.Stalled, cause: diagnose.CauseNoRelay,
			contains: []string{"no relay of app \"billing\" takes the election", "RELAY_APP_NAME=billing", "oldest (id 100, type \"orders\") for 5m00s"},
		},
		{
			name:    "NoHolderFreshRows",
			in:      diagnose.Input{Now: diagnose.Look{Overview: overview(waiting("orders", 4, 100, time.Second))}},
			verdict: diagnose.OK, cause: diagnose.CauseDelivering,
		},
		{
			name: "BehindButMoving",
			in: diagnose.Input{
				Now:    diagnose.Look{Overview: overview(waiting("orders", 4000, 900, late))},
				Before: &diagnose.Look{Overview: withAt(overview(waiting("orders", 5000, 100, late+time.Second)), now.Add(-2*time.Second))},
			},
			verdict: diagnose.OK, cause: diagnose.CauseDelivering,
			contains: []string{"behind, but rows move", "the oldest rows moved"},
		},
		{
			// Issue 36: a row retrying a 503 in its backoff is not "behind".
			name:    "RetryingInItsBackoff",
			in:      diagnose.Input{Now: diagnose.Look{Overview: overview(retrying("orders", 2, 5, 4, now.Add(90*time.Second)))}},
			verdict: diagnose.OK, cause: diagnose.CauseRetrying,
			contains: []string{"Nothing waits for the relays: 2 row(s) wait out the backoff", "the next attempt at 2026-11-30T10:01:30Z (in 1m30s)",
				"row id 5 failed 4 times", "503 Service Unavailable", "The destination fails, not the relays"},
		},
		{
			name: "RetryingBesidesDelivering",
			in: diagnose.Input{Now: diagnose.Look{Overview: overview(waiting("invoices", 3, 9, time.Second),
				retrying("orders", 2, 5, 1, now.Add(time.Minute)))}},
			verdict: diagnose.OK, cause: diagnose.CauseDelivering,
			contains: []string{"Delivering: 5 row(s) wait, the oldest (id 9, type \"invoices\") for 1s", "2 row(s) retry after a failure",
				"row id 5 failed once", "not for the relays"},
		},
		{
			name: "TypeNotDrained",
			in: diagnose.Input{Now: diagnose.Look{Overview: overview(
				waiting("orders", 4, 100, time.Second), waiting("refunds", 9, 3, late))}},
			verdict: diagnose.Stalled, cause: diagnose.CauseTypeMissing,
			contains: []string{`type "refunds" are not delivered while "orders" are`},
		},
		{
			name: "ReadOnly",
			in: diagnose.Input{Now: diagnose.Look{Overview: func() relay.Overview {
				o := overview(waiting("orders", 4, 100, late))
				o.InRecovery = true
				return o
			}()}},
			verdict: diagnose.Stalled, cause: diagnose.CauseReadOnly,
			contains: []string{"read-only", "standby", "primary"},
		},
		{
			name: "PassFails",
			in: diagnose.Input{Now: diagnose.Look{Overview: overview(waiting("orders", 4, 100, late))},
				Stats: &relay.Stats{LastPassErr: errors.New("relay: select a batch from mensagem_m2m: permission denied")}},
			verdict: diagnose.Stalled, cause: diagnose.CausePassFails,
			contains: []string{"permission denied"},
		},
		{
			name:    "DeadNoteBesidesAnotherCause",
			in:      diagnose.Input{Now: diagnose.Look{Overview: overview(waiting("orders", 4, 100, late), dead)}},
			verdict: diagnose.Stalled, cause: diagnose.CauseNoRelay,
			contains: []string{"Besides, 3 row(s) are dead"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			d := diagnose.Diagnose(tc.in)
			require.Equal(t, tc.verdict, d.Verdict, d.Summary)
			require.Equal(t, tc.cause, d.Cause, d.Summary)
			for _, s := range tc.contains {
				require.Contains(t, d.Summary, s)
			}
		})
	}
}

func withAt(o relay.Overview, at time.Time) relay.Overview {
	o.At = at
	return o
}

func TestTrend(t *testing.T) {
	t.Parallel()
	before := &diagnose.Look{Overview: withAt(overview(waiting("orders", 4, 100, time.Minute)), now.Add(-10*time.Second))}
	d := diagnose.Diagnose(diagnose.Input{Now: diagnose.Look{Overview: overview(waiting("orders", 4, 100, time.Minute+10*time.Second))}, Before: before})
	require.Equal(t, "growing", d.Trend)
	d = diagnose.Diagnose(diagnose.Input{Now: diagnose.Look{Overview: overview(waiting("orders", 4, 150, time.Second))}, Before: before})
	require.Equal(t, "shrinking", d.Trend)
	d = diagnose.Diagnose(diagnose.Input{Now: diagnose.Look{Overview: overview(waiting("orders", 4, 100, time.Minute))}})
	require.Empty(t, d.Trend)
}

func TestDuration(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]string{
		-time.Second:                          "0s",
		850 * time.Millisecond:                "850ms",
		12*time.Second + 300*time.Millisecond: "12s",
		4*time.Minute + 12*time.Second:        "4m12s",
		3*time.Hour + 4*time.Minute:           "3h04m",
		50 * time.Hour:                        "2d02h",
	} {
		require.Equal(t, want, diagnose.Duration(d), d.String())
	}
}

// replica is a live relay of "billing" serving types.
func replica(id string, elected bool, types ...string) relay.Replica {
	return relay.Replica{ID: id, Types: types, MaxAttempts: 10, Partitions: 1, Elected: elected, PID: 4242,
		ClientAddr: "10.0.0.9", BackendStart: now.Add(-time.Hour), At: now}
}

// TestDiagnosePresence: with the live replicas known, the causes that
// presence tells apart, each at the first look.
func TestDiagnosePresence(t *testing.T) {
	t.Parallel()
	late := 5 * time.Minute
	look := func(reps []relay.Replica, hs []relay.LockHolder, types ...relay.TypeOverview) diagnose.Input {
		return diagnose.Input{Now: diagnose.Look{Overview: overview(types...), Holders: hs, Replicas: reps, PresenceKnown: true}}
	}
	for _, tc := range []struct {
		name     string
		in       diagnose.Input
		verdict  diagnose.Verdict
		cause    string
		contains []string
	}{
		{
			// Issue 18: before presence, OK for a minute, then "no relay takes the election".
			name:    "UnservedTypeAtOnce",
			in:      look([]relay.Replica{replica("a1", false, "order")}, nil, waiting("order", 2, 10, time.Second), waiting("invoice", 1, 3, 4*time.Second)),
			verdict: diagnose.Stalled, cause: diagnose.CauseUnserved,
			contains: []string{`Rows of type "invoice" wait and no running relay of app "billing" has a sender for them`,
				`"invoice": 1 row(s), the oldest (id 3) waiting for 4s`, `The 1 live replica(s) serve "order"`, "Register a Sender"},
		},
		{
			name:    "UnservedEvenWhileAnotherDelivers",
			in:      look([]relay.Replica{replica("a1", true, "order")}, []relay.LockHolder{holder(relay.HolderRelay, 7, "billing")}, waiting("invoice", 1, 3, time.Second)),
			verdict: diagnose.Stalled, cause: diagnose.CauseUnserved,
		},
		{
			name:    "HiddenTypeNamesAreNotBlamed",
			in:      look([]relay.Replica{{ID: "a1", UnnamedTypes: 1, MaxAttempts: 10, Partitions: 1}}, nil, waiting("invoice", 1, 3, time.Second)),
			verdict: diagnose.OK, cause: diagnose.CauseDelivering,
		},
		{
			name:    "NoRelayRunning",
			in:      look(nil, nil, waiting("order", 2, 10, late)),
			verdict: diagnose.Stalled, cause: diagnose.CauseNoRelayRunning,
			contains: []string{`no relay of app "billing" is running`, "Start the service"},
		},
		{
			// Issue 36: the last relay stopped a moment ago; the rows are fresh.
			name:    "NoRelayRunningFreshRows",
			in:      look(nil, nil, waiting("order", 2, 10, time.Second)),
			verdict: diagnose.Stalled, cause: diagnose.CauseNoRelayRunning,
		},
		{
			name:    "NoRelayRunningOnlyRetries",
			in:      look(nil, nil, retrying("order", 2, 10, 1, now.Add(time.Minute))),
			verdict: diagnose.Stalled, cause: diagnose.CauseNoRelayRunning,
			contains: []string{"none of them for the relays"},
		},
		{
			name: "NoRelayButRowsMove",
			in: func() diagnose.Input {
				in := look(nil, nil, waiting("order", 2, 12, time.Second))
				in.Before = &diagnose.Look{Overview: withAt(overview(waiting("order", 2, 10, time.Second)), now.Add(-2*time.Second)), PresenceKnown: true}
				return in
			}(),
			verdict: diagnose.OK, cause: diagnose.CauseNoGoRelay,
			contains: []string{"a JVM relay of the app"},
		},
		{
			// The last relay stopped between the two looks: its last pass moved
			// the rows, which says nothing of what delivers them now.
			name: "LastRelayStoppedBetweenTheLooks",
			in: func() diagnose.Input {
				in := look(nil, nil, waiting("order", 2, 12, time.Second))
				in.Before = &diagnose.Look{Overview: withAt(overview(waiting("order", 2, 10, time.Second)), now.Add(-2*time.Second)),
					Replicas: []relay.Replica{replica("a1", true, "order")}, PresenceKnown: true}
				return in
			}(),
			verdict: diagnose.Stalled, cause: diagnose.CauseNoRelayRunning,
		},
		{
			name: "AnotherAppsRowsAreNotCounted",
			in: func() diagnose.Input {
				in := look(nil, nil, waiting("tb", 2, 10, late), relay.TypeOverview{Type: "tb2", Dead: 1})
				in.Now.Others = []relay.Replica{{App: "shipping", Types: []string{"tb", "tb2"}}}
				return in
			}(),
			verdict: diagnose.OK, cause: diagnose.CauseIdle,
			contains: []string{`Not counted here: the rows of "tb" (2 waiting, 0 dead; app "shipping"), "tb2" (0 waiting, 1 dead; app "shipping")`},
		},
		{
			name:    "RunningButNoneElected",
			in:      look([]relay.Replica{replica("a1", false, "order"), replica("a2", false, "order")}, nil, waiting("order", 2, 10, late)),
			verdict: diagnose.Stalled, cause: diagnose.CauseNoneElected,
			contains: []string{`2 relay(s) of app "billing" run and serve the waiting types: none has taken the election for 5m00s`},
		},
		{
			name: "ServedButNotMoving",
			in: look([]relay.Replica{{ID: "p1", Types: []string{"order"}, MaxAttempts: 10, Partitions: 4, Elected: true, Held: []int{0, 1, 2, 3}}},
				nil, waiting("order", 2, 10, late)),
			verdict: diagnose.Stalled, cause: diagnose.CauseNotMoving,
			contains: []string{`Rows of type "order" do not move although a live relay`},
		},
		{
			name:    "CeilingDiffers",
			in:      look([]relay.Replica{{ID: "a1", Types: []string{"order"}, MaxAttempts: 1000, Partitions: 1, PID: 9}}, nil, waiting("order", 2, 10, time.Second)),
			verdict: diagnose.OK, cause: diagnose.CauseDelivering,
			contains: []string{"replica a1 (pid 9) runs with MaxAttempts 1000", "re-queues are refused"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			d := diagnose.Diagnose(tc.in)
			require.Equal(t, tc.verdict, d.Verdict, d.Summary)
			require.Equal(t, tc.cause, d.Cause, d.Summary)
			for _, s := range tc.contains {
				require.Contains(t, d.Summary, s)
			}
		})
	}
	require.Contains(t, diagnose.Replica(replica("a1", true, "order")), `replica a1 [pid 4242, from 10.0.0.9`)
	require.Contains(t, diagnose.Replica(replica("a1", true, "order")), "in a pass")
	// The election's holder names the replica whose pass it runs: its pid is
	// its election's session, not the presence session Replicas lists.
	h := holder(relay.HolderRelay, 42, "billing-7f9c")
	h.ReplicaID = "a1"
	require.Contains(t, diagnose.Holder(h), `a Go relay (replica a1, application_name "billing-7f9c") [pid 42, its election's session`)
}

// TestPausedTypes: the rows of a type a live relay paused wait for their
// destination, as rows in a backoff do: not behind, said with the replica,
// the reason and the probe's time, and beside another verdict.
func TestPausedTypes(t *testing.T) {
	t.Parallel()
	late := 5 * time.Minute
	rep := replica("a1", true, "orders", "invoices")
	rep.Paused = []relay.PausedType{{Type: "orders", Reason: "5 failures in a row: PUT http://orders/1: 503 Service Unavailable",
		Since: now.Add(-late), Until: now.Add(40 * time.Second)}}
	in := diagnose.Input{Now: diagnose.Look{Overview: overview(waiting("orders", 4, 100, late)), Replicas: []relay.Replica{rep}, PresenceKnown: true}}
	d := diagnose.Diagnose(in)
	require.Equal(t, diagnose.OK, d.Verdict, d.Summary)
	require.Equal(t, diagnose.CauseTypePaused, d.Cause)
	require.Zero(t, d.Lag, "a paused type's rows are not behind")
	require.EqualValues(t, 4, d.Waiting)
	require.Contains(t, d.Lead, `"orders" (4 row(s); paused by replica a1 since 2026-11-30T09:55:00Z, after “5 failures in a row: PUT http://orders/1: 503 Service Unavailable”; probed again at 2026-11-30T10:00:40Z (in 40s))`)

	// Whoever holds the election meanwhile, a pass in flight or another
	// client, the pause is why those rows wait (TestStatusPausedType read
	// the holder's words when a pass was in flight).
	for _, h := range []relay.LockHolder{holder(relay.HolderRelay, 42, "billing-7f9c"), holder(relay.HolderOther, 42, "billing")} {
		held := in
		held.Now.Holders = []relay.LockHolder{h}
		d := diagnose.Diagnose(held)
		require.Equal(t, diagnose.CauseTypePaused, d.Cause, "held by %s: %s", h.Kind, d.Summary)
	}

	// Without the pause the same look is a stall: the pause is what tells.
	in.Now.Replicas[0].Paused = nil
	require.Equal(t, diagnose.Stalled, diagnose.Diagnose(in).Verdict)

	// Probing; beside rows of another type that move, it is a note.
	rep.Paused[0].Probing = true
	now2 := diagnose.Look{Overview: overview(waiting("orders", 4, 100, late), waiting("invoices", 3, 20, time.Second)),
		Replicas: []relay.Replica{rep}, PresenceKnown: true}
	d = diagnose.Diagnose(diagnose.Input{Now: now2})
	require.Equal(t, diagnose.OK, d.Verdict, d.Summary)
	require.Equal(t, diagnose.CauseDelivering, d.Cause)
	require.Equal(t, time.Second, d.Lag)
	require.Contains(t, d.Summary, "Paused by the relays because their destination keeps failing (not counted as behind): \"orders\"")
	require.Contains(t, d.Summary, "a message being sent as a probe now")
}

// TestVerdictTable is docs/operations.md's table "A status to page on", row
// by row: each verdict's condition, its state (relayctl status's exit code),
// and its precedence when several hold.
func TestVerdictTable(t *testing.T) {
	t.Parallel()
	late := 5 * time.Minute
	dead := relay.TypeOverview{Type: "invoices", Dead: 1, FirstDead: &relay.RowHead{ID: 7, Status: "ERROR", Attempts: 10,
		LastError: "permanent after 1 attempt(s): PUT http://x/invoices/1: 400 Bad Request", Permanent: true, AttemptsMade: 1}}
	live := []relay.Replica{replica("a1", false, "orders", "invoices")}
	pausing := []relay.Replica{replica("a1", false, "orders", "invoices")}
	pausing[0].Paused = []relay.PausedType{{Type: "orders", Reason: "5 failures in a row: context deadline exceeded",
		Since: now.Add(-late), Until: now.Add(30 * time.Second)}}
	look := func(reps []relay.Replica, hs []relay.LockHolder, types ...relay.TypeOverview) diagnose.Look {
		return diagnose.Look{Overview: overview(types...), Holders: hs, Replicas: reps, PresenceKnown: true}
	}
	pause := []relay.LockHolder{holder(relay.HolderPause, 42, "relayctl pause billing")}
	jvm := []relay.LockHolder{holder(relay.HolderOther, 43, "PostgreSQL JDBC Driver")}
	moved := func(now diagnose.Look) diagnose.Input {
		before := now
		before.Overview = withAt(overview(waiting("orders", 5, 90, time.Second)), now.Overview.At.Add(-2*time.Second))
		return diagnose.Input{Now: now, Before: &before}
	}
	for _, tc := range []struct {
		row     string
		in      diagnose.Input
		verdict diagnose.Verdict
		state   string
		cause   string
	}{
		{"1 PAUSED, over every other", diagnose.Input{Now: look(nil, pause, waiting("orders", 4, 100, late), dead)},
			diagnose.Paused, diagnose.StateCritical, diagnose.CausePaused},
		{"1 PAUSED, nothing waiting", diagnose.Input{Now: look(live, pause)},
			diagnose.Paused, diagnose.StateCritical, diagnose.CausePaused},
		{"2 STALLED: no relay runs, fresh rows, at once", diagnose.Input{Now: look(nil, nil, waiting("orders", 4, 100, time.Second))},
			diagnose.Stalled, diagnose.StateCritical, diagnose.CauseNoRelayRunning},
		{"2 STALLED: no relay runs, over DEAD", diagnose.Input{Now: look(nil, nil, waiting("orders", 4, 100, time.Second), dead)},
			diagnose.Stalled, diagnose.StateCritical, diagnose.CauseNoRelayRunning},
		{"2 STALLED: no relay runs, rows only in a retry's backoff", diagnose.Input{Now: look(nil, nil, retrying("orders", 1, 100, 1, now.Add(time.Minute)))},
			diagnose.Stalled, diagnose.StateCritical, diagnose.CauseNoRelayRunning},
		{"2 STALLED: no live relay serves a waiting type", diagnose.Input{Now: look([]relay.Replica{replica("a1", false, "orders")}, nil, waiting("refunds", 1, 3, time.Second))},
			diagnose.Stalled, diagnose.StateCritical, diagnose.CauseUnserved},
		{"2 STALLED: read-only server, nothing moves", diagnose.Input{Now: func() diagnose.Look {
			l := look(live, nil, waiting("orders", 4, 100, late))
			l.Overview.DefaultReadOnly = true
			return l
		}()}, diagnose.Stalled, diagnose.StateCritical, diagnose.CauseReadOnly},
		{"2 STALLED: a session holds the election, nothing moves", diagnose.Input{Now: look(live, jvm, waiting("orders", 4, 100, late))},
			diagnose.Stalled, diagnose.StateCritical, diagnose.CauseHeldByOther},
		{"2 STALLED: a row waited past --stall-after, nothing moves", diagnose.Input{Now: look(live, nil, waiting("orders", 4, 100, late))},
			diagnose.Stalled, diagnose.StateCritical, diagnose.CauseNoneElected},
		{"3 DEAD: only dead rows", diagnose.Input{Now: look(live, nil, dead)},
			diagnose.Dead, diagnose.StateWarning, diagnose.CauseDeadRows},
		{"3 DEAD: whatever else waits and moves", moved(look(live, nil, waiting("orders", 5, 95, time.Second), dead)),
			diagnose.Dead, diagnose.StateWarning, diagnose.CauseDeadRows},
		{"3 DEAD: beside rows in a retry's backoff", diagnose.Input{Now: look(live, nil, retrying("orders", 1, 100, 2, now.Add(time.Minute)), dead)},
			diagnose.Dead, diagnose.StateWarning, diagnose.CauseDeadRows},
		{"4 OK: nothing waits", diagnose.Input{Now: look(live, nil)},
			diagnose.OK, diagnose.StateOK, diagnose.CauseIdle},
		{"4 OK: rows wait and move", moved(look(live, nil, waiting("orders", 5, 95, time.Second))),
			diagnose.OK, diagnose.StateOK, diagnose.CauseDelivering},
		{"4 OK: rows wait out a retry's backoff", diagnose.Input{Now: look(live, nil, retrying("orders", 1, 100, 2, now.Add(time.Minute)))},
			diagnose.OK, diagnose.StateOK, diagnose.CauseRetrying},
		{"4 OK: rows wait only in a type a relay paused", diagnose.Input{Now: look(pausing, nil, waiting("orders", 4, 100, late))},
			diagnose.OK, diagnose.StateOK, diagnose.CauseTypePaused},
		{"2 STALLED: beside a paused type, another does not move", diagnose.Input{Now: look(pausing, nil, waiting("orders", 4, 100, late), waiting("invoices", 1, 7, late))},
			diagnose.Stalled, diagnose.StateCritical, diagnose.CauseNoneElected},
		{"4 OK: no Go relay, rows move (a JVM relay)", moved(look(nil, nil, waiting("orders", 5, 95, time.Second))),
			diagnose.OK, diagnose.StateOK, diagnose.CauseNoGoRelay},
		{"4 OK: a JVM relay holds the election, fresh rows", diagnose.Input{Now: look(nil, jvm, waiting("orders", 5, 95, time.Second))},
			diagnose.OK, diagnose.StateOK, diagnose.CauseDelivering},
	} {
		t.Run(tc.row, func(t *testing.T) {
			t.Parallel()
			d := diagnose.Diagnose(tc.in)
			require.Equal(t, tc.verdict, d.Verdict, d.Summary)
			require.Equal(t, tc.state, d.Verdict.State())
			require.Equal(t, tc.cause, d.Cause, d.Summary)
			if tc.in.Now.Overview.Dead > 0 && d.Verdict != diagnose.Dead {
				require.Contains(t, d.Summary, "Besides, 1 row(s) are dead", "dead rows are said under a more urgent verdict")
			}
			if d.Verdict == diagnose.Dead {
				require.Contains(t, d.Summary, "died of a permanent failure after 1 attempt", "the attempts really made")
				require.NotContains(t, d.Summary, "failed 10 times")
			}
		})
	}
}
