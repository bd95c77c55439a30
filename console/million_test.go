package console_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/xadm/relay"
	"github.com/xadm/relay/console"
)

// TestMillionRows renders every page of a table of 1,000,000 rows and prints
// how long each takes, beside the baselines that read the whole table: the
// exact count (Admin.CountByStatus) and a deep page of dead rows by OFFSET.
// No timing is asserted; what the pages show is.
//
//	go test -run TestMillionRows -v ./console
func TestMillionRows(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a table of 1,000,000 rows; -short skips it")
	}
	ctx := context.Background()
	w := setup(t)
	const (
		total    = 1_000_000
		sent     = 940_000
		pending  = 40_000
		retrying = 15_000
		dead     = 5_000
	)
	start := time.Now()
	// The history first (ids 1..940000), then the live rows, as a relay that
	// keeps up leaves it: four types, payloads of ~200 bytes.
	w.exec(t, `INSERT INTO %s (type, natural_key, payload, status, attempts, last_error, created_at, updated_at, sent_at)
		SELECT (ARRAY['orders','invoices','customers','shipments'])[1 + g %% 4], 'key-' || (g %% 50000),
			jsonb_build_object('id', g, 'customer', 'c-' || (g %% 9973), 'note', repeat('x', 120)),
			CASE WHEN g <= $1 THEN 'SENT' WHEN g <= $1 + $2 THEN 'PENDING' ELSE 'ERROR' END,
			CASE WHEN g <= $1 + $2 THEN 0 WHEN g <= $1 + $2 + $3 THEN 1 ELSE $4 END,
			CASE WHEN g > $1 + $2 THEN 'PUT http://dest.internal/x/' || g || ': 503 Service Unavailable' END,
			now() - make_interval(secs => ($5 - g) / 10.0), now() - make_interval(secs => ($5 - g) / 20.0),
			CASE WHEN g <= $1 THEN now() - make_interval(secs => ($5 - g) / 20.0) END
		FROM generate_series(1, $5) g`, sent, pending, retrying, ceiling, total)
	t.Logf("built %d rows in %s", total, time.Since(start).Round(time.Millisecond))

	srv := w.serve(t, console.Options{})
	c := newClient(t, srv, "")
	var deepAfter int64
	require.NoError(t, w.pool.QueryRow(ctx, fmt.Sprintf(`SELECT id FROM %s WHERE status = 'ERROR' AND attempts >= %d
		ORDER BY id OFFSET 4000 LIMIT 1`, pgx.Identifier{w.table}.Sanitize(), ceiling)).Scan(&deepAfter))

	pages := []struct {
		name, path string
		fresh      bool // a new console each time: nothing read before
	}{
		{"overview page (counts, lag, election)", "/", false},
		{"charts page (the last hour, by minute)", "/charts?s=0", true},
		{"charts page, read <10s before (cached)", "/charts?s=0", false},
		{"dead rows, first page", "/dead?s=0", false},
		{"dead rows, page 81 (keyset)", fmt.Sprintf("/dead?s=0&after=%d", deepAfter), false},
		{"dead rows of one type", "/dead?s=0&type=invoices", false},
	}
	// fresh is a new console, whose charts have read nothing yet.
	fresh := func() string { return w.serve(t, console.Options{}).URL }
	// measure logs every page's median and returns them by page.
	measure := func(state string) []time.Duration {
		t.Logf("%s:", state)
		var medians []time.Duration
		for _, p := range pages {
			var times []time.Duration
			for range 5 {
				cc := c
				if p.fresh {
					cc = newClient(t, &httptest.Server{URL: fresh()}, "")
				}
				s := time.Now()
				code, body := cc.get(p.path)
				times = append(times, time.Since(s))
				require.Equal(t, http.StatusOK, code, body)
			}
			slices.Sort(times)
			t.Logf("  %-40s median %7.1f ms  (min %.1f, max %.1f)", p.name, ms(times[2]), ms(times[0]), ms(times[4]))
			medians = append(medians, times[2])
		}
		s := time.Now()
		//lint:ignore SA1019 the exact count that reads the whole table is the baseline the pages are measured against
		counts, err := w.admin.CountByStatus(ctx)
		require.NoError(t, err)
		require.NotEmpty(t, counts)
		t.Logf("  %-40s        %7.1f ms", "baseline: exact count (full scan)", ms(time.Since(s)))
		s = time.Now()
		rows, err := w.pool.Query(ctx, fmt.Sprintf(`SELECT id, left(payload::text, 201) FROM %s
			WHERE direction = 'OUT' AND status = 'ERROR' AND attempts >= %d ORDER BY id OFFSET 4000 LIMIT 50`,
			pgx.Identifier{w.table}.Sanitize(), ceiling))
		require.NoError(t, err)
		rows.Close()
		t.Logf("  %-40s        %7.1f ms", "baseline: page 81 by OFFSET", ms(time.Since(s)))
		return medians
	}

	// In Chromium: from navigation to the load event, the page drawn.
	inBrowser := func() []time.Duration {
		b := browser(t)
		var medians []time.Duration
		for _, p := range pages[:3] {
			var times []time.Duration
			for range 5 {
				base := srv.URL
				if p.fresh {
					base = fresh()
				}
				s := time.Now()
				step(t, b, chromedp.Navigate(base+p.path))
				times = append(times, time.Since(s))
			}
			slices.Sort(times)
			t.Logf("  %-40s median %7.1f ms  (min %.1f, max %.1f) in Chromium", p.name, ms(times[2]), ms(times[0]), ms(times[4]))
			medians = append(medians, times[2])
		}
		charts := text(t, b, "#chart-all")
		require.Contains(t, charts, "delivered in the hour")
		return medians
	}
	// ratio logs the charts page's first read (pages[1]) against the
	// overview (pages[0]), over HTTP and in Chromium.
	ratio := func(http, chromium []time.Duration) {
		t.Logf("  charts page, first read / overview page: %.2f over HTTP (%.1f / %.1f ms), %.2f in Chromium (%.1f / %.1f ms)",
			float64(http[1])/float64(http[0]), ms(http[1]), ms(http[0]),
			float64(chromium[1])/float64(chromium[0]), ms(chromium[1]), ms(chromium[0]))
	}

	w.exec(t, "ANALYZE %s")
	ratio(measure("after ANALYZE (as autovacuum leaves a fresh load)"), inBrowser())

	// What the page shows is what the table holds.
	code, body := c.get("/")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, fmt.Sprintf(`<td class="n pending">%s</td>`, "40,000"))
	require.Contains(t, body, fmt.Sprintf(`<td class="n retrying">%s</td>`, "15,000"))
	require.Contains(t, body, fmt.Sprintf(`<td class="n dead">%s</td>`, "5,000"))
	require.Contains(t, body, `<td class="n sent">≈ `, "the history is estimated")
	o, err := w.admin.Overview(ctx)
	require.NoError(t, err)
	require.True(t, o.SentEstimated)
	require.InDelta(t, sent, o.Sent, sent/20)
	require.EqualValues(t, pending, o.Pending)
	require.EqualValues(t, retrying, o.Retrying)
	require.EqualValues(t, dead, o.Dead)
	page, err := w.admin.DeadPage(ctx, relay.DeadQuery{AfterID: deepAfter})
	require.NoError(t, err)
	require.Len(t, page, relay.DeadPageDefault)
	require.Greater(t, page[0].ID, deepAfter)

	h, err := w.admin.History(ctx, time.Hour, time.Minute)
	require.NoError(t, err)
	var delivered int64
	for _, th := range h.Types {
		for _, n := range th.Delivered {
			delivered += n
		}
	}
	// Rows 928,001..940,000 were delivered 3,600 to 3,000 s ago (a row g at
	// (1,000,000 - g) / 20 s ago): the first ten minutes of the hour.
	require.InDelta(t, 12_000, delivered, 1500, "less the rows the window left behind while the test ran")
	t.Logf("  the charts read from id %d (the table's rows from 928,001 were delivered or waited in the hour)", h.FromID)

	w.exec(t, "VACUUM ANALYZE %s")
	ratio(measure("after VACUUM ANALYZE (index-only scans)"), inBrowser())
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
