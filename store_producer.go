package relay

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Enqueue's insert, in sql/producer.sql.

// tableSlot stands for the table in a statement rendered once for every
// table; the caller puts the table between its halves.
const tableSlot = "\x00table\x00"

// enqueueSQL is Enqueue's insert without ([0]) and with ([1]) the wake-up,
// without ([.][0]) and with ([.][1]) headers, cut where the table goes:
// Enqueue names its table at each call.
var enqueueSQL = [2][2][2]string{
	{cutAtTable("enqueue", sqlData{}), cutAtTable("enqueue", sqlData{Headers: true})},
	{cutAtTable("enqueue", sqlData{Wake: true}), cutAtTable("enqueue", sqlData{Wake: true, Headers: true})},
}

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

// enqueue inserts one outbound PENDING row and returns its id. With a
// wakeChannel it also tries the wake-up token (force: notify without it) and
// reports whether it notified.
func enqueue(ctx context.Context, q Querier, table pgx.Identifier, m Outgoing, wakeChannel string, force bool) (id int64, notified bool, err error) {
	args := []any{m.Type, m.Key, string(m.Payload), table[len(table)-1]}
	wake, headers := 0, 0
	if wakeChannel != "" {
		wake, args = 1, append(args, wakeChannel, force)
	}
	if len(m.Headers) > 0 {
		h, err := encodeHeaders(m.Headers)
		if err != nil {
			return 0, false, err
		}
		headers, args = 1, append(args, *h) // @headers is the last parameter
	}
	sql := enqueueSQL[wake][headers]
	row := q.QueryRow(ctx, sql[0]+table.Sanitize()+sql[1], args...)
	if wake == 1 {
		err = row.Scan(&id, &notified)
	} else {
		err = row.Scan(&id)
	}
	var pgErr *pgconn.PgError
	if headers == 1 && errors.As(err, &pgErr) && pgErr.Code == "42703" && strings.Contains(pgErr.Message, `"`+headersColumn+`"`) {
		return 0, false, fmt.Errorf("the table has no %s column, which a message with Headers needs: add it with %s (docs/operations.md): %w",
			headersColumn, headersMigration(table.Sanitize()), err)
	}
	return id, notified, err
}
