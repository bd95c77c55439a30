package relay

import (
	"context"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Enqueue's insert, in sql/producer.sql.

// tableSlot stands for the table in a statement rendered once for every
// table; the caller puts the table between its halves.
const tableSlot = "\x00table\x00"

// enqueueSQL is Enqueue's insert without ([0]) and with ([1]) the wake-up,
// cut where the table goes: Enqueue names its table at each call.
var enqueueSQL = [2][2]string{cutAtTable("enqueue", sqlData{}), cutAtTable("enqueue", sqlData{Wake: true})}

// cutAtTable renders statement name for d, whose {{.Table}} appears once,
// and returns what comes before and after it.
func cutAtTable(name string, d sqlData) [2]string {
	d.Table = tableSlot
	before, after, ok := strings.Cut(statements.positional(name, d), tableSlot)
	if !ok || strings.Contains(after, tableSlot) {
		panic("relay: statement " + name + " must name its table once")
	}
	return [2]string{before, after}
}

// enqueue inserts one outbound PENDING row and returns its id, notifying
// wakeChannel when it is not "" (wakeWindowDue: the producer's own window
// says a NOTIFY is due, token or not).
func enqueue(ctx context.Context, q Querier, table pgx.Identifier, m Outgoing, wakeChannel string, wakeWindowDue bool) (int64, error) {
	sql, args := enqueueSQL[0], []any{m.Type, m.Key, string(m.Payload), table[len(table)-1]}
	if wakeChannel != "" {
		sql, args = enqueueSQL[1], append(args, wakeChannel, wakeWindowDue)
	}
	var id int64
	err := q.QueryRow(ctx, sql[0]+table.Sanitize()+sql[1], args...).Scan(&id)
	return id, err
}
