package console_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/xadm/relay"
	"github.com/xadm/relay/console"
)

// chromium finds the headless browser: $RELAY_TEST_CHROMIUM, else Debian's
// chromium or Google Chrome on the PATH. The browser tests fail, never skip,
// without one.
func chromium(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("RELAY_TEST_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"/usr/bin/chromium", "chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("headless Chromium is not installed: the console's browser tests need it " +
		"(Debian: apt-get install -y chromium; or set RELAY_TEST_CHROMIUM to a Chrome or Chromium binary)")
	return ""
}

// browserTimeout bounds one step in the browser on a busy machine.
const browserTimeout = time.Minute

// browser starts a headless Chromium of its own for t, with a fresh profile,
// and returns a tab's context. Everything ends when t does.
func browser(t *testing.T) context.Context {
	t.Helper()
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromium(t)),
		// Without these it hangs on a closed network, waiting for services
		// it cannot reach.
		chromedp.Flag("headless", true),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.Flag("disable-quic", true),
		chromedp.NoFirstRun,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.Flag("no-default-browser-check", true),
		chromedp.WindowSize(1280, 900),
		chromedp.UserDataDir(t.TempDir()),
	}
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(allocCtx)
	t.Cleanup(func() {
		_ = chromedp.Cancel(ctx) // closes the browser and waits for it
		cancel()
		cancelAlloc()
	})
	// The first action starts the browser; no timeout on it (it would end the browser).
	start := make(chan error, 1)
	go func() { start <- chromedp.Do(ctx) }()
	select {
	case err := <-start:
		require.NoError(t, err, "start Chromium")
	case <-time.After(2 * browserTimeout):
		t.Fatal("Chromium did not start")
	}
	return ctx
}

// step runs actions with a deadline.
func step(t *testing.T, ctx context.Context, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	sctx, cancel := context.WithTimeout(ctx, browserTimeout)
	defer cancel()
	require.NoError(t, chromedp.Do(sctx, actions...))
}

// submit clicks sel, which submits a form, and returns the status of the page
// the browser ends on.
func submit(t *testing.T, ctx context.Context, sel string) int64 {
	t.Helper()
	sctx, cancel := context.WithTimeout(ctx, browserTimeout)
	defer cancel()
	resp, err := chromedp.RunResponse(sctx, chromedp.Click(chromedp.CSS(sel)))
	require.NoError(t, err)
	return resp.Status
}

func text(t *testing.T, ctx context.Context, sel string) string {
	t.Helper()
	sctx, cancel := context.WithTimeout(ctx, browserTimeout)
	defer cancel()
	s, err := chromedp.Run(sctx, chromedp.Text(chromedp.CSS(sel)))
	require.NoError(t, err, sel)
	return strings.TrimSpace(s)
}

// login sets the tests' "user" cookie in the browser for the server at base.
func login(t *testing.T, ctx context.Context, base, user string) {
	t.Helper()
	step(t, ctx, chromedp.Navigate(base+"/nowhere")) // any page of the origin, to set its cookie
	sctx, cancel := context.WithTimeout(ctx, browserTimeout)
	defer cancel()
	_, err := chromedp.Run(sctx, chromedp.Evaluate[any](fmt.Sprintf(`document.cookie = "user=%s; path=/"`, user)))
	require.NoError(t, err)
}

