package console_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/xadm/relay"
	"github.com/xadm/relay/console"
)

func TestNew(t *testing.T) {
	t.Parallel()
	w := setup(t)
	src := []console.Source{{Admin: w.admin}}
	for _, tc := range []struct {
		opts console.Options
		want string
	}{
		{console.Options{}, "Options.Sources is empty"},
		{console.Options{Sources: []console.Source{{}}}, "Options.Sources[0].Admin is nil"},
		{console.Options{Sources: src, Actions: true}, "Options.Actions needs Options.Authorize"},
		{console.Options{Sources: src, Prefix: "relay/"}, "Options.Prefix"},
		{console.Options{Sources: src, TrustedOrigins: []string{"not an origin"}}, "Options.TrustedOrigins"},
		{console.Options{Sources: src, PageSize: relay.ListDeadMax + 1}, "Options.PageSize must be between 1 and"},
		{console.Options{Sources: src, StallAfter: -time.Second}, "Options.StallAfter must not be negative"},
	} {
		_, err := console.New(tc.opts)
		require.ErrorContains(t, err, tc.want)
	}
}

// client is a browser-like HTTP client of a console: a cookie jar with the
// user's cookie, no redirects followed, and requests from the console's own
// origin as a browser sends them.
type client struct {
	t    *testing.T
	base string
	hc   *http.Client
}

func newClient(t *testing.T, srv *httptest.Server, user string) *client {
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	u, err := url.Parse(srv.URL)
	require.NoError(t, err)
	jar.SetCookies(u, []*http.Cookie{{Name: "user", Value: user}})
	hc := &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	return &client{t: t, base: srv.URL, hc: hc}
}

