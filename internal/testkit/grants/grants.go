// Package grants is the least privilege of each part of the relay: the
// grants its role needs and nothing more, as docs/security.md shows them
// (TestSecurityDocGrants keeps the two the same), and the helper the tests
// of each part use to run it under a role with exactly those grants.
//
// A role also needs to connect to the database, which PUBLIC may by
// default, and to log in. Advisory locks, LISTEN and NOTIFY,
// pg_stat_activity and pg_locks need no grant.
package grants

import (
	"context"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Part is a part of the relay that runs under a role of its own.
type Part string

// The parts.
const (
	// Relay is a relay's process: its passes, election, wake-ups and presence.
	Relay Part = "relay"
	// Producer writes messages: relay.Enqueue, or plain SQL.
	Producer Part = "producer"
	// Status reads: relayctl status and dead, the console without Actions,
	// an Admin's reads.
	Status Part = "status"
	// Admin re-queues and purges: an Admin's RequeueDead and Purge, the
	// console's Actions, relayctl requeue and purge.
	Admin Part = "admin"
	// Inbox is a receiver's inbox: Receive, its Handler, and Purge.
	Inbox Part = "inbox"
)

// Parts are the parts, in docs/security.md's order.
var Parts = []Part{Relay, Producer, Status, Admin, Inbox}

// Names are the names the grants are written for.
type Names struct {
	Role   string // the part's role
	Schema string // the tables' schema
	Table  string // the outbox table
	Inbox  string // the inbox's table (inbox.Config.Table); its keys' table is Inbox + "_keys"
}

// sql is each part's grants, {{role}}, {{schema}}, {{table}} and {{inbox}}
// standing for the names.
var sql = map[Part]string{
	Relay: `GRANT USAGE ON SCHEMA {{schema}} TO {{role}};
GRANT SELECT, UPDATE (status, attempts, last_error, updated_at, sent_at) ON {{schema}}.{{table}} TO {{role}};
`,
	Producer: `GRANT USAGE ON SCHEMA {{schema}} TO {{role}};
GRANT INSERT (direction, type, natural_key, payload, status, attempts, headers), SELECT (id) ON {{schema}}.{{table}} TO {{role}};
GRANT USAGE ON SEQUENCE {{schema}}.{{table}}_id_seq TO {{role}};
`,
	Status: `GRANT USAGE ON SCHEMA {{schema}} TO {{role}};
GRANT SELECT ON {{schema}}.{{table}} TO {{role}};
GRANT pg_read_all_stats TO {{role}};
`,
	Admin: `GRANT USAGE ON SCHEMA {{schema}} TO {{role}};
GRANT SELECT, UPDATE (status, attempts, last_error, updated_at, requeued_at), DELETE ON {{schema}}.{{table}} TO {{role}};
GRANT pg_read_all_stats TO {{role}};
`,
	Inbox: `GRANT USAGE ON SCHEMA {{schema}} TO {{role}};
GRANT SELECT, INSERT, DELETE ON {{schema}}.{{inbox}} TO {{role}};
GRANT SELECT, INSERT, UPDATE ON {{schema}}.{{inbox}}_keys TO {{role}};
`,
}

// SQL returns part's grants for names n, one statement a line.
func SQL(part Part, n Names) string {
	return strings.NewReplacer("{{role}}", n.Role, "{{schema}}", n.Schema, "{{table}}", n.Table, "{{inbox}}", n.Inbox).Replace(sql[part])
}

// Role creates, for t, a login role n.Role with exactly part's grants
// (but for those it is denied: statements of the grants that contain one
// of them are left out), through admin, a pool of a superuser on the server
// of serverURL, and returns serverURL as that role. The role is dropped when
// t ends. Its names must be plain lowercase identifiers.
func Role(t testing.TB, admin *pgxpool.Pool, serverURL string, part Part, n Names, denied ...string) string {
	t.Helper()
	ctx := context.Background()
	stmts := []string{"CREATE ROLE " + n.Role + " LOGIN"}
	for _, s := range strings.Split(strings.TrimSpace(SQL(part, n)), "\n") {
		keep := true
		for _, d := range denied {
			keep = keep && !strings.Contains(s, d)
		}
		if keep {
			stmts = append(stmts, s)
		}
	}
	for _, s := range stmts {
		if _, err := admin.Exec(ctx, s); err != nil {
			t.Fatalf("grants: %s: %v", s, err)
		}
	}
	t.Cleanup(func() {
		// The role's sessions may outlive the test's pools by a moment.
		_, _ = admin.Exec(context.Background(), "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1", n.Role)
		_, _ = admin.Exec(context.Background(), "DROP OWNED BY "+n.Role)
		_, _ = admin.Exec(context.Background(), "DROP ROLE "+n.Role)
	})
	u, err := url.Parse(serverURL)
	if err != nil {
		t.Fatal(err)
	}
	u.User = url.User(n.Role)
	return u.String()
}