// TestBrowserShowsTheTable: the page shows the counts the table holds, the
// lag, the diagnosis and who holds the election.
func TestBrowserShowsTheTable(t *testing.T) {
	w := setup(t)
	w.rows(t, "orders", 1234, "PENDING", 0, 10*time.Minute)
	w.rows(t, "orders", 7, "ERROR", 1, 5*time.Minute)
	w.rows(t, "orders", 40, "SENT", 0, time.Hour)
	w.rows(t, "invoices", 5, "ERROR", ceiling, time.Hour)
	w.rows(t, "invoices", 12, "SENT", 0, time.Hour)
	pid := w.holdLikeJVM(t)
	srv := w.serve(t, console.Options{Actions: true, Authorize: users})

	ctx := browser(t)
	login(t, ctx, srv.URL, "viewer")
	step(t, ctx, chromedp.Navigate(srv.URL+"/"))
	require.Equal(t, "1,234", text(t, ctx, `#counts tr[data-type="orders"] td.pending`))
	require.Equal(t, "7", text(t, ctx, `#counts tr[data-type="orders"] td.retrying`))
	require.Equal(t, "0", text(t, ctx, `#counts tr[data-type="orders"] td.dead`))
	require.Equal(t, "40", text(t, ctx, `#counts tr[data-type="orders"] td.sent`))
	require.True(t, strings.HasPrefix(text(t, ctx, `#counts tr[data-type="orders"] td.lag`), "10m"), "the oldest row's age")
	require.Equal(t, "5", text(t, ctx, `#counts tr[data-type="invoices"] td.dead`))
	require.Equal(t, "12", text(t, ctx, `#counts tr[data-type="invoices"] td.sent`))
	require.Equal(t, "1,234", text(t, ctx, `#totals td.pending`))
	require.Equal(t, "52", text(t, ctx, `#totals td.sent`))

	require.Equal(t, "STALLED", text(t, ctx, "#verdict"))
	summary := text(t, ctx, "#summary")
	require.Contains(t, summary, "Nothing is delivered because another client")
	require.Contains(t, summary, fmt.Sprintf("pg_terminate_backend(%d)", pid))
	require.NotContains(t, summary, "`", "commands are set as code, not quoted in backticks")
	require.Equal(t, "relayctl requeue --type T", text(t, ctx, "#summary code"))
	require.Contains(t, summary, "reached MaxAttempts (3) after 3 attempts")
	legend := text(t, ctx, "#legend")
	require.Contains(t, legend, "Dead: reached MaxAttempts (3) or died of a permanent failure")
	require.NotContains(t, legend, "failed 3 times")
	require.Contains(t, text(t, ctx, `#election tr[data-kind="other"]`), "PostgreSQL JDBC Driver")
	require.Contains(t, text(t, ctx, "#read-only"), "viewer may see this console but not act on it")

	step(t, ctx, chromedp.Navigate(srv.URL+"/dead?s=0&type=invoices"))
	require.Contains(t, text(t, ctx, "#dead"), "422 Unprocessable Entity")
	require.Contains(t, text(t, ctx, "#dead"), `{"note": "a payload of invoices", "order": 1}`)
}

// TestBrowserRequeueIsDelivered: a dead row's re-queue button asks first,
// showing the row and the one attempt it made before a 400 killed it;
// confirmed, the row is re-queued and then delivered by a relay.
func TestBrowserRequeueIsDelivered(t *testing.T) {
	w := setup(t)
	dead := w.rows(t, "invoices", 3, "ERROR", ceiling, time.Hour)
	w.exec(t, "UPDATE %s SET last_error = 'permanent after 1 attempt(s): PUT http://invoices.internal/1: 400 Bad Request' WHERE id = $1", dead)
	srv := w.serve(t, console.Options{Actions: true, Authorize: users, PageSize: 2})

	ctx := browser(t)
	login(t, ctx, srv.URL, "admin")
	step(t, ctx, chromedp.Navigate(srv.URL+"/dead?s=0"))
	require.Contains(t, text(t, ctx, "#dead"), "invoices-1")
	require.Equal(t, "permanent, 1 attempt", text(t, ctx, fmt.Sprintf(`#dead tr[data-id="%d"] td.attempts`, dead)))
	status := submit(t, ctx, fmt.Sprintf(`button[data-requeue-id="%d"]`, dead))
	require.EqualValues(t, http.StatusOK, status)
	require.Contains(t, text(t, ctx, "#confirm-lead"), fmt.Sprintf("Re-queue row %d (type \"invoices\")", dead), "it asks first")
	require.Equal(t, "1", text(t, ctx, fmt.Sprintf(`#confirm-rows-list tr[data-id="%d"] td.attempts`, dead)), "the attempts made")
	require.Contains(t, text(t, ctx, "#confirm-rows-list"), "died of a permanent failure after 1 attempt")
	st, _ := w.status(t, dead)
	require.Equal(t, "ERROR", st, "nothing before the confirmation")
	require.Empty(t, w.logs.Lines("re-queued dead rows"))
	status = submit(t, ctx, "#confirm-button")
	require.EqualValues(t, http.StatusOK, status, "redirected back to the dead rows")
	require.Equal(t, "Re-queued 1 dead row(s): the next pass delivers them.", text(t, ctx, "#flash"))
	st, attempts := w.status(t, dead)
	require.Equal(t, "ERROR", st, "re-queued: a failed row with 0 attempts, due at once")
	require.Zero(t, attempts)
	require.Len(t, w.logs.Lines("re-queued dead rows", "who=admin", fmt.Sprintf("id=%d", dead), "requeued=1"), 1)

	// The page now lists the two rows still dead, without the re-queued one.
	sctx, cancel := context.WithTimeout(ctx, browserTimeout)
	defer cancel()
	ids, err := chromedp.Run(sctx, chromedp.Evaluate[[]string](`[...document.querySelectorAll("#dead tr[data-id]")].map(r => r.dataset.id)`))
	require.NoError(t, err)
	require.Equal(t, []string{fmt.Sprint(dead + 1), fmt.Sprint(dead + 2)}, ids)

	rec := &recorder{typ: "invoices"}
	r, err := relay.New(w.pool, w.cfg, rec)
	var n int
	require.NoError(t, err)
	n, err = r.Run(context.Background())
	require.NoError(t, err)
	require.Equal(t, 1, n, "only the re-queued row is delivered; the others stay dead")
	require.Equal(t, []int64{dead}, rec.delivered())
	st, _ = w.status(t, dead)
	require.Equal(t, "SENT", st)
}

