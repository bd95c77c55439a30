package relay

import (
	"context"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/xadm/relay/internal/store"
	"github.com/xadm/relay/internal/testkit/sqltest"
)

// TestAdminStatements: every statement of Admin, Enqueue and EnqueueMany (internal/store
// renders them, the relay sends them) is sent, with exactly its parameters.
// (internal/store's TestSQLFiles checks the others.)
func TestAdminStatements(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var calls []sqltest.Call
	q := sqltest.Recorder{Calls: &calls}
	built := []string{store.PurgeCutoffSQL, store.ServerStateSQL, store.LockHoldersSQL}
	for _, table := range []string{"outbox", "billing." + strings.Repeat("x", 63)} {
		id, err := store.ParseTable(table)
		require.NoError(t, err)
		for _, channel := range []string{"", store.WakeChannel(id)} {
			for _, headers := range []map[string]string{nil, {"traceparent": "t"}} {
				_, _, _ = enqueue(ctx, q, id, Outgoing{Type: "t", Key: "k", Payload: []byte(`{}`), Headers: headers}, channel, false)
			}
		}
		for _, wakeTypes := range [][]string{nil, {"t", "u"}} {
			for _, headers := range []map[string]string{nil, {"traceparent": "t"}} {
				ms := []Outgoing{{Type: "t", Key: "k", Payload: []byte(`{}`)}, {Type: "u", Key: "k", Payload: []byte(`{}`), Headers: headers}}
				_, _, _ = enqueueMany(ctx, q, id, ms, wakeTypes, false)
			}
		}
		for _, stmts := range [][2][2][2]string{store.EnqueueSQL, store.EnqueueManySQL} {
			for _, byWake := range stmts {
				for _, cut := range byWake {
					built = append(built, cut[0]+id.Sanitize()+cut[1])
				}
			}
		}
		for _, requeued := range []bool{false, true} {
			a, err := newAdminRepository(table, requeued)
			require.NoError(t, err)
			rv := reflect.ValueOf(a.AdminSQL).Elem()
			for i := range rv.NumField() {
				if strings.HasSuffix(rv.Type().Field(i).Name, "SQL") {
					built = append(built, rv.Field(i).String())
				}
			}
			cut := time.Now()
			all, some := writeScope{}, writeScope{types: []string{"t"}, exclude: []string{"u"}}
			_, _ = a.countByStatus(ctx, q, 3)
			_, _ = a.deadPage(ctx, q, 3, DeadQuery{Limit: 1})
			_, _ = a.deadPage(ctx, q, 3, DeadQuery{Limit: 1, Type: "t"})
			_, _ = a.deadRows(ctx, q, 3, []int64{1})
			_, _ = a.requeueAll(ctx, q, 3, some)
			_, _ = a.requeueType(ctx, q, 3, "t")
			_, _ = a.requeueIDs(ctx, q, 3, []int64{1}, all)
			_, _ = a.cutoff(ctx, q, time.Hour)
			_, _ = a.purgeChunk(ctx, q, cut, 10, all)
			_, _ = a.estimatePurge(ctx, q, cut, all)
			_, _ = a.purgeCounts(ctx, q, cut, 0, all)
			_, _ = a.purgeCounts(ctx, q, cut, 50_000, some)
			_, _ = a.history(ctx, q, 3, time.Second, time.Hour, time.Minute, true)
			_, _ = a.history(ctx, q, 3, 0, time.Hour, time.Minute, false)
			_, _ = a.liveGroups(ctx, q, 3, time.Second)
			_, _ = a.sentByType(ctx, q)
			_, _ = a.server(ctx, q)
			_, _ = a.sampleSent(ctx, q, 10)
			_, _ = a.estimate(ctx, q, a.EstimateSentSQL)
			_, _ = a.lockHolders(ctx, q, []string{"app"})
		}
	}
	sqltest.Check(t, calls, built)
}
