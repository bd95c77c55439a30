package relay_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/xadm/relay"
)

// TestHeadersReachTheReceiver writes a message with headers through Enqueue
// and finds them at an HTTP receiver, beside the relay's own, and in the
// Message a Sender gets.
func TestHeadersReachTheReceiver(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()

	var mu sync.Mutex
	var got http.Header
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = r.Header.Clone()
		mu.Unlock()
	}))
	t.Cleanup(srv.Close)
	httpSender, err := relay.NewHTTPSender(relay.HTTPSenderConfig{
		Type: "order", URL: relay.URLWithKey(srv.URL),
		Header: http.Header{"Authorization": {"Bearer configured"}},
	})
	require.NoError(t, err)
	rec := newRecorder("invoice", nil)

	headers := map[string]string{
		"traceparent":   "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"tracestate":    "vendor=x",
		"Authorization": "Bearer from-the-producer", // the sender's configured one wins
	}
	_, err = relay.Enqueue(ctx, b.pool, b.table, relay.Outgoing{Type: "order", Key: "o1", Payload: []byte(`{}`), Headers: headers})
	require.NoError(t, err)
	_, err = relay.Enqueue(ctx, b.pool, b.table, relay.Outgoing{Type: "invoice", Key: "i1", Payload: []byte(`{}`),
		Headers: map[string]string{"X-Tenant": "acme"}})
	require.NoError(t, err)
	_, err = relay.Enqueue(ctx, b.pool, b.table, relay.Outgoing{Type: "invoice", Key: "i2", Payload: []byte(`{}`)})
	require.NoError(t, err)

	r := b.newRelay(t, b.cfg, httpSender, rec)
	n, err := r.Run(ctx)
	require.NoError(t, err)
	require.Equal(t, 3, n)

	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, headers["traceparent"], got.Get("Traceparent"))
	require.Equal(t, "vendor=x", got.Get("Tracestate"))
	require.Equal(t, []string{"Bearer configured"}, got.Values("Authorization"))
	require.NotEmpty(t, got.Get("Idempotency-Key"))
	require.Equal(t, "application/json", got.Get("Content-Type"))

	require.Len(t, rec.Sent, 2)
	require.Equal(t, map[string]string{"X-Tenant": "acme"}, rec.Sent[0].Headers)
	require.Nil(t, rec.Sent[1].Headers)
	require.Zero(t, b.countStatus(t, "PENDING"))
}

// TestEnqueueRefusesHeaders: headers that would override a sender's own, or
// that no destination can carry, are refused with an error naming them, and
// nothing is written.
func TestEnqueueRefusesHeaders(t *testing.T) {
	t.Parallel()
	b := setup(t)
	many := map[string]string{}
	for i := range relay.HeadersMax + 1 {
		many[fmt.Sprintf("X-H%d", i)] = "v"
	}
	for _, c := range []struct {
		name    string
		headers map[string]string
		want    string
	}{
		{"IdempotencyKey", map[string]string{"idempotency-key": "x"}, "Idempotency-Key"},
		{"RelayPrefix", map[string]string{"Relay-Attempt": "9"}, "Relay-Attempt"},
		{"NatsPrefix", map[string]string{"Nats-Msg-Id": "x"}, "Nats-Msg-Id"},
		{"ContentType", map[string]string{"Content-Type": "text/plain"}, "Content-Type"},
		{"Host", map[string]string{"host": "evil"}, "Host"},
		{"ContentLength", map[string]string{"Content-Length": "1"}, "Content-Length"},
		{"TransferEncoding", map[string]string{"Transfer-Encoding": "chunked"}, "Transfer-Encoding"},
		{"Trailer", map[string]string{"Trailer": "x"}, "Trailer"},
		{"NotAToken", map[string]string{"bad name": "x"}, `"bad name" is not an HTTP token`},
		{"EmptyName", map[string]string{"": "x"}, "is not an HTTP token"},
		{"ControlCharacter", map[string]string{"X-A": "a\r\nInjected: yes"}, "X-A has a value with control characters"},
		{"CaseTwins", map[string]string{"X-A": "1", "x-a": "2"}, `"X-A" and "x-a"`},
		{"TooMany", many, "more than HeadersMax"},
		{"TooLarge", map[string]string{"X-Big": strings.Repeat("a", relay.HeadersBytesMax)}, "more than HeadersBytesMax"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := relay.Enqueue(context.Background(), b.pool, b.table,
				relay.Outgoing{Type: "t", Key: "k", Payload: []byte(`{}`), Headers: c.headers})
			require.ErrorContains(t, err, "Outgoing.Headers")
			require.ErrorContains(t, err, c.want)
		})
	}
	var n int
	require.NoError(t, b.pool.QueryRow(context.Background(), "SELECT count(*) FROM "+pgx.Identifier{b.table}.Sanitize()).Scan(&n))
	require.Zero(t, n)
}

