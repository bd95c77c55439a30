package otelrelay_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/xadm/relay"
	otelrelay "github.com/xadm/relay/otel"
)

// TestObserverMetrics: the Observer counts each message by type and
// outcome, with error.type on a failure, and records the sends' and the
// pass's durations and the lag, through the MeterProvider it is given.
func TestObserverMetrics(t *testing.T) {
	t.Parallel()
	w := setup(t)
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	obs, err := otelrelay.NewObserver(otelrelay.WithMeterProvider(mp), otelrelay.WithSystem("kafka"))
	require.NoError(t, err)

	for _, k := range []string{"ok", "retry", "dead"} {
		_, err := relay.Enqueue(context.Background(), w.pool, w.table, relay.Outgoing{Type: "order", Key: k, Payload: []byte(`{}`)})
		require.NoError(t, err)
	}
	_, err = relay.Enqueue(context.Background(), w.pool, w.table, relay.Outgoing{Type: "invoice", Key: "i", Payload: []byte(`{}`)})
	require.NoError(t, err)
	send := func(_ context.Context, m relay.Message) error {
		switch m.Key {
		case "retry":
			return errors.New("busy")
		case "dead":
			return relay.Permanent(errors.New("refused"))
		}
		return nil
	}
	cfg := w.cfg
	cfg.Observer = obs
	r, err := relay.New(w.pool, cfg, relay.SenderFunc("order", send), relay.SenderFunc("invoice", send))
	require.NoError(t, err)
	n, err := r.Run(context.Background())
	require.NoError(t, err)
	require.Equal(t, 4, n)

	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(context.Background(), &rm))
	got := map[string]metricdata.Aggregation{}
	for _, sm := range rm.ScopeMetrics {
		require.Equal(t, otelrelay.ScopeName, sm.Scope.Name)
		for _, m := range sm.Metrics {
			got[m.Name] = m.Data
		}
	}

	counts := map[string]int64{}
	sent, ok := got["messaging.client.sent.messages"].(metricdata.Sum[int64])
	require.True(t, ok, "messaging.client.sent.messages is a counter: %T", got["messaging.client.sent.messages"])
	for _, dp := range sent.DataPoints {
		system, _ := dp.Attributes.Value("messaging.system")
		require.Equal(t, "kafka", system.AsString())
		typ, _ := dp.Attributes.Value("messaging.destination.name")
		outcome, _ := dp.Attributes.Value(otelrelay.OutcomeKey)
		errType, _ := dp.Attributes.Value(attribute.Key("error.type"))
		counts[typ.AsString()+"/"+outcome.AsString()+"/"+errType.AsString()] += dp.Value
	}
	require.Equal(t, map[string]int64{"order/sent/": 1, "order/error/_OTHER": 1, "order/dead/permanent": 1, "invoice/sent/": 1}, counts)

	durations, ok := got["messaging.client.operation.duration"].(metricdata.Histogram[float64])
	require.True(t, ok)
	var sends uint64
	for _, dp := range durations.DataPoints {
		sends += dp.Count
	}
	require.Equal(t, uint64(4), sends)

	pass, ok := got[otelrelay.PassDurationName].(metricdata.Histogram[float64])
	require.True(t, ok)
	require.Len(t, pass.DataPoints, 1)
	require.Equal(t, uint64(1), pass.DataPoints[0].Count)
	kind, _ := pass.DataPoints[0].Attributes.Value(otelrelay.PassKey)
	require.Equal(t, "ran", kind.AsString())

	lag, ok := got[otelrelay.LagName].(metricdata.Gauge[float64])
	require.True(t, ok)
	require.Len(t, lag.DataPoints, 1)
	require.GreaterOrEqual(t, lag.DataPoints[0].Value, 0.0)

	waiting, ok := got[otelrelay.OutcomesWaitingName].(metricdata.Gauge[int64])
	require.True(t, ok, "%s is a gauge: %T", otelrelay.OutcomesWaitingName, got[otelrelay.OutcomesWaitingName])
	require.Len(t, waiting.DataPoints, 1)
	require.GreaterOrEqual(t, waiting.DataPoints[0].Value, int64(1), "the pass's outcomes waited to be written")
	require.LessOrEqual(t, waiting.DataPoints[0].Value, int64(4))
}