func (c *client) get(path string) (int, string) {
	c.t.Helper()
	resp, err := c.hc.Get(c.base + path)
	require.NoError(c.t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(c.t, err)
	return resp.StatusCode, string(b)
}

// post submits a form as the console's own page would, with site as the
// request's Sec-Fetch-Site ("same-origin" for the console's own forms).
func (c *client) post(path string, form url.Values, site string) (*http.Response, string) {
	c.t.Helper()
	req, err := http.NewRequest(http.MethodPost, c.base+path, strings.NewReader(form.Encode()))
	require.NoError(c.t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if site != "" {
		req.Header.Set("Sec-Fetch-Site", site)
	}
	resp, err := c.hc.Do(req)
	require.NoError(c.t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(c.t, err)
	return resp, string(b)
}

var tokenRE = regexp.MustCompile(`name="token" value="([0-9a-f]{64})"`)

// token loads path and returns the session token its forms carry.
func (c *client) token(path string) string {
	c.t.Helper()
	code, body := c.get(path)
	require.Equal(c.t, http.StatusOK, code, body)
	m := tokenRE.FindStringSubmatch(body)
	require.NotNil(c.t, m, "the page has a form with the session token")
	return m[1]
}

func TestPages(t *testing.T) {
	t.Parallel()
	w := setup(t)
	w.rows(t, "orders", 4, "PENDING", 0, 3*time.Second)
	dead := w.rows(t, "invoices", 3, "ERROR", ceiling, time.Hour)
	w.rows(t, "orders", 6, "SENT", 0, time.Hour)
	srv := w.serve(t, console.Options{})
	c := newClient(t, srv, "")

	code, body := c.get("/")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `<td class="n pending">4</td>`)
	require.Contains(t, body, `<a href="./dead?s=0&amp;type=invoices">3</a>`)
	require.Contains(t, body, `<td class="n sent">6</td>`)
	require.Contains(t, body, "Nobody holds it right now")
	require.Contains(t, body, "Read-only: the service did not turn actions on")
	require.NotContains(t, body, "<form", "no actions without Options.Actions")

	code, body = c.get("/dead?s=0&type=invoices")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `<tr data-id="`)
	require.Contains(t, body, "422 Unprocessable Entity")
	require.Contains(t, body, `{&#34;note&#34;: &#34;a payload of invoices&#34;, &#34;order&#34;: 1}`, "the payload preview, escaped")
	require.Contains(t, body, "invoices-1")

	code, _ = c.get("/dead?s=7")
	require.Equal(t, http.StatusNotFound, code)
	code, _ = c.get("/dead?after=x")
	require.Equal(t, http.StatusBadRequest, code)
	code, _ = c.get("/nope")
	require.Equal(t, http.StatusNotFound, code)

	// Read-only: an action is refused even with the session's token.
	c2 := newClient(t, w.serve(t, console.Options{Actions: true, Authorize: users}), "admin")
	token := c2.token("/")
	resp, _ := newClient(t, srv, "").post("/requeue", url.Values{"s": {"0"}, "all": {"1"}, "token": {token}}, "same-origin")
	require.Equal(t, http.StatusForbidden, resp.StatusCode)
	st, _ := w.status(t, dead)
	require.Equal(t, "ERROR", st)
	require.Len(t, w.logs.Lines("refused: actions are off", "action=requeue"), 1)
}

func TestActionsAndAuthorization(t *testing.T) {
	t.Parallel()
	w := setup(t)
	dead := w.rows(t, "invoices", 3, "ERROR", ceiling, time.Hour)
	w.rows(t, "orders", 2, "ERROR", ceiling, time.Hour)
	srv := w.serve(t, console.Options{Actions: true, Authorize: users})

	// Who may not see gets nothing.
	code, body := newClient(t, srv, "mallory").get("/")
	require.Equal(t, http.StatusForbidden, code)
	require.NotContains(t, body, "invoices")
	require.Len(t, w.logs.Lines("refused: may not see", "who=mallory"), 1)

	// A viewer sees no forms, and a forged action is refused and logged.
	viewer := newClient(t, srv, "viewer")
	code, body = viewer.get("/")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "viewer may see this console but not act on it")
	require.NotContains(t, body, "<form")
	admin := newClient(t, srv, "admin")
	token := admin.token("/")
	resp, body := viewer.post("/requeue", url.Values{"s": {"0"}, "id": {itoa(dead)}, "token": {token}}, "same-origin")
	require.Equal(t, http.StatusForbidden, resp.StatusCode)
	require.Contains(t, body, "viewer may see this console but not act on it")
	require.Len(t, w.logs.Lines("refused: may not act", "who=viewer", "action=requeue"), 1)
	st, _ := w.status(t, dead)
	require.Equal(t, "ERROR", st)

	// Without the session's token, or with another, an action is refused.
	resp, _ = admin.post("/requeue", url.Values{"s": {"0"}, "id": {itoa(dead)}}, "same-origin")
	require.Equal(t, http.StatusForbidden, resp.StatusCode)
	resp, _ = admin.post("/requeue", url.Values{"s": {"0"}, "id": {itoa(dead)}, "token": {strings.Repeat("0", 64)}}, "same-origin")
	require.Equal(t, http.StatusForbidden, resp.StatusCode)
	require.Len(t, w.logs.Lines("refused: missing or wrong session token"), 2)

	// From another site, even with the token, it is refused.
	for _, site := range []string{"cross-site", "same-site"} {
		resp, body = admin.post("/requeue", url.Values{"s": {"0"}, "all": {"1"}, "token": {token}}, site)
		require.Equal(t, http.StatusForbidden, resp.StatusCode, site)
		require.Contains(t, body, "came from another site")
	}
	require.Len(t, w.logs.Lines("refused: cross-origin request", "who=admin"), 2)
	st, _ = w.status(t, dead)
	require.Equal(t, "ERROR", st)

	// The admin's actions ask first: one row's with the row, how it died
	// and the attempts it made.
	w.exec(t, "UPDATE %s SET last_error = 'permanent after 1 attempt(s): 400 Bad Request' WHERE id = $1", dead)
	resp, body = admin.post("/requeue", url.Values{"s": {"0"}, "id": {itoa(dead)}, "token": {token}, "back": {"dead"}}, "same-origin")
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	require.Contains(t, body, fmt.Sprintf("Re-queue row %d (type &#34;invoices&#34;)", dead))
	require.Contains(t, body, `<td class="n attempts">1</td><td>died of a permanent failure after 1 attempt</td>`)
	require.Contains(t, body, `<input type="hidden" name="id" value="`+itoa(dead)+`"><input type="hidden" name="confirm" value="1">`)
	require.Contains(t, body, `href="./dead?s=0" id="cancel"`)
	st, _ = w.status(t, dead)
	require.Equal(t, "ERROR", st, "the first POST changes nothing")

	// Confirmed, they go through, are logged with who and what, and
	// redirect relative to the console's own path.
	resp, _ = admin.post("/requeue", url.Values{"s": {"0"}, "id": {itoa(dead)}, "token": {token}, "back": {"dead"}, "confirm": {"1"}}, "same-origin")
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	require.Equal(t, "./dead?done=requeued&n=1&s=0", resp.Header.Get("Location"))
	st, attempts := w.status(t, dead)
	require.Equal(t, "ERROR", st, "re-queued: a failed row with 0 attempts, due at once")
	require.Zero(t, attempts)
	require.Len(t, w.logs.Lines("re-queued dead rows", "who=admin", "action=requeue", "requeued=1", "id="+itoa(dead)), 1)
	code, body = admin.get("/dead?done=requeued&n=1&s=0")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "Re-queued 1 dead row(s)")

	// A type's asks first, with its count.
	resp, body = admin.post("/requeue", url.Values{"s": {"0"}, "type": {"invoices"}, "token": {token}}, "same-origin")
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	require.Contains(t, body, "Re-queue 2 dead row(s) of "+w.table)
	require.Contains(t, body, `<tr data-type="invoices"><td class="mono">invoices</td><td class="n">2</td></tr>`)
	require.NotContains(t, body, `data-type="orders"`)
	require.Empty(t, w.logs.Lines("re-queued dead rows", "type=invoices"), "the first POST changes nothing")
	resp, _ = admin.post("/requeue", url.Values{"s": {"0"}, "type": {"invoices"}, "token": {token}, "confirm": {"1"}}, "same-origin")
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	require.Len(t, w.logs.Lines("re-queued dead rows", "requeued=2", "type=invoices"), 1)
	// Re-queue all asks first, with how many of which types, and acts on
	// the second POST.
	w.rows(t, "refunds", 1, "ERROR", ceiling, time.Hour)
	resp, body = admin.post("/requeue", url.Values{"s": {"0"}, "all": {"1"}, "token": {token}}, "same-origin")
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	require.Contains(t, body, "Re-queue 3 dead row(s) of "+w.table)
	require.Contains(t, body, `<tr data-type="orders"><td class="mono">orders</td><td class="n">2</td></tr>`)
	require.Contains(t, body, `<tr data-type="refunds"><td class="mono">refunds</td><td class="n">1</td></tr>`)
	require.Contains(t, body, `<input type="hidden" name="all" value="1"><input type="hidden" name="confirm" value="1">`)
	require.Equal(t, 3, w.countDead(t), "the first POST changes nothing")
	require.Empty(t, w.logs.Lines("re-queued dead rows", "all=true"))
	resp, _ = admin.post("/requeue", url.Values{"s": {"0"}, "all": {"1"}, "confirm": {"1"}, "token": {token}}, "same-origin")
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	require.Len(t, w.logs.Lines("re-queued dead rows", "requeued=3", "all=true"), 1)
	require.Zero(t, w.countDead(t))
	resp, _ = admin.post("/requeue", url.Values{"s": {"0"}, "all": {"1"}, "type": {"x"}, "token": {token}}, "same-origin")
	require.Equal(t, http.StatusBadRequest, resp.StatusCode)

	w.rows(t, "orders", 5, "SENT", 0, 10*24*time.Hour)
	w.rows(t, "orders", 2, "SENT", 0, time.Hour)
	w.rows(t, "invoices", 4, "SENT", 0, 10*24*time.Hour)
	resp, body = admin.post("/purge", url.Values{"s": {"0"}, "age": {"2"}, "unit": {"days"}, "token": {token}}, "same-origin")
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	require.Contains(t, body, "Delete 9 SENT row(s) of "+w.table+", of every type")
	require.Contains(t, body, "(more than 2 days ago)")
	require.Contains(t, body, `<tr data-type="invoices"><td class="mono">invoices</td><td class="n">4</td></tr>`)
	require.Contains(t, body, `<tr data-type="orders"><td class="mono">orders</td><td class="n">5</td></tr>`)
	require.Contains(t, body, "Counted now.")
	require.Empty(t, w.logs.Lines("purged SENT rows"), "the first POST deletes nothing")
	resp, body = admin.post("/purge", url.Values{"s": {"0"}, "age": {"2"}, "unit": {"days"}, "confirm": {"1"}, "token": {token}}, "same-origin")
	require.Equal(t, http.StatusSeeOther, resp.StatusCode, body)
	require.Equal(t, "./app?done=purged&n=9&s=0", resp.Header.Get("Location"))
	require.Len(t, w.logs.Lines("purged SENT rows", "who=admin", "purged=9", "older_than=48h0m0s"), 1)
	resp, _ = admin.post("/purge", url.Values{"s": {"0"}, "age": {"-1"}, "unit": {"days"}, "token": {token}}, "same-origin")
	require.Equal(t, http.StatusBadRequest, resp.StatusCode)
	resp, _ = admin.post("/purge", url.Values{"s": {"0"}, "age": {"1"}, "unit": {"weeks"}, "token": {token}}, "same-origin")
	require.Equal(t, http.StatusBadRequest, resp.StatusCode)

	// GET never acts.
	code, _ = admin.get("/requeue?s=0&all=1")
	require.Equal(t, http.StatusMethodNotAllowed, code)
}