// TestBadHeadersOfAnotherProducer: a row whose headers another producer wrote
// against the rules is marked dead with the reason, never sent with some of
// them dropped; the rows beside it are delivered.
func TestBadHeadersOfAnotherProducer(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ids := b.insert(t, "t", "reserved", "not-strings", "control", "good")
	b.exec(t, `UPDATE %s SET headers = '{"Idempotency-Key": "forged"}' WHERE id = $1`, ids[0])
	b.exec(t, `UPDATE %s SET headers = '{"X-N": 1}' WHERE id = $1`, ids[1])
	b.exec(t, `UPDATE %s SET headers = jsonb_build_object('X-C', E'a\nb') WHERE id = $1`, ids[2])
	b.exec(t, `UPDATE %s SET headers = '{"X-Ok": "yes"}' WHERE id = $1`, ids[3])
	rec := newRecorder("t", nil)
	r := b.newRelay(t, b.cfg, rec)
	_, err := r.Run(context.Background())
	require.NoError(t, err)

	require.Len(t, rec.Sent, 1)
	require.Equal(t, "good", rec.Sent[0].Key)
	require.Equal(t, map[string]string{"X-Ok": "yes"}, rec.Sent[0].Headers)
	for id, want := range map[int64]string{ids[0]: "Idempotency-Key", ids[1]: "not a JSON object of strings", ids[2]: "control characters"} {
		s := b.state(t, id)
		require.Equal(t, "ERROR", s.Status)
		require.Equal(t, b.cfg.MaxAttempts, s.Attempts, "row %d is dead", id)
		require.NotNil(t, s.LastError)
		require.Contains(t, *s.LastError, want)
	}
}

// TestTableWithoutHeadersColumn: a JVM-made table, which has no headers
// column, delivers exactly as before; Enqueue with headers into it fails
// naming the column and the statement that adds it; once it is added (while
// the relay runs), the relay reads the headers without a restart. CreateTable
// adds the column to an existing table, and when the column exists it takes
// no lock that would wait for the table's readers.
func TestTableWithoutHeadersColumn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newPool(t, 6)
	table := jvmTableOf(t, pool)

	_, err := relay.Enqueue(ctx, pool, table, relay.Outgoing{Type: "t", Key: "with", Payload: []byte(`{}`),
		Headers: map[string]string{"X-A": "1"}})
	require.ErrorContains(t, err, "no headers column")
	require.ErrorContains(t, err, `ALTER TABLE "`+table+`" ADD COLUMN IF NOT EXISTS headers jsonb`)
	_, err = relay.Enqueue(ctx, pool, table, relay.Outgoing{Type: "t", Key: "without", Payload: []byte(`{}`)})
	require.NoError(t, err)

	cfg := relay.DefaultConfig()
	cfg.AppName, cfg.Table, cfg.Logger = table, table, testLogger(t)
	rec := newRecorder("t", nil)
	r, err := relay.New(pool, cfg, rec)
	require.NoError(t, err)
	n, err := r.Run(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Nil(t, rec.Sent[0].Headers)

	// The migration, while the relay is up: CreateTable adds the column.
	require.NoError(t, relay.CreateTable(ctx, pool, table))
	_, err = relay.Enqueue(ctx, pool, table, relay.Outgoing{Type: "t", Key: "after", Payload: []byte(`{}`),
		Headers: map[string]string{"X-A": "1"}})
	require.NoError(t, err)
	n, err = r.Run(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Equal(t, map[string]string{"X-A": "1"}, rec.Sent[1].Headers)

	// With the column there, CreateTable again does not queue behind a reader:
	// an ALTER TABLE would wait for this transaction's ACCESS SHARE lock.
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, "SELECT count(*) FROM "+table)
	require.NoError(t, err)
	cctx, cancel := context.WithTimeout(ctx, time.Minute) // a bound on failure only
	defer cancel()
	require.NoError(t, relay.CreateTable(cctx, pool, table))
}
