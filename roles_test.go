package relay_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/xadm/relay"
	"github.com/xadm/relay/internal/testkit/grants"
	"github.com/xadm/relay/internal/testkit/pgserver"
)

// roleWorld is one test's outbox table, made by the server's superuser as a
// migration would, and the names the parts' roles are granted on.
type roleWorld struct {
	b     *bundle
	names func(role string) grants.Names
}

func newRoleWorld(t *testing.T) *roleWorld {
	b := setup(t)
	return &roleWorld{b: b, names: func(role string) grants.Names {
		return grants.Names{Role: role, Schema: "public", Table: b.table, Inbox: b.table + "_in"}
	}}
}

// pool opens a pool on the shared server as a role with exactly part's
// grants, but for the statements that contain one of denied.
func (w *roleWorld) pool(t *testing.T, part grants.Part, denied ...string) (*pgxpool.Pool, string) {
	t.Helper()
	role := w.b.table + "_" + string(part)
	url := grants.Role(t, w.b.pool, server().URL, part, w.names(role), denied...)
	return pgserver.Pool(t, url, role, 6), role
}

// TestRoles: each part of the relay runs under a role that has exactly the
// grants docs/security.md lists for it: a producer enqueues, the relay
// (started: election, wake-ups, presence) delivers, an Admin of the status
// role reads everything, one of the admin role re-queues and purges.
func TestRoles(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	w := newRoleWorld(t)
	producer, _ := w.pool(t, grants.Producer)
	relayPool, _ := w.pool(t, grants.Relay)
	statusPool, _ := w.pool(t, grants.Status)
	adminPool, _ := w.pool(t, grants.Admin)

	var refuse atomic.Bool // the destination refuses while set: dead rows for the Admin
	dest := httptest.NewServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if refuse.Load() {
			http.Error(rw, "no", http.StatusBadRequest)
			return
		}
		rw.WriteHeader(http.StatusNoContent)
	}))
	defer dest.Close()
	sender, err := relay.NewHTTPSender(relay.HTTPSenderConfig{Type: "order", URL: relay.URLWithKey(dest.URL)})
	require.NoError(t, err)
	cfg := w.b.cfg
	cfg.WakeOnCommit = true
	r, err := relay.New(relayPool, cfg, sender)
	require.NoError(t, err)
	require.NoError(t, r.Start(ctx))
	t.Cleanup(func() { require.NoError(t, r.Stop(context.Background())) })

	enqueue := func(key string) int64 {
		tx, err := producer.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		id, err := relay.Enqueue(ctx, tx, w.b.table, relay.Outgoing{Type: "order", Key: key, Payload: []byte(`{}`),
			Headers: map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}})
		require.NoError(t, err)
		require.NoError(t, tx.Commit(ctx))
		return id
	}
	sent := enqueue("a")
	require.Eventually(t, func() bool { return w.b.state(t, sent).Status == "SENT" }, time.Minute, 10*time.Millisecond)
	refuse.Store(true)
	dead := enqueue("b")
	require.Eventually(t, func() bool { return w.b.state(t, dead).Status == "ERROR" }, time.Minute, 10*time.Millisecond)

	// The status role reads what an operator looks at: counts, dead rows,
	// the election, the replicas with their types (pg_read_all_stats).
	reader, err := relay.NewAdmin(statusPool, cfg, relay.AdminAllTypes())
	require.NoError(t, err)
	ov, err := reader.Overview(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 1, ov.Dead)
	reps, err := reader.Replicas(ctx)
	require.NoError(t, err)
	require.Len(t, reps, 1)
	require.Equal(t, []string{"order"}, reps[0].Types, "the relay's types, read from its session's descriptor")
	_, err = reader.ListDead(ctx, 10)
	require.NoError(t, err)
	_, err = reader.RequeueAll(ctx)
	require.ErrorContains(t, err, "permission denied for table "+w.b.table, "the status role may not write")

	// The admin role re-queues and purges.
	refuse.Store(false)
	admin, err := relay.NewAdmin(adminPool, cfg, relay.AdminAllTypes())
	require.NoError(t, err)
	n, err := admin.RequeueIDs(ctx, dead)
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	require.Eventually(t, func() bool { return w.b.state(t, dead).Status == "SENT" }, time.Minute, 10*time.Millisecond)
	n, err = admin.PurgeSent(ctx, 0)
	require.NoError(t, err)
	require.EqualValues(t, 2, n)
}

// TestRoleMissingGrant: a part whose role lacks a grant fails at once with
// an error that names what is missing, never a silent stall: the relay
// refuses to pass (it would send and fail to record, again and again), the
// producer and the Admin get PostgreSQL's refusal naming the object.
func TestRoleMissingGrant(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	w := newRoleWorld(t)
	ids := w.b.insert(t, "order", "a")

	relayPool, role := w.pool(t, grants.Relay, "UPDATE")
	_, err := w.b.pool.Exec(ctx, "GRANT SELECT ON "+pgx.Identifier{w.b.table}.Sanitize()+" TO "+role)
	require.NoError(t, err)
	sends := 0
	r, err := relay.New(relayPool, w.b.cfg, newRecorder("order", func(context.Context, relay.Message) error { sends++; return nil }))
	require.NoError(t, err)
	_, err = r.Run(ctx)
	require.ErrorContains(t, err, `relay: role "`+role+`" lacks UPDATE (status, attempts, last_error, updated_at, sent_at) on public.`+w.b.table)
	require.ErrorContains(t, err, "docs/security.md")
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "42501", pgErr.Code, "PostgreSQL's insufficient_privilege, for a caller that reads the SQLSTATE")
	require.Zero(t, sends, "nothing is sent that could not be recorded")
	require.Equal(t, "PENDING", w.b.state(t, ids[0]).Status)

	producer, _ := w.pool(t, grants.Producer, "SEQUENCE")
	tx, err := producer.Begin(ctx)
	require.NoError(t, err)
	_, err = relay.Enqueue(ctx, tx, w.b.table, relay.Outgoing{Type: "order", Key: "k", Payload: []byte(`{}`)})
	require.ErrorContains(t, err, "permission denied for sequence "+w.b.table+"_id_seq")
	require.NoError(t, tx.Rollback(ctx))

	adminPool, _ := w.pool(t, grants.Admin, "DELETE")
	admin, err := relay.NewAdmin(adminPool, w.b.cfg, relay.AdminAllTypes())
	require.NoError(t, err)
	_, err = admin.PurgeSent(ctx, 0)
	require.ErrorContains(t, err, "permission denied for table "+w.b.table)
}

// TestSecurityDocGrants: docs/security.md shows each part's grants exactly as
// the tests grant them (internal/testkit/grants), for the names it uses.
func TestSecurityDocGrants(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("docs/security.md")
	require.NoError(t, err)
	for _, part := range grants.Parts {
		m := regexp.MustCompile("(?s)<!-- grants: " + string(part) + " -->\\s*```sql\\n(.*?)```").FindSubmatch(doc)
		require.NotNil(t, m, "docs/security.md has no ```sql block after <!-- grants: %s -->", part)
		want := grants.SQL(part, grants.Names{Role: "orders_" + string(part), Schema: "public", Table: "mensagem_m2m", Inbox: "relay_inbox"})
		require.Equal(t, want, string(m[1]), "docs/security.md's grants of %s", part)
	}
	require.True(t, strings.Contains(string(doc), "pg_read_all_stats"))
}