func TestPrefix(t *testing.T) {
	t.Parallel()
	w := setup(t)
	w.rows(t, "orders", 1, "ERROR", ceiling, time.Hour)
	c, err := console.New(console.Options{Sources: []console.Source{{Admin: w.admin}}, Prefix: "/ops/relay",
		Actions: true, Authorize: users, Logger: w.logs.Logger()})
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle("/ops/relay/", c)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	admin := newClient(t, srv, "admin")
	code, body := admin.get("/ops/relay/")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `href="./dead?s=0&amp;type=orders"`, "links are relative")
	code, _ = admin.get("/ops/relay/dead")
	require.Equal(t, http.StatusOK, code)
	token := admin.token("/ops/relay/")
	resp, _ := admin.post("/ops/relay/requeue", url.Values{"s": {"0"}, "all": {"1"}, "confirm": {"1"}, "token": {token}}, "same-origin")
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	loc, err := url.Parse(srv.URL + "/ops/relay/requeue")
	require.NoError(t, err)
	next, err := loc.Parse(resp.Header.Get("Location"))
	require.NoError(t, err)
	require.Equal(t, "/ops/relay/app", next.Path, "the redirect stays under the prefix")

	// Mounted with http.StripPrefix instead.
	c2, err := console.New(console.Options{Sources: []console.Source{{Admin: w.admin}}})
	require.NoError(t, err)
	mux2 := http.NewServeMux()
	mux2.Handle("/relay/", http.StripPrefix("/relay", c2))
	srv2 := httptest.NewServer(mux2)
	t.Cleanup(srv2.Close)
	code, body = newClient(t, srv2, "").get("/relay/")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "Rows by type")
}

