package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/xadm/relay/internal/testkit/testlog"

	"github.com/stretchr/testify/require"

	"github.com/xadm/relay"
	"github.com/xadm/relay/internal/testkit/pgserver"
)

// TestMain gets a real PostgreSQL (RELAY_TEST_DATABASE_URL, a container, or
// the local binaries) and checks, after the tests, that none left a goroutine.
func TestMain(m *testing.M) { os.Exit(pgserver.Run(m, "RELAY_TEST_DATABASE_URL")) }

// TestReceiverAppliesOnce runs the receiver as the README does and sends it,
// through the relay's HTTPSender, the messages of one order with the
// re-deliveries faults make: a duplicate, and an older message after a newer
// one. The order ends on its newest state, each request is printed with its
// outcome, and a body that is not JSON is refused with 422. Cancelling the
// context stops it cleanly.
func TestReceiverAppliesOnce(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	base := "http://" + ln.Addr().String() + "/relay"
	out, logs := &testlog.Buffer{}, &testlog.Buffer{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, ln, pgserver.Shared().URL, time.Hour, out, logs) }()
	defer func() {
		cancel()
		require.NoError(t, <-done)
		require.Contains(t, logs.String(), "Listening on http://")
	}()

	sender, err := relay.NewHTTPSender(relay.HTTPSenderConfig{
		Type: "order",
		URL: func(m relay.Message) (string, error) {
			return base + "/" + url.PathEscape(m.Type) + "/" + url.PathEscape(m.Key), nil
		},
	})
	require.NoError(t, err)
	send := func(id int64, state string) {
		t.Helper()
		m := relay.Message{ID: id, Type: "order", Key: "order-1", Payload: fmt.Appendf(nil, `{"state": %q}`, state), Attempts: 0}
		deadline := time.Now().Add(time.Minute)
		for { // until it listens
			err := sender.Send(context.Background(), m)
			if err == nil {
				return
			}
			require.True(t, time.Now().Before(deadline), "message %d: %v", id, err)
			time.Sleep(20 * time.Millisecond)
		}
	}
	send(1, "created")
	send(3, "cancelled")
	send(2, "updated")   // late: stale
	send(3, "cancelled") // again: a duplicate

	pool := pgserver.Pool(t, pgserver.Shared().URL, "", 2)
	var state string
	var id int64
	require.NoError(t, pool.QueryRow(context.Background(),
		"SELECT state->>'state', message_id FROM relay_receiver_state WHERE type = 'order' AND key = 'order-1'").Scan(&state, &id))
	require.Equal(t, "cancelled", state)
	require.Equal(t, int64(3), id)
	require.Equal(t, "PUT /relay/order/order-1  1  attempt 1  -> 204 applied\n"+
		"PUT /relay/order/order-1  3  attempt 1  -> 204 applied\n"+
		"PUT /relay/order/order-1  2  attempt 1  -> 204 stale\n"+
		"PUT /relay/order/order-1  3  attempt 1  -> 204 duplicate\n", out.String())

	req, err := http.NewRequest(http.MethodPut, base+"/order/order-2", strings.NewReader("not json"))
	require.NoError(t, err)
	req.Header.Set("Idempotency-Key", "public.mensagem_m2m/9")
	req.Header.Set("Relay-Message-Id", "9")
	req.Header.Set("Relay-Message-Key", "order-2") // the path's key, or the inbox refuses it (400)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusUnprocessableEntity, resp.StatusCode)
	require.Contains(t, string(body), "the body is not a JSON document")
}
