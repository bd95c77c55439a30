package e2e_test

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/xadm/relay"
	"github.com/xadm/relay/internal/testkit/pgserver"
	"github.com/xadm/relay/internal/testkit/testlog"
	"github.com/xadm/relay/kafka"
)

// TestMain gets a real PostgreSQL (RELAY_TEST_DATABASE_URL, a container, or the
// local binaries) and fails, never skips, when none can be had. After the tests
// it checks that no goroutine was left behind: no cluster, client or relay.
func TestMain(m *testing.M) { os.Exit(pgserver.Run(m, "RELAY_TEST_DATABASE_URL")) }

// waitLimit bounds every wait on a condition: generous, because the machine
// running the tests may be busy; a passing test never waits this long.
const waitLimit = 90 * time.Second

// newCluster starts an in-process Kafka for t, closed when t ends.
func newCluster(t *testing.T, opts ...kfake.Opt) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(opts...)
	require.NoError(t, err)
	t.Cleanup(c.Close)
	return c
}

// newSender builds a sender for t from cfg, closed when t ends.
func newSender(t *testing.T, cfg kafka.Config) *kafka.Sender {
	t.Helper()
	s, err := kafka.NewSender(cfg)
	require.NoError(t, err)
	t.Cleanup(s.Close)
	return s
}

// bundle is one test's outbox: its own pool, table and app name, so tests run
// in parallel without seeing each other's rows or elections.
type bundle struct {
	pool  *pgxpool.Pool
	table string
	cfg   relay.Config
	logs  *logBuffer
}

func setup(t *testing.T) *bundle {
	t.Helper()
	name := pgserver.Name(t)
	b := &bundle{pool: pgserver.Pool(t, pgserver.Shared().URL, name, 12), table: name, logs: &logBuffer{}}
	require.NoError(t, relay.CreateTable(context.Background(), b.pool, b.table))
	t.Cleanup(func() {
		_, _ = b.pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+pgx.Identifier{b.table}.Sanitize())
	})
	b.cfg = relay.DefaultConfig()
	b.cfg.AppName = name
	b.cfg.Table = name
	b.cfg.Interval = 20 * time.Millisecond
	b.cfg.RetryBackoff = 20 * time.Millisecond
	b.cfg.Logger = b.logs.Logger()
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("relay logs:\n%s", b.logs)
		}
	})
	return b
}

// relay returns a relay on b's table through senders.
func (b *bundle) relay(t *testing.T, senders ...relay.Sender) *relay.Relay {
	t.Helper()
	r, err := relay.New(b.pool, b.cfg, senders...)
	require.NoError(t, err)
	return r
}

// start starts r's periodic pass, stopped when t ends.
func start(t *testing.T, r *relay.Relay) {
	t.Helper()
	require.NoError(t, r.Start(context.Background()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
		defer cancel()
		require.NoError(t, r.Stop(ctx))
	})
}

// drain runs direct passes until one finds nothing to do.
func drain(t *testing.T, r *relay.Relay) {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for time.Now().Before(deadline) {
		n, err := r.Run(context.Background())
		require.NoError(t, err)
		if n == 0 {
			return
		}
	}
	t.Fatal("the relay still had rows to process after", waitLimit)
}

// enqueue writes one message through relay.Enqueue and returns its id.
func (b *bundle) enqueue(t *testing.T, typ, key string, payload any) int64 {
	t.Helper()
	p, err := json.Marshal(payload)
	require.NoError(t, err)
	id, err := relay.Enqueue(context.Background(), b.pool, b.table, relay.Outgoing{Type: typ, Key: key, Payload: p})
	require.NoError(t, err)
	return id
}

// row is one outbox row as the tests read it back.
type row struct {
	ID        int64
	Type      string
	Key       string
	Payload   string
	Status    string
	Attempts  int
	LastError string
}

