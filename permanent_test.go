package relay_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/xadm/relay"
)

// TestPermanentFailureRecorded: a 4xx answer (a permanent failure) kills its
// row at once, and the row says so with the attempts really made, while it
// stays dead by the table's own rule (ERROR and attempts at the ceiling, the
// JVM relay's rule too). A row that failed once before and then permanently
// says 2 attempts; one that reached the ceiling by retries is not permanent.
func TestPermanentFailureRecorded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	var calls atomic.Int32
	dest := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.WriteHeader(http.StatusBadRequest)
	}))
	t.Cleanup(dest.Close)
	httpSender, err := relay.NewHTTPSender(relay.HTTPSenderConfig{Type: "order", URL: relay.URLWithKey(dest.URL + "/orders/")})
	require.NoError(t, err)
	second := 0
	flaky := relay.SenderFunc("invoice", func(ctx context.Context, m relay.Message) error {
		if m.Attempts == 0 {
			return errors.New("503 try later")
		}
		second++
		return relay.Permanent(errors.New("422 the invoice is wrong"))
	})
	exhausted := relay.SenderFunc("payment", func(ctx context.Context, m relay.Message) error { return errors.New("timeout") })

	ids := b.insert(t, "order", "o1")
	inv := b.insert(t, "invoice", "i1")
	pay := b.insert(t, "payment", "p1")
	cfg := b.cfg
	cfg.MaxAttempts = 3
	r := b.newRelay(t, cfg, httpSender, flaky, exhausted)
	for range 3 {
		_, err := r.Run(ctx)
		require.NoError(t, err)
	}
	require.EqualValues(t, 1, calls.Load(), "a 4xx is never retried")

	st := b.state(t, ids[0])
	require.Equal(t, "ERROR", st.Status)
	require.Equal(t, 3, st.Attempts, "at the ceiling: dead by the table's rule")
	var lastError string
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT last_error FROM "+pgx.Identifier{b.table}.Sanitize()+" WHERE id = $1", ids[0]).Scan(&lastError))
	require.True(t, strings.HasPrefix(lastError, "permanent after 1 attempt(s): "), lastError)
	require.Contains(t, lastError, "400")
	require.Equal(t, 1, b.deadCount(t, 3)-2, "dead by ERROR AND attempts >= ceiling")

	admin, err := relay.NewAdmin(b.pool, cfg)
	require.NoError(t, err)
	dead, err := admin.ListDead(ctx, 10)
	require.NoError(t, err)
	byID := map[int64]relay.DeadMessage{}
	for _, d := range dead {
		byID[d.ID] = d
	}
	require.True(t, byID[ids[0]].Permanent)
	require.Equal(t, 1, byID[ids[0]].AttemptsMade)
	require.Equal(t, 3, byID[ids[0]].Attempts)
	require.True(t, byID[inv[0]].Permanent)
	require.Equal(t, 2, byID[inv[0]].AttemptsMade)
	require.False(t, byID[pay[0]].Permanent, "reached the ceiling by retries")
	require.Equal(t, 3, byID[pay[0]].AttemptsMade)

	o, err := admin.Overview(ctx)
	require.NoError(t, err)
	for _, ty := range o.Types {
		if ty.Type == "order" {
			require.True(t, ty.FirstDead.Permanent)
			require.Equal(t, 1, ty.FirstDead.AttemptsMade)
		}
	}
}

// TestPermanentMarkFitsANarrowColumn: on a JVM-made table whose last_error
// is varchar(40), the mark survives the cut.
func TestPermanentMarkFitsANarrowColumn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	b.exec(t, "ALTER TABLE %s ALTER COLUMN last_error TYPE varchar(40)")
	id := b.insert(t, "order", "o1")[0]
	r := b.newRelay(t, b.cfg, relay.SenderFunc("order", func(context.Context, relay.Message) error {
		return relay.Permanent(errors.New(strings.Repeat("x", 100)))
	}))
	_, err := r.Run(ctx)
	require.NoError(t, err)
	var lastError string
	require.NoError(t, b.pool.QueryRow(ctx, "SELECT last_error FROM "+pgx.Identifier{b.table}.Sanitize()+" WHERE id = $1", id).Scan(&lastError))
	require.Len(t, lastError, 40)
	n, ok := relay.ParsePermanent(lastError)
	require.True(t, ok, lastError)
	require.Equal(t, 1, n)
}

func TestParsePermanent(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]int{"permanent after 1 attempt(s): 400": 1, "permanent after 12 attempt(s), not sent: bad": 12} {
		n, ok := relay.ParsePermanent(in)
		require.True(t, ok, in)
		require.Equal(t, want, n)
	}
	for _, in := range []string{"", "400 Bad Request", "permanent after x attempt(s): y", "permanent after 1 attempts"} {
		_, ok := relay.ParsePermanent(in)
		require.False(t, ok, in)
	}
}
