package console_test

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/xadm/relay"
	"github.com/xadm/relay/console"
)

// TestConsoleReplicasAndScope: the page lists the live replicas with their
// types, names a type none of them serves as the diagnosis, and says which
// types the actions write; an Admin with no live relay to learn from writes
// nothing, says why, and offers no action: it does not widen to every type
// when the relays are down.
func TestConsoleReplicasAndScope(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := setup(t)
	dead := w.rows(t, "invoice", 1, "ERROR", ceiling, time.Hour)
	admin, err := relay.NewAdmin(w.pool, w.cfg) // the default scope: the live relays' types
	require.NoError(t, err)
	srv := w.serve(t, console.Options{Sources: []console.Source{{Admin: admin}}, Actions: true, Authorize: users})
	c := newClient(t, srv, "admin")

	code, body := c.get("/")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `id="no-replicas"`)
	require.Contains(t, body, "Re-queue and purge write nothing: relay: no live relay of the app to learn its types from")
	require.Contains(t, body, `id="requeue-all" disabled`)
	require.NotContains(t, body, "data-requeue-type")
	token := c.token("/")
	for _, form := range []url.Values{{"all": {"1"}}, {"type": {"invoice"}}, {"id": {itoa(dead)}}} {
		for _, confirm := range []string{"", "1"} {
			form.Set("s", "0")
			form.Set("token", token)
			form.Set("confirm", confirm)
			resp, body := c.post("/requeue", form, "same-origin")
			require.Equal(t, http.StatusConflict, resp.StatusCode, "%v: %s", form, body)
			require.Contains(t, body, "no live relay of the app to learn its types from")
		}
	}
	resp, _ := c.post("/purge", url.Values{"s": {"0"}, "age": {"0"}, "unit": {"days"}, "token": {token}, "confirm": {"1"}}, "same-origin")
	require.Equal(t, http.StatusConflict, resp.StatusCode)
	st, _ := w.status(t, dead)
	require.Equal(t, "ERROR", st)

	r, err := relay.New(w.pool, w.cfg, &recorder{typ: "order"})
	require.NoError(t, err)
	require.NoError(t, r.Start(ctx))
	t.Cleanup(func() { _ = r.Stop(context.Background()) })
	w.rows(t, "invoice", 1, "PENDING", 0, time.Second)
	require.Eventually(t, func() bool {
		_, body = c.get("/")
		return !strings.Contains(body, `id="no-replicas"`)
	}, 10*time.Second, 20*time.Millisecond)
	require.Contains(t, body, `id="replicas"`)
	require.Contains(t, body, `<td class="mono replica-types">order</td>`)
	require.Contains(t, body, `Rows of type &#34;invoice&#34; wait and no running relay`)
	require.Contains(t, body, `Re-queue and purge act on types &#34;order&#34; (live replicas)`)
	require.NotContains(t, body, `data-requeue-type="invoice"`, "no button for a type outside the scope")
	resp, body = c.post("/requeue", url.Values{"s": {"0"}, "id": {itoa(dead)}, "token": {token}}, "same-origin")
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Contains(t, body, "is not a dead row of types &#34;order&#34; (live replicas): confirming changes nothing")
	resp, _ = c.post("/requeue", url.Values{"s": {"0"}, "id": {itoa(dead)}, "token": {token}, "confirm": {"1"}}, "same-origin")
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	st, _ = w.status(t, dead)
	require.Equal(t, "ERROR", st, "another app's type is left alone")
}

// TestConsolePausedType: a type a relay paused is named in its row, with
// the probe's time and the reason, and in its replica's row; the verdict is
// not STALLED, its rows waiting for their destination, but LATE, as relayctl
// status says: they have waited five minutes, past the warning threshold.
func TestConsolePausedType(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := setup(t)
	cfg := w.cfg
	cfg.Interval, cfg.PauseAfter, cfg.RetryBackoff = 50*time.Millisecond, 2, time.Hour
	r, err := relay.New(w.pool, cfg, &recorder{typ: "invoice"},
		relay.SenderFunc("order", func(context.Context, relay.Message) error {
			return errors.New("PUT http://orders/1: 503 Service Unavailable")
		}))
	require.NoError(t, err)
	w.rows(t, "order", 4, "PENDING", 0, 5*time.Minute)
	require.NoError(t, r.Start(ctx))
	t.Cleanup(func() { _ = r.Stop(context.Background()) })
	admin, err := relay.NewAdmin(w.pool, w.cfg)
	require.NoError(t, err)
	srv := w.serve(t, console.Options{Sources: []console.Source{{Admin: admin}}, Authorize: users})
	c := newClient(t, srv, "admin")
	var body string
	require.Eventually(t, func() bool {
		_, body = c.get("/")
		return strings.Contains(body, `data-paused="order"`)
	}, 20*time.Second, 50*time.Millisecond, "the page says the pause")
	require.Contains(t, body, "paused by the relays")
	require.Contains(t, body, "503 Service Unavailable")
	require.Contains(t, body, `<td class="mono replica-paused">order (`)
	require.Contains(t, body, `<strong id="verdict">LATE</strong>`)
	require.Regexp(t, `<p class="mono" id="first-line">WARNING: order: oldest undelivered 5m0\ds \(destination failing since `, body)
}

// TestConsoleDeadShowsPermanent: the dead page says "permanent, 1 attempt"
// for a row refused with a 4xx.
func TestConsoleDeadShowsPermanent(t *testing.T) {
	t.Parallel()
	w := setup(t)
	w.rows(t, "order", 1, "ERROR", ceiling, time.Hour)
	w.exec(t, "UPDATE %s SET last_error = 'permanent after 1 attempt(s): PUT http://dest/order: 400 Bad Request'")
	srv := w.serve(t, console.Options{Authorize: users})
	code, body := newClient(t, srv, "viewer").get("/dead?s=0")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, `<td class="n attempts">permanent, 1 attempt</td>`)
}

// TestConsoleMissingIndexes: the page says which of the relay's indexes the
// table lacks, with the statement that adds it.
func TestConsoleMissingIndexes(t *testing.T) {
	t.Parallel()
	w := setup(t)
	_, err := w.pool.Exec(context.Background(), "DROP INDEX "+pgx.Identifier{w.table + "_outbox_error"}.Sanitize())
	require.NoError(t, err)
	srv := w.serve(t, console.Options{Authorize: users})
	code, body := newClient(t, srv, "viewer").get("/")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "The table lacks 1 of the relay&#39;s indexes ("+w.table+"_outbox_error)")
	require.Contains(t, body, "CREATE INDEX IF NOT EXISTS")
}