// TestBrowserActionWithoutPermission: who may see but not act gets no
// buttons, and an action posted from a page loaded while they could act is
// refused once they cannot.
func TestBrowserActionWithoutPermission(t *testing.T) {
	w := setup(t)
	dead := w.rows(t, "invoices", 1, "ERROR", ceiling, time.Hour)
	srv := w.serve(t, console.Options{Actions: true, Authorize: users})

	ctx := browser(t)
	login(t, ctx, srv.URL, "viewer")
	step(t, ctx, chromedp.Navigate(srv.URL+"/dead?s=0"))
	sctx, cancel := context.WithTimeout(ctx, browserTimeout)
	defer cancel()
	buttons, err := chromedp.Run(sctx, chromedp.Evaluate[int](`document.querySelectorAll("button").length`))
	require.NoError(t, err)
	require.Zero(t, buttons, "a viewer sees no action")

	// Loaded as admin, then the permission goes: the click is refused.
	login(t, ctx, srv.URL, "admin")
	step(t, ctx, chromedp.Navigate(srv.URL+"/dead?s=0"))
	_, err = chromedp.Run(sctx, chromedp.Evaluate[any](`document.cookie = "user=viewer; path=/"`))
	require.NoError(t, err)
	status := submit(t, ctx, fmt.Sprintf(`button[data-requeue-id="%d"]`, dead))
	require.EqualValues(t, http.StatusForbidden, status)
	require.Contains(t, text(t, ctx, "#error"), "viewer may see this console but not act on it")
	st, _ := w.status(t, dead)
	require.Equal(t, "ERROR", st, "nothing changed")
	require.Len(t, w.logs.Lines("refused: may not act", "who=viewer"), 1)
}

