package inbox_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/xadm/relay/inbox"
	"github.com/xadm/relay/internal/testkit/grants"
	"github.com/xadm/relay/internal/testkit/pgserver"
)

// TestRole: the inbox runs under a role with exactly the grants
// docs/security.md lists for it (and the receiver's own, on its effects):
// it applies, drops duplicates and stale messages, and purges; without
// UPDATE on the keys' table it answers 503 naming the table, applying nothing.
func TestRole(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setup(t)
	names := func(role string) grants.Names {
		return grants.Names{Role: role, Schema: "public", Table: "unused", Inbox: b.table}
	}
	role := b.table + "_inbox"
	url := grants.Role(t, b.pool, pgserver.Shared().URL, grants.Inbox, names(role))
	_, err := b.pool.Exec(ctx, "GRANT INSERT ON "+b.effects+" TO "+role)
	require.NoError(t, err)
	pool := pgserver.Pool(t, url, role, 4)
	ib, err := inbox.New(pool, inbox.Config{Table: b.table, Logger: b.logs.Logger()})
	require.NoError(t, err)
	h := ib.Handler(b.apply)
	for _, c := range []struct {
		id      int64
		outcome string
	}{{2, "applied"}, {2, "duplicate"}, {1, "stale"}, {3, "applied"}} {
		w := serve(h, request("k", c.id, `{}`))
		require.Equal(t, http.StatusNoContent, w.Code, w.Body.String())
		require.Equal(t, c.outcome, w.Header().Get(inbox.HeaderOutcome))
	}
	// Purge with an age of 0 deletes the records received before now.
	require.Eventually(t, func() bool {
		_, err = ib.Purge(ctx, 0)
		require.NoError(t, err)
		return b.count(t, "inbox") == 0
	}, 10*time.Second, 10*time.Millisecond)

	denied := b.table + "_denied"
	url = grants.Role(t, b.pool, pgserver.Shared().URL, grants.Inbox, names(denied), "UPDATE")
	_, err = b.pool.Exec(ctx, "GRANT SELECT, INSERT ON "+pgx.Identifier{b.table + "_keys"}.Sanitize()+" TO "+denied)
	require.NoError(t, err)
	ib, err = inbox.New(pgserver.Pool(t, url, denied, 2), inbox.Config{Table: b.table, Logger: b.logs.Logger()})
	require.NoError(t, err)
	w := serve(ib.Handler(func(context.Context, pgx.Tx, inbox.Message) error {
		t.Error("apply must not run")
		return nil
	}), request("k", 4, `{}`))
	require.Equal(t, http.StatusServiceUnavailable, w.Code)
	require.Contains(t, w.Body.String(), "permission denied for table "+b.table+"_keys")
}
