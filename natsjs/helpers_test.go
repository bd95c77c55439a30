package natsjs_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/xadm/relay/internal/testkit/testlog"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/xadm/relay"
	"github.com/xadm/relay/internal/testkit/pgserver"
)

// TestMain gets a real PostgreSQL and, after the tests, checks that no
// goroutine was left behind: the embedded NATS servers' included.
func TestMain(m *testing.M) { os.Exit(pgserver.Run(m, "RELAY_TEST_DATABASE_URL")) }

// natsServer is an embedded nats-server with JetStream, in this process, on a
// port of 127.0.0.1 and a store directory of its own. It can be stopped and
// started again on the same port and store, as a server that went down and
// came back.
type natsServer struct {
	t    testing.TB
	opts server.Options
	mu   sync.Mutex
	srv  *server.Server
}

// startNATS starts an embedded server; configure changes its options first.
// It is shut down, and waited for, when t ends.
func startNATS(t testing.TB, configure ...func(*server.Options)) *natsServer {
	t.Helper()
	n := &natsServer{t: t, opts: server.Options{
		Host:      "127.0.0.1",
		Port:      server.RANDOM_PORT,
		JetStream: true,
		StoreDir:  t.TempDir(),
		NoLog:     true,
		NoSigs:    true,
	}}
	for _, c := range configure {
		c(&n.opts)
	}
	n.start()
	n.opts.Port = n.srv.Addr().(*net.TCPAddr).Port
	t.Cleanup(n.stop)
	return n
}

// start starts the server on its options, the same port and store once it ran.
func (n *natsServer) start() {
	n.t.Helper()
	n.mu.Lock()
	defer n.mu.Unlock()
	opts := n.opts
	srv, err := server.NewServer(&opts)
	require.NoError(n.t, err)
	go srv.Start()
	if !srv.ReadyForConnections(30 * time.Second) {
		srv.Shutdown()
		srv.WaitForShutdown()
		n.t.Fatal("the embedded NATS server did not accept connections within 30s")
	}
	n.srv = srv
}

// stop shuts the server down and waits until it has.
func (n *natsServer) stop() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.srv == nil {
		return
	}
	n.srv.Shutdown()
	n.srv.WaitForShutdown()
	n.srv = nil
}

// URL is the server's client URL.
func (n *natsServer) URL() string { return fmt.Sprintf("nats://127.0.0.1:%d", n.opts.Port) }

// jetStream connects to n and returns a JetStream context, closed when t ends.
func (n *natsServer) jetStream(t testing.TB, opts ...nats.Option) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(n.URL(), opts...)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(time.Minute))
	require.NoError(t, err)
	return js
}

// createStream creates a file-backed stream with a two-minute duplicate window.
func createStream(t testing.TB, js jetstream.JetStream, cfg jetstream.StreamConfig) jetstream.Stream {
	t.Helper()
	cfg.Storage = jetstream.FileStorage
	if cfg.Duplicates == 0 {
		cfg.Duplicates = 2 * time.Minute
	}
	s, err := js.CreateStream(context.Background(), cfg)
	require.NoError(t, err)
	return s
}

// received is one message a consumer read from a stream.
type received struct {
	Subject string
	Header  nats.Header
	Data    []byte
}

func (r received) id(t testing.TB) int64 {
	t.Helper()
	id, err := strconv.ParseInt(r.Header.Get("Relay-Message-Id"), 10, 64)
	require.NoError(t, err, "Relay-Message-Id of %s", r.Subject)
	return id
}

// consume reads every message the stream holds, in stream order, through an
// ordered consumer, as a service reading the stream would.
func consume(t testing.TB, js jetstream.JetStream, stream string) []received {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, stream)
	require.NoError(t, err)
	info, err := s.Info(ctx)
	require.NoError(t, err)
	want := int(info.State.Msgs)
	c, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	require.NoError(t, err)
	var got []received
	for len(got) < want {
		require.NoError(t, ctx.Err(), "read %d of the stream's %d messages", len(got), want)
		batch, err := c.Fetch(want-len(got), jetstream.FetchMaxWait(2*time.Second))
		require.NoError(t, err)
		for m := range batch.Messages() {
			got = append(got, received{Subject: m.Subject(), Header: m.Headers(), Data: m.Data()})
		}
		require.NoError(t, batch.Error())
	}
	return got
}

