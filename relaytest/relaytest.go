// Package relaytest helps a service that embeds [relay] test it against a real
// PostgreSQL: a throwaway database per test, the outbox table, a [Sender] that
// records what it was given, and the election held from another session
// exactly as another replica, or the JVM relay, holds it.
//
// The heart of it is the test that proves the guard in the adopter's own
// suite: while another replica holds the election, [relay.Relay.RunIfElected]
// returns false and nothing is sent.
//
//	func TestNothingSentWhileAnotherReplicaHoldsTheLock(t *testing.T) {
//		ctx := context.Background()
//		pool := relaytest.Database(t)
//		relaytest.CreateTable(t, pool, relay.TableDefault)
//		relaytest.Enqueue(t, pool, relay.TableDefault, "order", "order-1", map[string]int{"id": 1})
//		orders := relaytest.NewRecorder("order")
//		cfg := relay.DefaultConfig()
//		cfg.AppName = "billing"
//		r, err := relay.New(pool, cfg, orders)
//		require.NoError(t, err)
//
//		release := relaytest.HoldElection(t, pool, cfg.AppName)
//		ran, err := r.RunIfElected(ctx)
//		require.NoError(t, err)
//		require.False(t, ran)
//		require.Empty(t, orders.Messages())
//
//		release()
//		ran, err = r.RunIfElected(ctx)
//		require.NoError(t, err)
//		require.True(t, ran)
//		require.Len(t, orders.Messages(), 1)
//	}
//
// # The server
//
// The first call to [Database] in a test binary finds or starts one PostgreSQL
// server, the same way relay's own tests do: the URL in the environment
// variable RELAY_TEST_DATABASE_URL if it is set; else a fresh cluster from the
// local PostgreSQL binaries (Debian: apt-get install -y postgresql). To have a
// postgres:16-alpine container first whenever a Docker engine answers, import
// the module github.com/xadm/relay/relaytest/container for its side effect in
// one test file (it is apart so that this package brings no Docker client
// libraries into your go.mod):
//
//	import _ "github.com/xadm/relay/relaytest/container"
//
// If none can be
// had, the test fails, saying what to install: it never skips. Each call then
// creates a database of its own on that server, so parallel tests share no
// rows and no elections (advisory locks belong to one database), and drops it
// when the test ends.
//
// Call [Main] from TestMain to stop the server after the tests:
//
//	func TestMain(m *testing.M) { relaytest.Main(m) }
//
// Without it the server still dies with the test binary — a local cluster is
// started so that the kernel signals it when the binary exits, and a container
// is removed by testcontainers' reaper — but a local cluster's temporary data
// directory is left behind in os.TempDir().
package relaytest

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/xadm/relay"
	"github.com/xadm/relay/internal/testkit/pgserver"
)

// EnvDatabaseURL names the environment variable that points [Database] at an
// existing server instead of starting one. Its user must be allowed to create
// databases.
const EnvDatabaseURL = "RELAY_TEST_DATABASE_URL"

// Timeouts of the kit: starting a server (a container may have to be pulled)
// and each statement the kit runs on its own.
const (
	startTimeout     = 5 * time.Minute
	statementTimeout = 30 * time.Second
)

// server is the test binary's one PostgreSQL, started by the first Database.
var server struct {
	once sync.Once
	mu   sync.Mutex
	s    *pgserver.Server
	err  error
}

// shared starts the server once and returns it, or why it could not.
func shared() (*pgserver.Server, error) {
	server.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
		defer cancel()
		s, err := pgserver.Start(ctx, EnvDatabaseURL)
		server.mu.Lock()
		server.s, server.err = s, err
		server.mu.Unlock()
	})
	server.mu.Lock()
	defer server.mu.Unlock()
	return server.s, server.err
}

// Main runs the tests and then stops the server that [Database] started, if
// any, removing a local cluster's data or the container. Call it from
// TestMain; when it returns, the test binary exits with the tests' result:
//
//	func TestMain(m *testing.M) { relaytest.Main(m) }
func Main(m *testing.M) {
	_ = m.Run() // since Go 1.15, the test binary exits with this result when TestMain returns
	server.mu.Lock()
	s := server.s
	server.mu.Unlock()
	if s != nil {
		if err := s.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "relaytest: stopping the test server:", err)
		}
	}
}

// Database returns a pool on a fresh, empty database of its own on the test
// binary's server, starting the server on first use (see the package
// documentation). The database is dropped, and the pool closed, when the test
// ends. The pool has pgxpool's default size, enough for a relay and its
// election. If no server can be had, the test fails, saying what to install.
func Database(t testing.TB) *pgxpool.Pool {
	t.Helper()
	s, err := shared()
	if err != nil {
		t.Fatalf("relaytest: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), statementTimeout)
	defer cancel()

	name := databaseName(t)
	admin, err := pgx.Connect(ctx, s.URL)
	if err != nil {
		t.Fatalf("relaytest: connect to the test server: %v", err)
	}
	defer admin.Close(context.Background())
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
		t.Fatalf("relaytest: create database %s: %v", name, err)
	}
	drop := func() {
		ctx, cancel := context.WithTimeout(context.Background(), statementTimeout)
		defer cancel()
		conn, err := pgx.Connect(ctx, s.URL)
		if err == nil {
			// FORCE ends the sessions a test left open (a relay never stopped).
			_, err = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
			conn.Close(ctx)
		}
		if err != nil {
			t.Logf("relaytest: drop database %s: %v", name, err)
		}
	}

	cfg, err := pgxpool.ParseConfig(s.URL)
	if err != nil {
		drop()
		t.Fatalf("relaytest: %v", err)
	}
	cfg.ConnConfig.Database = name
	cfg.ConnConfig.RuntimeParams["application_name"] = name
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		drop()
		t.Fatalf("relaytest: open a pool on %s: %v", name, err)
	}
	t.Cleanup(func() {
		pool.Close()
		drop()
	})
	return pool
}

