package console_test

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/xadm/relay"
	"github.com/xadm/relay/console"
)

// TestBrowserScreenshots renders each page of an incident in Chromium: a JVM
// relay holds the election of "billing" while rows pile up and some are dead,
// and "shipping", delivered by this process's relay, is healthy. With
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
	billing.rows(t, "invoices", 5, "ERROR", ceiling, time.Hour)
	billing.rows(t, "refunds", 2, "ERROR", 1, 9*time.Minute)
	billing.holdLikeJVM(t)

	shipping.rows(t, "shipments", 120, "PENDING", 0, time.Second)
	fail := errors.New("PUT http://carrier.internal/shipments/7: 503 Service Unavailable")
	r, err := relay.New(shipping.pool, shipping.cfg, senderFunc{"shipments", func(m relay.Message) error {
		if m.ID%40 == 0 {
			return fail
		}
		return nil
	}})
	require.NoError(t, err)
	_, err = r.Run(ctx)
	require.NoError(t, err)

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
		step(t, b, chromedp.Navigate(srv+path))
		sctx, cancel := context.WithTimeout(b, browserTimeout)
		defer cancel()
		png, err := chromedp.Run(sctx, chromedp.FullScreenshot(100))
		require.NoError(t, err)
		require.True(t, bytes.HasPrefix(png, []byte("\x89PNG")), "%s is a PNG", name)
		if dir != "" {
			require.NoError(t, os.WriteFile(filepath.Join(dir, name), png, 0o644))
		}
	}
	login(t, b, srv, "admin")
	shot("overview.png", "/relay/")
	require.Contains(t, text(t, b, "#source-0"), "STALLED")
	shot("app-stalled.png", "/relay/app?s=0")
	require.Contains(t, text(t, b, "#summary"), "another client")
	shot("dead-rows.png", "/relay/dead?s=0")
	shot("app-healthy.png", "/relay/app?s=1")
	require.Contains(t, text(t, b, "#stats"), "1") // this process's relay ran a pass
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
