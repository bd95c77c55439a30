package store

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// TestFetchCostIgnoresDeadAndForeignRows: dead rows and another app's backlog
// are never read by a pass: the select's plan touches only the live rows of
// its own types (measured by the buffers it reads, not by time). (That a
// whole relay's pass sends those rows only is the root's
// TestPassIgnoresDeadAndForeignRows.)
func TestFetchCostIgnoresDeadAndForeignRows(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, name := table(t)
	const maxAttempts = 10 // relay.MaxAttemptsDefault
	exec := func(sql string) {
		t.Helper()
		_, err := pool.Exec(ctx, fmt.Sprintf(sql, pgx.Identifier{name}.Sanitize()))
		require.NoError(t, err)
	}
	exec(`INSERT INTO %s (type, natural_key, payload, status, attempts)
		SELECT 't', 'dead' || g, '{}', 'ERROR', 10 FROM generate_series(1, 20000) g`)
	exec(`INSERT INTO %s (type, natural_key, payload)
		SELECT 'other', 'other' || g, '{}' FROM generate_series(1, 20000) g`)
	exec(`INSERT INTO %s (type, natural_key, payload) SELECT 't', 'live' || g, '{}' FROM generate_series(1, 10) g`)
	exec("ANALYZE %s")
	// The live rows delivered, as the relay's pass leaves them.
	exec(`UPDATE %s SET status = 'SENT', sent_at = now(), updated_at = now() WHERE natural_key LIKE 'live%%'`)
	// The select alone, as the pass runs it, read through EXPLAIN: the
	// buffers it touches stay small next to the 40,000 rows it skips (a
	// walk of them would touch several hundred).
	exec(`INSERT INTO %s (type, natural_key, payload) SELECT 't', 'again' || g, '{}' FROM generate_series(1, 10) g`)
	for _, backoff := range []time.Duration{0, 2 * time.Second} {
		repo, err := NewTable(name, backoff, time.Hour, false) // relay's retryBackoffMax
		require.NoError(t, err)
		sql, args := repo.FetchSQL(maxAttempts, []string{"t"}, 100)
		var plan []struct {
			Plan struct {
				Hit  int `json:"Shared Hit Blocks"`
				Read int `json:"Shared Read Blocks"`
				Rows int `json:"Actual Rows"`
			}
		}
		err = pool.QueryRow(ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) "+sql, args...).Scan(&plan)
		require.NoError(t, err)
		require.Equal(t, 10, plan[0].Plan.Rows)
		t.Logf("backoff %s: the select touched %d buffers for 10 rows beside 40,000 dead and foreign ones", backoff, plan[0].Plan.Hit+plan[0].Plan.Read)
		require.Less(t, plan[0].Plan.Hit+plan[0].Plan.Read, 100, "backoff %s", backoff)

		// The same under a generic plan, as the relay runs it (genericPlans):
		// one made without the arguments' values, which EXPLAIN of a
		// prepared statement shows under force_generic_plan.
		err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, "SET LOCAL plan_cache_mode = force_generic_plan"); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, "PREPARE select_batch AS "+sql); err != nil {
				return err
			}
			literals := make([]string, len(args))
			for i, a := range args {
				switch v := a.(type) {
				case []string:
					if len(v) == 0 {
						literals[i] = "'{}'::text[]"
						break
					}
					literals[i] = "ARRAY['" + strings.Join(v, "','") + "']::text[]"
				case []int64:
					literals[i] = "ARRAY" + strings.ReplaceAll(fmt.Sprint(v), " ", ",") + "::bigint[]"
				case []int32:
					literals[i] = "ARRAY" + strings.ReplaceAll(fmt.Sprint(v), " ", ",") + "::int[]"
				default:
					literals[i] = fmt.Sprint(a)
				}
			}
			if err := tx.QueryRow(ctx, "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE select_batch("+strings.Join(literals, ", ")+")").Scan(&plan); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "DEALLOCATE select_batch") // prepared for the session, not the transaction
			return err
		})
		require.NoError(t, err)
		require.Equal(t, 10, plan[0].Plan.Rows)
		t.Logf("backoff %s, generic plan: %d buffers", backoff, plan[0].Plan.Hit+plan[0].Plan.Read)
		require.Less(t, plan[0].Plan.Hit+plan[0].Plan.Read, 100, "backoff %s, generic plan", backoff)
	}
}
