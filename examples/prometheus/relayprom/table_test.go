package relayprom_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/xadm/relay"
	"github.com/xadm/relay/examples/prometheus/relayprom"
	"github.com/xadm/relay/internal/testkit/pgserver"
)

func TestMain(m *testing.M) { os.Exit(pgserver.Run(m, "RELAY_TEST_DATABASE_URL")) }

// gauges gathers reg's gauges by name and type label.
func gauges(t *testing.T, reg *prometheus.Registry) map[string]map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	out := map[string]map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			typ := ""
			for _, l := range m.GetLabel() {
				if l.GetName() == "type" {
					typ = l.GetValue()
				}
			}
			if out[mf.GetName()] == nil {
				out[mf.GetName()] = map[string]float64{}
			}
			out[mf.GetName()][typ] = gaugeValue(m)
		}
	}
	return out
}

func gaugeValue(m *dto.Metric) float64 { return m.GetGauge().GetValue() }

// TestTableCollector reads a real table: app orders' relay delivers "order";
// "invoice" rows wait with no relay for them, one of them dead. The
// collector says each type's age, waiting and dead rows and its relays, with
// the app and table as labels, and reads the table at most once per Every.
func TestTableCollector(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	name := pgserver.Name(t)
	pool := pgserver.Pool(t, pgserver.Shared().URL, name, 6)
	require.NoError(t, relay.CreateTable(ctx, pool, name))
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+pgx.Identifier{name}.Sanitize()+", "+pgx.Identifier{name + "_types"}.Sanitize())
	})
	cfg := relay.DefaultConfig()
	cfg.AppName, cfg.Table, cfg.MaxAttempts = name, name, 3
	r, err := relay.New(pool, cfg, relay.SenderFunc("order", func(context.Context, relay.Message) error { return nil }))
	require.NoError(t, err)
	require.NoError(t, r.Start(ctx))
	t.Cleanup(func() { _ = r.Stop(context.Background()) })
	_, err = pool.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (type, natural_key, payload, status, attempts, created_at)
		VALUES ('invoice', 'i1', '{}', 'PENDING', 0, now() - interval '10 minutes'),
		       ('invoice', 'i2', '{}', 'PENDING', 0, now() - interval '1 minute'),
		       ('invoice', 'i3', '{}', 'ERROR', 3, now() - interval '1 hour')`, pgx.Identifier{name}.Sanitize()))
	require.NoError(t, err)

	admin, err := relay.NewAdmin(pool, cfg)
	require.NoError(t, err)
	c := relayprom.NewTableCollector(admin, relayprom.TableOptions{Every: time.Hour})
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(c))
	var g map[string]map[string]float64
	require.Eventually(t, func() bool {
		c = relayprom.NewTableCollector(admin, relayprom.TableOptions{Every: time.Hour})
		reg = prometheus.NewPedanticRegistry()
		require.NoError(t, reg.Register(c))
		g = gauges(t, reg)
		return g["relay_relays"][""] == 1 && g["relay_type_relays"]["order"] == 1
	}, 10*time.Second, 20*time.Millisecond, "the relay's presence is read")
	require.Equal(t, 1.0, g["relay_table_up"][""])
	require.InDelta(t, 600, g["relay_undelivered_age_seconds"]["invoice"], 30, "its oldest waiting row, not the dead one")
	require.Equal(t, 2.0, g["relay_undelivered_messages"]["invoice"])
	require.Equal(t, 1.0, g["relay_dead_messages"]["invoice"])
	require.Equal(t, 0.0, g["relay_type_relays"]["invoice"], "no relay delivers it: RelayNoRelay's condition")
	require.Equal(t, 0.0, g["relay_undelivered_messages"]["order"])

	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		labels := map[string]string{}
		for _, l := range mf.GetMetric()[0].GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		require.Equal(t, name, labels["app"], mf.GetName())
		require.Equal(t, name, labels["table"], mf.GetName())
	}

	// Within Every, a scrape gets the last values: a new row is not seen.
	_, err = pool.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (type, natural_key, payload) VALUES ('invoice', 'i4', '{}')`, pgx.Identifier{name}.Sanitize()))
	require.NoError(t, err)
	require.Equal(t, 2.0, gauges(t, reg)["relay_undelivered_messages"]["invoice"])
}
