package console_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/xadm/relay"
	"github.com/xadm/relay/console"
)

// TestBrowserScreenshots renders each page of an incident in Chromium: a JVM
// relay holds the election of "billing" while rows pile up, some are dead
// (a 422 killed them at their first attempt) and two wait out a retry's
// backoff, and "shipping", delivered by this process's relay, is healthy. With
// RELAY_CONSOLE_SCREENSHOTS=dir it writes the PNGs there (docs/console holds
// them):
//
//	RELAY_CONSOLE_SCREENSHOTS=$PWD/../docs/console go test -run TestBrowserScreenshots ./
func TestBrowserScreenshots(t *testing.T) {
	ctx := context.Background()
	billing, shipping := named(t, "billing"), named(t, "shipping")

	billing.rows(t, "orders", 40, "SENT", 0, 2*time.Hour)
	billing.rows(t, "orders", 1234, "PENDING", 0, 14*time.Minute)
	billing.rows(t, "invoices", 310, "SENT", 0, 3*time.Hour)
	dead := billing.rows(t, "invoices", 5, "ERROR", ceiling, time.Hour)
	billing.exec(t, "UPDATE %s SET last_error = 'permanent after 1 attempt(s): ' || last_error WHERE type = 'invoices' AND status = 'ERROR'")
	billing.rows(t, "refunds", 2, "ERROR", 2, 9*time.Minute)
	billing.exec(t, "UPDATE %s SET updated_at = now() - interval '5 seconds', "+
		"last_error = 'PUT http://refunds.internal/refunds/1: 503 Service Unavailable' WHERE type = 'refunds'")
	billing.holdLikeJVM(t)
	billing.cfg.RetryBackoff = time.Minute // as the relays of billing run: the refunds wait out their backoff
	var err error
	billing.admin, err = relay.NewAdmin(billing.pool, billing.cfg, relay.AdminAllTypes())
	require.NoError(t, err)

	// shipping's last hour: about 40 shipments a minute delivered within
	// seconds, but for a slow spell 35 to 25 minutes ago when they waited
	// up to 4 minutes; and a few returns.
	shipping.exec(t, `INSERT INTO %s (type, natural_key, payload, status, created_at, updated_at, sent_at)
		SELECT 'shipments', 'k' || g, '{}', 'SENT', now() - make_interval(secs => g * 1.5 + w), now(), now() - make_interval(secs => g * 1.5)
		FROM generate_series(1, 2400) g, LATERAL (SELECT CASE WHEN g * 1.5 BETWEEN 1500 AND 2100 THEN (2100 - g * 1.5) / 2.5 ELSE 2 + g %% 5 END AS w) l`)
	shipping.exec(t, `INSERT INTO %s (type, natural_key, payload, status, created_at, updated_at, sent_at)
		SELECT 'returns', 'r' || g, '{}', 'SENT', now() - make_interval(secs => g * 40 + 3), now(), now() - make_interval(secs => g * 40)
		FROM generate_series(1, 90) g`)
	billing.exec(t, `INSERT INTO %s (type, natural_key, payload, status, created_at, updated_at, sent_at)
		SELECT 'orders', 'o' || g, '{}', 'SENT', now() - make_interval(secs => 900 + g * 6 + 1), now(), now() - make_interval(secs => 900 + g * 6)
		FROM generate_series(1, 450) g`)
	shipping.rows(t, "shipments", 120, "PENDING", 0, time.Second)
	fail := errors.New("PUT http://carrier.internal/shipments/7: 503 Service Unavailable")
	r, err := relay.New(shipping.pool, shipping.cfg, senderFunc{"shipments", func(m relay.Message) error {
		if m.ID%40 == 0 && m.Attempts == 0 {
			return fail // its retry goes through
		}
		return nil
	}})
	require.NoError(t, err)
	_, err = r.Run(ctx)
	require.NoError(t, err)
	require.NoError(t, r.Start(ctx)) // live: its presence says it serves shipments
	t.Cleanup(func() { _ = r.Stop(context.Background()) })

	c, err := console.New(console.Options{
		Sources:   []console.Source{{Admin: billing.admin}, {Admin: shipping.admin, Relay: r}},
		Actions:   true,
		Authorize: users,
		Logger:    billing.logs.Logger(),
	})
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle("/relay/", http.StripPrefix("/relay", c))
	hs := httptest.NewServer(mux)
	t.Cleanup(hs.Close)
	srv := hs.URL

	b := browser(t)
	dir := os.Getenv("RELAY_CONSOLE_SCREENSHOTS")
	shot := func(name, path string) {
		t.Helper()
		if path != "" {
			step(t, b, chromedp.Navigate(srv+path))
		}
		sctx, cancel := context.WithTimeout(b, browserTimeout)
		defer cancel()
		png, err := chromedp.Run(sctx, chromedp.FullScreenshot(100))
		require.NoError(t, err)
		require.True(t, bytes.HasPrefix(png, []byte("\x89PNG")), "%s is a PNG", name)
		if dir != "" {
			small := shrinkPNG(t, png)
			require.LessOrEqual(t, len(small), 150<<10, "%s: %d bytes, more than the docs' 150 KB", name, len(small))
			require.NoError(t, os.WriteFile(filepath.Join(dir, name), small, 0o644))
		}
	}
	login(t, b, srv, "admin")
	shot("overview.png", "/relay/")
	require.Contains(t, text(t, b, "#source-0"), "STALLED")
	shot("app-stalled.png", "/relay/app?s=0")
	require.Contains(t, text(t, b, "#summary"), "another client")
	shot("dead-rows.png", "/relay/dead?s=0")
	require.Contains(t, text(t, b, "#dead"), "permanent, 1 attempt")
	// One row's re-queue asks first: the row, the attempt it made, how it died.
	require.EqualValues(t, http.StatusOK, submit(t, b, fmt.Sprintf(`button[data-requeue-id="%d"]`, dead)))
	require.Contains(t, text(t, b, "#confirm-rows-list"), "died of a permanent failure after 1 attempt")
	shot("confirm-requeue.png", "")
	shot("app-healthy.png", "/relay/app?s=1")
	require.Equal(t, "OK", text(t, b, "#verdict"))
	require.Contains(t, text(t, b, "#stats"), "1") // this process's relay ran a pass
	shot("charts.png", "/relay/charts?s=1")
	require.Contains(t, text(t, b, "#chart-all"), "delivered in the hour")
	shot("charts-stalled.png", "/relay/charts?s=0")
	require.Contains(t, text(t, b, "#chart-all"), "Lag now 14m")
	// The purge's confirmation: how many rows of which types, before any.
	step(t, b, chromedp.Navigate(srv+"/relay/app?s=1"), chromedp.SetValue(chromedp.CSS("#purge-age"), "0"))
	require.EqualValues(t, http.StatusOK, submit(t, b, "#purge"))
	require.Contains(t, text(t, b, "#confirm-lead"), "SENT row(s)")
	shot("confirm-purge.png", "")
	login(t, b, srv, "viewer")
	shot("read-only.png", "/relay/app?s=0")
	require.Contains(t, text(t, b, "#read-only"), "viewer may see")
}

