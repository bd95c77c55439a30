package main

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/xadm/relay"
	"github.com/xadm/relay/internal/testkit/pgserver"
)

// TestMain gets a real PostgreSQL (RELAY_TEST_DATABASE_URL, a container, or
// the local binaries) and checks, after the tests, that none left a goroutine.
func TestMain(m *testing.M) { os.Exit(pgserver.Run(m, "RELAY_TEST_DATABASE_URL")) }

// request is what the endpoint received.
type request struct {
	method, path string
	header       http.Header
	body         string
}

// TestServiceDelivers runs the service as the README's "Run it against your
// endpoint" does, against an endpoint of its own, and writes two messages: one
// with relay.Enqueue and one with the README's plain SQL, taken from the README
// itself. Both must arrive as the README says.
func TestServiceDelivers(t *testing.T) {
	table := pgserver.Name(t)
	var (
		mu  sync.Mutex
		got = map[string]request{} // by Relay-Message-Key
	)
	endpoint := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		got[r.Header.Get("Relay-Message-Key")] = request{r.Method, r.URL.EscapedPath(), r.Header.Clone(), string(body)}
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(endpoint.Close)

	setEnv(t, map[string]string{
		"DATABASE_URL":    pgserver.Shared().URL,
		"DESTINATION_URL": endpoint.URL + "/relay",
		"RELAY_TYPES":     "order",
		"RELAY_APP_NAME":  table,
		"RELAY_TABLE":     table,
	})
	cfg, err := loadConfig()
	require.NoError(t, err)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- run(ctx, slog.New(slog.DiscardHandler), cfg) }()

	pool := pgserver.Pool(t, pgserver.Shared().URL, "", 2)
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+pgx.Identifier{table}.Sanitize())
	})
	// The service creates the table; wait for it.
	require.Eventually(t, func() bool {
		var exists bool
		err := pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", table).Scan(&exists)
		return err == nil && exists
	}, time.Minute, 10*time.Millisecond, "the service did not create %s", table)

	_, err = relay.Enqueue(ctx, pool, table, relay.Outgoing{Type: "order", Key: "order-1", Payload: []byte(`{"id": "order-1"}`)})
	require.NoError(t, err)
	_, err = pool.Exec(ctx, strings.ReplaceAll(readmeSQL(t), "mensagem_m2m", table))
	require.NoError(t, err)

	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(got) == 2
	}, time.Minute, 10*time.Millisecond, "the endpoint did not receive both messages")

	mu.Lock()
	defer mu.Unlock()
	for key, r := range got {
		require.Equal(t, http.MethodPut, r.method)
		require.Equal(t, "/relay/order/"+key, r.path, "DESTINATION_URL/<type>/<key>")
		require.Equal(t, "application/json", r.header.Get("Content-Type"))
		require.Equal(t, "order", r.header.Get("Relay-Message-Type"))
		require.Equal(t, "1", r.header.Get("Relay-Attempt"))
		require.Regexp(t, `^[0-9]+$`, r.header.Get("Relay-Message-Id"))
		require.Equal(t, "public."+table+"/"+r.header.Get("Relay-Message-Id"), r.header.Get("Idempotency-Key"))
		require.Contains(t, r.body, `"id": "`+key+`"`, "the payload, as the JSON body")
	}
	require.Contains(t, got, "order-2", "the README's plain-SQL message")

	cancel()
	select {
	case err := <-done:
		require.NoError(t, err, "the service stops cleanly on its signal")
	case <-time.After(time.Minute):
		t.Fatal("the service did not stop within a minute")
	}
}

// readmeSQL returns the plain-SQL example of the README: the ```sql block
// after the marker <!-- plain SQL producer -->.
func readmeSQL(t *testing.T) string {
	t.Helper()
	readme, err := os.ReadFile("../../README.md")
	require.NoError(t, err)
	m := regexp.MustCompile("(?s)<!-- plain SQL producer -->\\s*```sql\\n(.*?)```").FindSubmatch(readme)
	require.NotNil(t, m, "README.md has no ```sql block after <!-- plain SQL producer -->")
	return string(m[1])
}