// rows reads b's table, in id order.
func (b *bundle) rows(t *testing.T) []row {
	t.Helper()
	rs, err := b.pool.Query(context.Background(),
		"SELECT id, type, natural_key, payload::text, status, attempts, coalesce(last_error, '') FROM "+
			pgx.Identifier{b.table}.Sanitize()+" ORDER BY id")
	require.NoError(t, err)
	out, err := pgx.CollectRows(rs, func(r pgx.CollectableRow) (row, error) {
		var x row
		err := r.Scan(&x.ID, &x.Type, &x.Key, &x.Payload, &x.Status, &x.Attempts, &x.LastError)
		return x, err
	})
	require.NoError(t, err)
	return out
}

// waitRows polls b's rows until ok accepts them, failing t after waitLimit.
func (b *bundle) waitRows(t *testing.T, what string, ok func([]row) bool) []row {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for {
		rs := b.rows(t)
		if ok(rs) {
			return rs
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s, still waiting for %s; rows: %+v", waitLimit, what, rs)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func allSent(rs []row) bool {
	for _, r := range rs {
		if r.Status != "SENT" {
			return false
		}
	}
	return true
}

// consume reads every record of topic up to its high watermarks, which it
// reads from the cluster first, so that it returns all that was produced.
func consume(t *testing.T, c *kfake.Cluster, topic string) []*kgo.Record {
	t.Helper()
	var want int64
	for _, p := range c.PartitionInfos(topic) {
		want += p.HighWatermark - p.LogStartOffset
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	require.NoError(t, err)
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	var recs []*kgo.Record
	for int64(len(recs)) < want {
		fs := cl.PollFetches(ctx)
		require.NoError(t, ctx.Err(), "consumed %d of %d records of %s", len(recs), want, topic)
		fs.EachError(func(topic string, p int32, err error) {
			t.Fatalf("consume %s/%d: %v", topic, p, err)
		})
		recs = append(recs, fs.Records()...)
	}
	return recs
}

// header returns r's header name, failing t unless it appears exactly once.
func header(t *testing.T, r *kgo.Record, name string) string {
	t.Helper()
	var vs []string
	for _, h := range r.Headers {
		if h.Key == name {
			vs = append(vs, string(h.Value))
		}
	}
	require.Len(t, vs, 1, "header %s of record %s/%d@%d", name, r.Topic, r.Partition, r.Offset)
	return vs[0]
}

// recordID is r's Relay-Message-Id.
func recordID(t *testing.T, r *kgo.Record) int64 {
	t.Helper()
	id, err := strconv.ParseInt(header(t, r, kafka.HeaderMessageID), 10, 64)
	require.NoError(t, err)
	return id
}

// requireKeyOrder checks that every key's records went to one partition, in
// id order (a repeat of the last id is a re-delivery, which at-least-once
// allows), and that the records hold every id of rs, and no other.
func requireKeyOrder(t *testing.T, recs []*kgo.Record, rs []row) {
	t.Helper()
	last := map[string]int64{}
	part := map[string]int32{}
	seen := map[int64]bool{}
	for _, r := range recs {
		key, id := string(r.Key), recordID(t, r)
		if p, ok := part[key]; ok {
			require.Equal(t, p, r.Partition, "key %s on two partitions", key)
		}
		part[key] = r.Partition
		require.GreaterOrEqual(t, id, last[key], "key %s: id %d after id %d", key, id, last[key])
		last[key] = id
		seen[id] = true
	}
	want := map[int64]bool{}
	for _, r := range rs {
		want[r.ID] = true
	}
	require.Equal(t, want, seen, "the ids the consumer saw")
}

// freePort returns a TCP port that was free a moment ago, for a cluster that
// must come back on the same address.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// randomText returns n random letters and digits: a payload that does not
// compress, so that its size on the wire is its size.
func randomText(n int) string {
	const alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
	b := make([]byte, n)
	for i := range b {
		b[i] = alphabet[rand.IntN(len(alphabet))]
	}
	return string(b)
}

// message builds a message as the relay would hand it over.
func message(id int64, typ, key string, payload string) relay.Message {
	return relay.Message{ID: id, Type: typ, Key: key, Payload: []byte(payload), CreatedAt: time.Now()}
}

// logBuffer collects log lines for assertions.
type logBuffer = testlog.Buffer