// named is setup with a fixed app name, for pages that read well; the table
// keeps its unique name.
func named(t *testing.T, app string) *world {
	t.Helper()
	w := setup(t)
	w.app = app
	w.cfg.AppName = app
	var err error
	w.admin, err = relay.NewAdmin(w.pool, w.cfg, relay.AdminAllTypes())
	require.NoError(t, err)
	return w
}

type senderFunc struct {
	typ  string
	send func(relay.Message) error
}

func (s senderFunc) Type() string { return s.typ }

func (s senderFunc) Send(_ context.Context, m relay.Message) error { return s.send(m) }

// shrinkPNG re-encodes a screenshot for the docs: its 255 most frequent
// colours (a page is mostly flat colour and anti-aliased text), each other
// pixel the nearest of them, at the best compression.
func shrinkPNG(t *testing.T, b []byte) []byte {
	t.Helper()
	img, err := png.Decode(bytes.NewReader(b))
	require.NoError(t, err)
	bounds := img.Bounds()
	freq := map[color.RGBA]int{}
	for y := bounds.Min.Y; y < bounds.Max.Y; y++ {
		for x := bounds.Min.X; x < bounds.Max.X; x++ {
			freq[color.RGBAModel.Convert(img.At(x, y)).(color.RGBA)]++
		}
	}
	colors := make([]color.RGBA, 0, len(freq))
	for c := range freq {
		colors = append(colors, c)
	}
	sort.Slice(colors, func(i, j int) bool { return freq[colors[i]] > freq[colors[j]] })
	pal := make(color.Palette, 0, 256)
	for _, c := range colors[:min(len(colors), 255)] {
		pal = append(pal, c)
	}
	out := image.NewPaletted(bounds, pal)
	nearest := map[color.RGBA]uint8{}
	for y := bounds.Min.Y; y < bounds.Max.Y; y++ {
		for x := bounds.Min.X; x < bounds.Max.X; x++ {
			c := color.RGBAModel.Convert(img.At(x, y)).(color.RGBA)
			i, ok := nearest[c]
			if !ok {
				i = uint8(pal.Index(c))
				nearest[c] = i
			}
			out.SetColorIndex(x, y, i)
		}
	}
	var buf bytes.Buffer
	require.NoError(t, (&png.Encoder{CompressionLevel: png.BestCompression}).Encode(&buf, out))
	return buf.Bytes()
}