func TestSeveralSources(t *testing.T) {
	t.Parallel()
	a, b := setup(t), setup(t)
	a.rows(t, "orders", 2, "PENDING", 0, 10*time.Minute)
	b.rows(t, "invoices", 1, "ERROR", ceiling, time.Hour)
	rl, err := relay.New(b.pool, b.cfg, &recorder{typ: "invoices"})
	require.NoError(t, err)
	_, err = rl.Run(context.Background())
	require.NoError(t, err)
	srv := a.serve(t, console.Options{Sources: []console.Source{{Admin: a.admin}, {Admin: b.admin, Relay: rl}}})
	c := newClient(t, srv, "")
	code, body := c.get("/")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, a.app+" · "+a.table+"</a>: STALLED")
	require.Contains(t, body, b.app+" · "+b.table+"</a>: DEAD")
	code, body = c.get("/app?s=1")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "This process's relay")
	require.Regexp(t, `<td class="n">1</td><td class="n">0</td><td class="n">0</td>`, body, "one pass elected, none coalesced or failed")
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// TestInputValidation: every value of every form and query that makes no
// sense is a 400 that names it, never a 500, an ERROR log or a change; the
// confirmation step changes nothing either.
func TestInputValidation(t *testing.T) {
	t.Parallel()
	w := setup(t)
	dead := w.rows(t, "invoices", 2, "ERROR", ceiling, time.Hour)
	w.rows(t, "orders", 3, "SENT", 0, 10*24*time.Hour)
	srv := w.serve(t, console.Options{Actions: true, Authorize: users})
	admin := newClient(t, srv, "admin")
	token := admin.token("/")
	purge := func(age, unit string) url.Values {
		return url.Values{"s": {"0"}, "age": {age}, "unit": {unit}, "confirm": {"1"}, "token": {token}}
	}
	requeue := func(kv ...string) url.Values {
		v := url.Values{"s": {"0"}, "token": {token}, "confirm": {"1"}}
		for i := 0; i < len(kv); i += 2 {
			v.Add(kv[i], kv[i+1])
		}
		return v
	}
	for _, tc := range []struct {
		name string
		path string
		form url.Values // nil: a GET
		want string
	}{
		{"AgeNaN", "/purge", purge("NaN", "days"), `age=&#34;NaN&#34; is not a number`},
		{"AgeInf", "/purge", purge("Inf", "days"), `age=&#34;Inf&#34; days is too long: at most 106751 days`},
		{"AgeMinusInf", "/purge", purge("-Inf", "hours"), "is negative"},
		{"Age1e308", "/purge", purge("1e308", "minutes"), "is too long: at most 153722867 minutes"},
		{"Age1e400", "/purge", purge("1e400", "days"), "is too long"},
		{"AgeNegative", "/purge", purge("-1", "days"), `age=&#34;-1&#34; is negative`},
		{"AgeNegativeZero", "/purge", purge("-0.5", "minutes"), "is negative"},
		{"AgeHuge", "/purge", purge("200000", "days"), "is too long"},
		{"AgeText", "/purge", purge("soon", "days"), "is not a number"},
		{"AgeEmpty", "/purge", purge("", "days"), "is not a number"},
		{"AgeHex", "/purge", purge("0x1p-2", "days"), ""}, // Go reads it (0.25): not an error
		{"UnitUnknown", "/purge", purge("1", "weeks"), `unit=&#34;weeks&#34;: the unit is days, hours or minutes`},
		{"UnitMissing", "/purge", url.Values{"s": {"0"}, "age": {"1"}, "token": {token}}, "the unit is days, hours or minutes"},
		{"TypeBlank", "/requeue", requeue("type", "  "), `type=&#34;  &#34; is blank`},
		{"TypeEmpty", "/requeue", requeue("type", ""), "is blank"},
		{"TypeNUL", "/requeue", requeue("type", "inv\x00oices"), "contains a NUL byte"},
		{"TypeUTF8", "/requeue", requeue("type", "inv\xffoices"), "is not valid UTF-8"},
		{"IDText", "/requeue", requeue("id", "abc"), `id=&#34;abc&#34; is not a row id`},
		{"IDZero", "/requeue", requeue("id", "0"), "is not a row id"},
		{"IDNegative", "/requeue", requeue("id", "-3"), "is not a row id"},
		{"IDHuge", "/requeue", requeue("id", "99999999999999999999"), "is not a row id"},
		{"IDFloat", "/requeue", requeue("id", "1.5"), "is not a row id"},
		{"AllNotOne", "/requeue", requeue("all", "yes"), `all=&#34;yes&#34;: re-queue all takes all=1`},
		{"TwoScopes", "/requeue", requeue("id", itoa(dead), "type", "invoices"), "Re-queue takes one of id, type or all"},
		{"NoScope", "/requeue", requeue(), "Re-queue takes one of id, type or all"},
		{"SourceText", "/requeue", url.Values{"s": {"x"}, "all": {"1"}, "token": {token}}, `s=&#34;x&#34; is not an app number`},
		{"DeadAfterText", "/dead?after=x", nil, `after=&#34;x&#34; is not a row id`},
		{"DeadAfterNegative", "/dead?after=-1", nil, "is not a row id"},
		{"DeadAfterHuge", "/dead?after=99999999999999999999", nil, "is not a row id"},
		{"DeadLimitText", "/dead?limit=ten", nil, `limit=&#34;ten&#34; is not a page size: from 1 to 10000 rows`},
		{"DeadLimitZero", "/dead?limit=0", nil, "is not a page size"},
		{"DeadLimitHuge", "/dead?limit=10001", nil, "is not a page size"},
		{"DeadTypeNUL", "/dead?type=a%00b", nil, "contains a NUL byte"},
		{"DeadTypeUTF8", "/dead?type=%ff", nil, "is not valid UTF-8"},
		{"DeadTypeBlank", "/dead?type=%20", nil, "is blank"},
		{"SourceTextGet", "/app?s=one", nil, `s=&#34;one&#34; is not an app number`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var code int
			var body string
			if tc.form == nil {
				code, body = admin.get(tc.path)
			} else {
				var resp *http.Response
				resp, body = admin.post(tc.path, tc.form, "same-origin")
				code = resp.StatusCode
			}
			if tc.want == "" {
				require.Less(t, code, 400, body)
				return
			}
			require.Equal(t, http.StatusBadRequest, code, body)
			require.Contains(t, body, tc.want)
		})
	}
	require.Empty(t, w.logs.Lines("level=ERROR"), "a bad input is not an error of ours")
	require.Equal(t, 2, w.countDead(t), "nothing was re-queued")

	// Good values around the edges pass.
	code, _ := admin.get("/dead?limit=10000&after=0&type=invoices")
	require.Equal(t, http.StatusOK, code)
	resp, body := admin.post("/purge", url.Values{"s": {"0"}, "age": {"106751"}, "unit": {"days"}, "token": {token}}, "same-origin")
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	require.Contains(t, body, "No row matches now")
}

