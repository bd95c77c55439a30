package otelrelay_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/xadm/relay"
	otelrelay "github.com/xadm/relay/otel"
)

// TestTableMetrics: rows of "order" wait, ten minutes old, and no relay runs;
// the table's gauges say their age, count and that no relay delivers them.
func TestTableMetrics(t *testing.T) {
	t.Parallel()
	w := setup(t)
	ctx := context.Background()
	_, err := w.pool.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (type, natural_key, payload, created_at)
		VALUES ('order', 'o1', '{}', now() - interval '10 minutes'), ('order', 'o2', '{}', now())`, pgx.Identifier{w.table}.Sanitize()))
	require.NoError(t, err)
	admin, err := relay.NewAdmin(w.pool, w.cfg)
	require.NoError(t, err)
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	reg, err := otelrelay.RegisterTableMetrics(admin, otelrelay.WithMeterProvider(mp))
	require.NoError(t, err)
	t.Cleanup(func() { _ = reg.Unregister() })

	var rm metricdata.ResourceMetrics
	require.NoError(t, reader.Collect(ctx, &rm))
	got := map[string]float64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			g, ok := m.Data.(metricdata.Gauge[float64])
			require.True(t, ok, "%s is a gauge", m.Name)
			for _, dp := range g.DataPoints {
				typ, _ := dp.Attributes.Value("messaging.destination.name")
				app, _ := dp.Attributes.Value(otelrelay.AppKey)
				require.Equal(t, "order", typ.AsString())
				require.Equal(t, w.cfg.AppName, app.AsString())
				got[m.Name] = dp.Value
			}
		}
	}
	require.InDelta(t, (10 * time.Minute).Seconds(), got[otelrelay.UndeliveredAgeName], 30)
	require.Equal(t, 2.0, got[otelrelay.UndeliveredName])
	require.Equal(t, 0.0, got[otelrelay.DeadName])
	require.Equal(t, 0.0, got[otelrelay.TypeRelaysName], "no relay delivers them")
}