var notIdent = regexp.MustCompile(`[^a-z0-9]+`)

// databaseName is "relaytest_", the test's name and a random suffix: a valid,
// unique database name of at most 63 bytes that says where it came from.
func databaseName(t testing.TB) string {
	const prefix = "relaytest_"
	suffix := fmt.Sprintf("_%08x", rand.Uint32())
	base := strings.Trim(notIdent.ReplaceAllString(strings.ToLower(t.Name()), "_"), "_")
	if n := 63 - len(prefix) - len(suffix); len(base) > n {
		base = strings.TrimRight(base[:n], "_")
	}
	return prefix + base + suffix
}

// CreateTable creates the outbox table (optionally schema-qualified) with
// [relay.CreateTable], failing the test on error.
func CreateTable(t testing.TB, pool *pgxpool.Pool, table string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), statementTimeout)
	defer cancel()
	if err := relay.CreateTable(ctx, pool, table); err != nil {
		t.Fatalf("relaytest: %v", err)
	}
}

// Enqueue writes a PENDING outbound message of type typ and natural key key to
// table with [relay.Enqueue], failing the test on error, and returns its id.
// payload is marshalled with encoding/json; pass a json.RawMessage for JSON
// text you already have.
func Enqueue(t testing.TB, pool *pgxpool.Pool, table, typ, key string, payload any) int64 {
	t.Helper()
	body, err := json.Marshal(payload)
	if err != nil {
		t.Fatalf("relaytest: marshal the payload of %s %q: %v", typ, key, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), statementTimeout)
	defer cancel()
	id, err := relay.Enqueue(ctx, pool, table, relay.Outgoing{Type: typ, Key: key, Payload: body})
	if err != nil {
		t.Fatalf("relaytest: %v", err)
	}
	return id
}

// HoldElection takes the election of appName from a session of its own,
// exactly as another replica does — the JVM relay included:
//
//	SELECT pg_try_advisory_lock(hashtext(appName || '_relay_m2m'))
//
// on a new connection to pool's database (not one of pool's). While it holds
// the election, every relay of appName on that database coalesces:
// RunIfElected returns false and sends nothing. The test fails if the election
// is already held.
//
// release unlocks and closes that session; it is safe to call more than once
// and from any goroutine, and it runs when the test ends if the test did not
// call it.
func HoldElection(t testing.TB, pool *pgxpool.Pool, appName string) (release func()) {
	t.Helper()
	key := appName + relay.LockKeySuffix
	ctx, cancel := context.WithTimeout(context.Background(), statementTimeout)
	defer cancel()
	conn, err := pgx.ConnectConfig(ctx, pool.Config().ConnConfig.Copy())
	if err != nil {
		t.Fatalf("relaytest: HoldElection: connect: %v", err)
	}
	var got bool
	if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock(hashtext($1))", key).Scan(&got); err != nil {
		conn.Close(context.Background())
		t.Fatalf("relaytest: HoldElection: lock %q: %v", key, err)
	}
	if !got {
		conn.Close(context.Background())
		t.Fatalf("relaytest: HoldElection: the election %q is held by another session already", key)
	}
	var once sync.Once
	release = func() {
		once.Do(func() {
			ctx, cancel := context.WithTimeout(context.Background(), statementTimeout)
			defer cancel()
			defer conn.Close(ctx)
			var unlocked bool
			err := conn.QueryRow(ctx, "SELECT pg_advisory_unlock(hashtext($1))", key).Scan(&unlocked)
			switch {
			case err != nil:
				t.Errorf("relaytest: HoldElection: unlock %q: %v", key, err)
			case !unlocked:
				t.Errorf("relaytest: HoldElection: unlock %q returned false: the holding session lost the lock", key)
			}
		})
	}
	t.Cleanup(release)
	return release
}

// Recorder is a [relay.Sender] of one type that accepts every message and
// records it. It is safe for concurrent use. Build it with [NewRecorder].
type Recorder struct {
	typ  string
	mu   sync.Mutex
	msgs []relay.Message
}

var _ relay.Sender = (*Recorder)(nil)

// NewRecorder returns a Recorder of messages of type typ.
func NewRecorder(typ string) *Recorder { return &Recorder{typ: typ} }

// Type implements [relay.Sender].
func (r *Recorder) Type() string { return r.typ }

// Send implements [relay.Sender]: it records m and returns nil.
func (r *Recorder) Send(_ context.Context, m relay.Message) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.msgs = append(r.msgs, m)
	return nil
}

// Messages returns a copy of the messages sent so far, in the order they were
// sent.
func (r *Recorder) Messages() []relay.Message {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]relay.Message(nil), r.msgs...)
}
