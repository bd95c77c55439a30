package relayprom_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/xadm/relay"
	"github.com/xadm/relay/examples/prometheus/relayprom"
)

func TestObserver(t *testing.T) {
	t.Parallel()
	obs := relayprom.NewObserver(prometheus.Labels{"app": "billing"})
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(obs))

	var wg sync.WaitGroup // the relay calls the observer from several goroutines
	for range 10 {
		wg.Go(func() {
			obs.MessageDone(relay.MessageReport{Type: "order", Outcome: relay.OutcomeSent, Duration: 20 * time.Millisecond})
		})
	}
	wg.Wait()
	obs.MessageDone(relay.MessageReport{Type: "order", Outcome: relay.OutcomeError, Attempts: 1, Err: errors.New("503")})
	obs.MessageDone(relay.MessageReport{Type: "invoice", Outcome: relay.OutcomeDead, Attempts: 10, Err: errors.New("422")})
	obs.PassDone(relay.PassReport{Ran: true, Sent: 10, Failed: 1, Dead: 1, Duration: time.Second, Lag: 90 * time.Second})
	obs.PassDone(relay.PassReport{Coalesced: true})
	obs.PassDone(relay.PassReport{Ran: true, Err: errors.New("relay: select a batch: connection refused")})
	obs.PassDone(relay.PassReport{Ran: true, Err: context.Canceled}) // a shutdown

	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP relay_passes_total Passes of the relay, by result: elected (ran), coalesced (another session held the election) or failed.
# TYPE relay_passes_total counter
relay_passes_total{app="billing",result="coalesced"} 1
relay_passes_total{app="billing",result="elected"} 2
relay_passes_total{app="billing",result="failed"} 1
# HELP relay_messages_total Messages whose outcome was recorded, by type and outcome: sent, error (will be retried) or dead.
# TYPE relay_messages_total counter
relay_messages_total{app="billing",outcome="dead",type="invoice"} 1
relay_messages_total{app="billing",outcome="error",type="order"} 1
relay_messages_total{app="billing",outcome="sent",type="order"} 10
# HELP relay_lag_seconds Age of the oldest deliverable row when the last pass that ran read it; 0 when there was none.
# TYPE relay_lag_seconds gauge
relay_lag_seconds{app="billing"} 90
`), "relay_passes_total", "relay_messages_total", "relay_lag_seconds"), "a failed pass keeps the last lag")
	require.Equal(t, 2, testutil.CollectAndCount(obs, "relay_send_duration_seconds"), "one histogram per type")
}