// TestBrowserCrossSitePost: a page on another site that submits a form to the
// console is refused, even when it knows the session's token.
func TestBrowserCrossSitePost(t *testing.T) {
	w := setup(t)
	dead := w.rows(t, "invoices", 2, "ERROR", ceiling, time.Hour)
	srv := w.serve(t, console.Options{Actions: true, Authorize: users})

	ctx := browser(t)
	login(t, ctx, srv.URL, "admin")
	step(t, ctx, chromedp.Navigate(srv.URL+"/"))
	sctx, cancel := context.WithTimeout(ctx, browserTimeout)
	defer cancel()
	token, err := chromedp.Run(sctx, chromedp.Evaluate[string](`document.querySelector('input[name="token"]').value`))
	require.NoError(t, err)
	require.Len(t, token, 64)

	// The attacker's page is served from another site: localhost, not 127.0.0.1.
	evil := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, _ *http.Request) {
		rw.Header().Set("Content-Type", "text/html")
		fmt.Fprintf(rw, `<!doctype html><title>free coupons</title>
<form method="post" action="%s/requeue"><input type="hidden" name="s" value="0"><input type="hidden" name="all" value="1"><input type="hidden" name="confirm" value="1">
<input type="hidden" name="token" value="%s"><button id="go" type="submit">Claim</button></form>`, srv.URL, token)
	}))
	t.Cleanup(evil.Close)
	evilURL := strings.Replace(evil.URL, "127.0.0.1", "localhost", 1)
	step(t, ctx, chromedp.Navigate(evilURL))
	status := submit(t, ctx, "#go")
	require.EqualValues(t, http.StatusForbidden, status)
	require.Contains(t, text(t, ctx, "#error"), "came from another site")
	st, _ := w.status(t, dead)
	require.Equal(t, "ERROR", st, "nothing was re-queued")
	require.Len(t, w.logs.Lines("refused: cross-origin request", "who=admin", "sec_fetch_site=cross-site"), 1)

	// The same form on the console's own page asks first, then goes through.
	step(t, ctx, chromedp.Navigate(srv.URL+"/"))
	require.EqualValues(t, http.StatusOK, submit(t, ctx, "#requeue-all"))
	require.Contains(t, text(t, ctx, "#confirm-lead"), "Re-queue 2 dead row(s)")
	require.Equal(t, "2", text(t, ctx, `#confirm-types tr[data-type="invoices"] td.n`))
	st, _ = w.status(t, dead)
	require.Equal(t, "ERROR", st, "not before the confirmation")
	require.EqualValues(t, http.StatusOK, submit(t, ctx, "#confirm-button"))
	require.Equal(t, "Re-queued 2 dead row(s): the next pass delivers them.", text(t, ctx, "#flash"))
}

// TestBrowserCharts: the charts render in Chromium as the page's own SVG:
// bars where rows were delivered, a line for the lag, no script, nothing
// fetched besides the page.
func TestBrowserCharts(t *testing.T) {
	w := setup(t)
	// orders: 20 rows a minute, written and delivered 5 s apart, for the
	// last 30 minutes but for minutes 10 to 14 ago, when nothing was.
	w.exec(t, `INSERT INTO %s (type, natural_key, payload, status, created_at, updated_at, sent_at)
		SELECT 'orders', 'k' || g, '{}', 'SENT', now() - make_interval(secs => g * 3 + 5), now(), now() - make_interval(secs => g * 3)
		FROM generate_series(1, 600) g WHERE g * 3 NOT BETWEEN 600 AND 899`)
	w.rows(t, "invoices", 1, "PENDING", 0, 25*time.Minute)
	srv := w.serve(t, console.Options{})

	ctx := browser(t)
	step(t, ctx, chromedp.Navigate(srv.URL+"/"))
	status := submit(t, ctx, "#charts-link") // a link: a GET the click follows
	require.EqualValues(t, http.StatusOK, status)
	sctx, cancel := context.WithTimeout(ctx, browserTimeout)
	defer cancel()
	type drawn struct {
		Charts, Scripts, Fetched int
		Width, Height            float64
		OrdersBars, AllBars      int
		LagPoints                int
	}
	got, err := chromedp.Run(sctx, chromedp.Evaluate[drawn](`(() => {
		const box = document.querySelector("#delivered-all").getBoundingClientRect();
		return {
			Charts: document.querySelectorAll("svg.chart").length,
			Scripts: document.scripts.length,
			Fetched: performance.getEntriesByType("resource").length,
			Width: box.width, Height: box.height,
			OrdersBars: document.querySelectorAll('#delivered-type-orders rect[fill="#2f6fd0"]').length,
			AllBars: document.querySelectorAll('#delivered-all rect[fill="#2f6fd0"]').length,
			LagPoints: document.querySelector("#lag-type-invoices polyline").points.length,
		};
	})()`))
	require.NoError(t, err)
	require.Equal(t, 6, got.Charts, "all types, orders and invoices: two each")
	require.Zero(t, got.Scripts)
	require.Zero(t, got.Fetched, "nothing but the page")
	require.InDelta(t, 560, got.Width, 1)
	require.InDelta(t, 150, got.Height, 1)
	require.InDelta(t, 25.5, got.OrdersBars, 2, "30 minutes of deliveries less the 5 without, give or take the minutes the window cuts")
	require.Equal(t, got.OrdersBars, got.AllBars)
	require.Equal(t, 60, got.LagPoints, "one point a minute")
	require.Contains(t, text(t, ctx, `#chart-all`), "Lag now 25m")
}