// bundle is one test's outbox: its own table, app name and pool.
type bundle struct {
	pool  *pgxpool.Pool
	admin *pgxpool.Pool // another application_name: for the test's own queries
	table string
	app   string
	cfg   relay.Config
	logs  *testlog.Buffer
}

func setup(t *testing.T, configure ...func(*pgxpool.Config)) *bundle {
	t.Helper()
	name := pgserver.Name(t)
	b := &bundle{
		pool:  pgserver.Pool(t, pgserver.Shared().URL, name, 6, configure...),
		admin: pgserver.Pool(t, pgserver.Shared().URL, "", 4),
		table: name,
		app:   name,
		logs:  &testlog.Buffer{},
	}
	ctx := context.Background()
	require.NoError(t, relay.CreateTable(ctx, b.admin, b.table))
	t.Cleanup(func() {
		_, _ = b.admin.Exec(context.Background(), "DROP TABLE IF EXISTS "+pgx.Identifier{b.table}.Sanitize())
	})
	b.cfg = relay.DefaultConfig()
	b.cfg.AppName = name
	b.cfg.Table = name
	b.cfg.Interval = 20 * time.Millisecond
	b.cfg.RetryBackoff = 10 * time.Millisecond
	b.cfg.SendTimeout = 10 * time.Second
	b.cfg.Logger = testLogger(b.logs)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("logs:\n%s", b.logs.String())
		}
	})
	return b
}

// enqueue writes one PENDING row per key, in order, through relay.Enqueue.
func (b *bundle) enqueue(t testing.TB, typ string, keys ...string) []int64 {
	t.Helper()
	ids := make([]int64, 0, len(keys))
	for i, k := range keys {
		id, err := relay.Enqueue(context.Background(), b.admin, b.table, relay.Outgoing{
			Type: typ, Key: k, Payload: fmt.Appendf(nil, `{"key": %q, "n": %d}`, k, i),
		})
		require.NoError(t, err)
		ids = append(ids, id)
	}
	return ids
}

// insert writes one PENDING row with plain SQL, as a JVM service or a script
// would: it takes keys Enqueue refuses (empty, blank).
func (b *bundle) insert(t testing.TB, typ, key, payload string) int64 {
	t.Helper()
	var id int64
	require.NoError(t, b.admin.QueryRow(context.Background(),
		"INSERT INTO "+pgx.Identifier{b.table}.Sanitize()+" (type, natural_key, payload) VALUES ($1, $2, $3) RETURNING id",
		typ, key, payload).Scan(&id))
	return id
}

// row is a row's delivery state.
type row struct {
	ID        int64
	Key       string
	Payload   string
	Status    string
	Attempts  int
	LastError string
}

func (b *bundle) rows(t testing.TB) map[int64]row {
	t.Helper()
	rs, err := b.admin.Query(context.Background(),
		"SELECT id, natural_key, payload::text, status, attempts, coalesce(last_error, '') FROM "+
			pgx.Identifier{b.table}.Sanitize()+" ORDER BY id")
	require.NoError(t, err)
	out := make(map[int64]row)
	for rs.Next() {
		var r row
		require.NoError(t, rs.Scan(&r.ID, &r.Key, &r.Payload, &r.Status, &r.Attempts, &r.LastError))
		out[r.ID] = r
	}
	require.NoError(t, rs.Err())
	return out
}

// count is how many rows have status.
func (b *bundle) count(t testing.TB, status string) int {
	t.Helper()
	var n int
	require.NoError(t, b.admin.QueryRow(context.Background(),
		"SELECT count(*) FROM "+pgx.Identifier{b.table}.Sanitize()+" WHERE status = $1", status).Scan(&n))
	return n
}

// drain runs direct passes until one processes nothing.
func drain(t testing.TB, r *relay.Relay) {
	t.Helper()
	for range 100 {
		n, err := r.Run(context.Background())
		require.NoError(t, err)
		if n == 0 {
			return
		}
	}
	t.Fatal("the relay still had rows after 100 passes")
}

// eventually polls cond until it holds or 60 seconds pass: long enough for a
// busy machine, and a condition that never holds still fails.
func eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// testLogger logs at Info and above to w.
func testLogger(w io.Writer) *slog.Logger {
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelInfo}))
}
