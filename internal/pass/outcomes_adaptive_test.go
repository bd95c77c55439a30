package pass_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/xadm/relay"
	"github.com/xadm/relay/internal/testkit/harness"
	"github.com/xadm/relay/internal/testkit/pgserver"
	"github.com/xadm/relay/internal/testkit/testlog"
)

// groupCounter counts the grouped outcome statements a pool runs (those that
// update several rows and return the ids they touched).
type groupCounter struct{ groups atomic.Int64 }

func (c *groupCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	if strings.HasPrefix(d.SQL, "UPDATE") && strings.Contains(d.SQL, "RETURNING") {
		c.groups.Add(1)
	}
	return ctx
}

func (c *groupCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TestAdaptiveOutcomes checks the default recording (decision 0037): what
// queues behind a write goes in the next one as one statement, and a group the
// server refuses as a whole is written again one transaction each, so that
// one refused row costs the others nothing.
func TestAdaptiveOutcomes(t *testing.T) {
	t.Parallel()
	b := harness.Setup(t)
	keys := make([]string, 10)
	for i := range keys {
		keys[i] = fmt.Sprint("k", i)
	}
	ids := b.Insert(t, "t", keys...)
	slow, refused := ids[0], ids[5]
	// The first outcome's write is slow, so that the next ones queue behind
	// it; the refused row's update raises, as a constraint or trigger would.
	fn := pgx.Identifier{b.Table + "_check"}.Sanitize()
	_, err := b.Pool.Exec(context.Background(), fmt.Sprintf(`CREATE FUNCTION %s() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.id = %d THEN PERFORM pg_sleep(0.3); END IF;
  IF NEW.id = %d AND NEW.status = 'SENT' THEN RAISE EXCEPTION 'refused by the test'; END IF;
  RETURN NEW;
END $$`, fn, slow, refused))
	require.NoError(t, err)
	b.Exec(t, `CREATE TRIGGER check_outcome BEFORE UPDATE ON %s FOR EACH ROW EXECUTE FUNCTION `+fn+`()`)

	var counter groupCounter
	pool := pgserver.Pool(t, harness.Server().URL, pgserver.Name(t), 8, func(pc *pgxpool.Config) { pc.ConnConfig.Tracer = &counter })
	var logs testlog.Buffer
	cfg := b.Config
	cfg.Logger = logs.Logger()
	require.Zero(t, cfg.GroupOutcomes, "adaptive is the default")
	r, err := relay.New(pool, cfg, harness.NewRecorder("t", nil))
	require.NoError(t, err)
	_, err = r.Run(context.Background())
	require.Error(t, err, "the refused row's outcome could not be recorded")

	require.Positive(t, counter.groups.Load(), "the outcomes that queued behind the slow write went in one statement")
	for _, id := range ids {
		want := "SENT"
		if id == refused {
			want = "PENDING"
		}
		require.Equal(t, want, b.State(t, id).Status, "row %d", id)
	}
	require.Len(t, logs.Lines("relay: outcome not recorded"), 1, "only the refused row is held back")
	require.Len(t, logs.Lines("relay: outcome not recorded", fmt.Sprintf(" id=%d ", refused)), 1)
}