// TestCharts: the charts page draws, per type and for all, the deliveries per
// minute and the lag as inline SVG, with nothing to fetch and no script; and
// this process's relay's deliveries from its Stats.
func TestCharts(t *testing.T) {
	t.Parallel()
	w := setup(t)
	// orders: 30 written 12m30s ago and delivered a minute later; 1 waits
	// since 20m ago. refunds: 5 delivered 2m ago, written 3m ago.
	w.exec(t, `INSERT INTO %s (type, natural_key, payload, status, created_at, updated_at, sent_at)
		SELECT 'orders', 'k' || g, '{}', 'SENT', now() - interval '12 minutes 30 seconds', now(), now() - interval '11 minutes 30 seconds'
		FROM generate_series(1, 30) g`)
	w.rows(t, "orders", 1, "PENDING", 0, 20*time.Minute)
	w.exec(t, `INSERT INTO %s (type, natural_key, payload, status, created_at, updated_at, sent_at)
		SELECT 'refunds', 'k' || g, '{}', 'SENT', now() - interval '3 minutes', now(), now() - interval '2 minutes 10 seconds'
		FROM generate_series(1, 5) g`)
	w.rows(t, "shipments", 4, "PENDING", 0, 10*time.Second)
	rl, err := relay.New(w.pool, w.cfg, &recorder{typ: "shipments"})
	require.NoError(t, err)
	_, err = rl.Run(context.Background())
	require.NoError(t, err)
	srv := w.serve(t, console.Options{Sources: []console.Source{{Admin: w.admin, Relay: rl}}})
	c := newClient(t, srv, "")

	code, body := c.get("/")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `href="./charts?s=0"`)

	resp, err := c.hc.Get(c.base + "/charts?s=0")
	require.NoError(t, err)
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	body = string(b)
	require.Equal(t, http.StatusOK, resp.StatusCode, body)
	require.Contains(t, resp.Header.Get("Content-Security-Policy"), "default-src 'none'", "no script, nothing fetched")
	require.NotContains(t, body, "<script")
	require.NotContains(t, body, "http://www.w3.org/2000/svg\" href", "nothing linked")
	for _, id := range []string{"delivered-all", "lag-all", "delivered-type-orders", "lag-type-orders", "delivered-type-refunds", "lag-type-refunds", "delivered-type-shipments"} {
		require.Contains(t, body, `<svg xmlns="http://www.w3.org/2000/svg" class="chart" id="`+id+`"`)
	}
	// One bar per minute with deliveries: orders' minute, refunds', shipments' (now).
	bars := regexp.MustCompile(`<rect x="[0-9.]+" y="[0-9.]+" width="[0-9.]+" height="[0-9.]+" fill="#2f6fd0"><title>([^<]*)</title>`)
	svgOf := func(id string) string {
		i := strings.Index(body, `id="`+id+`"`)
		require.Positive(t, i, id)
		j := strings.Index(body[i:], "</svg>")
		return body[i : i+j]
	}
	orders := bars.FindAllStringSubmatch(svgOf("delivered-type-orders"), -1)
	require.Len(t, orders, 1)
	require.Equal(t, "−12m to −11m: 30", orders[0][1])
	refunds := bars.FindAllStringSubmatch(svgOf("delivered-type-refunds"), -1)
	require.Len(t, refunds, 1)
	require.Equal(t, "−3m to −2m: 5", refunds[0][1])
	require.Contains(t, body, "39 delivered in the hour, at most 30 in a minute", "orders', refunds' and shipments' (just now)")
	require.Contains(t, svgOf("lag-type-orders"), "<polyline", "orders waited all hour")
	require.Contains(t, body, "Lag now 20m", "the pending row's age")
	require.Contains(t, body, "<h2>This process's relay</h2>")
	require.Contains(t, body, "4 delivered since it started")

	code, _ = c.get("/charts?s=x")
	require.Equal(t, http.StatusBadRequest, code)
	code, _ = c.get("/charts?s=3")
	require.Equal(t, http.StatusNotFound, code)
	require.Empty(t, w.logs.Lines("level=ERROR"))
}
