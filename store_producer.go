package relay

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/xadm/relay/internal/headers"
	"github.com/xadm/relay/internal/store"
)

// Enqueue's insert, in sql/producer.sql.

// enqueue inserts one outbound PENDING row and returns its id. With a
// wakeChannel it also tries the wake-up token (force: notify without it) and
// reports whether it notified.
func enqueue(ctx context.Context, q Querier, table pgx.Identifier, m Outgoing, wakeChannel string, force bool) (id int64, notified bool, err error) {
	args := []any{m.Type, m.Key, string(m.Payload), table[len(table)-1]}
	wake, hdrs := 0, 0
	if wakeChannel != "" {
		wake, args = 1, append(args, wakeChannel, force)
	}
	if len(m.Headers) > 0 {
		h, err := headers.Encode(m.Headers)
		if err != nil {
			return 0, false, err
		}
		hdrs, args = 1, append(args, *h) // @headers is the last parameter
	}
	sql := store.EnqueueSQL[wake][hdrs]
	row := q.QueryRow(ctx, sql[0]+table.Sanitize()+sql[1], args...)
	if wake == 1 {
		err = row.Scan(&id, &notified)
	} else {
		err = row.Scan(&id)
	}
	var pgErr *pgconn.PgError
	if hdrs == 1 && errors.As(err, &pgErr) && pgErr.Code == "42703" && strings.Contains(pgErr.Message, `"`+headers.Column+`"`) {
		return 0, false, fmt.Errorf("the table has no %s column, which a message with Headers needs: add it with %s (docs/operations.md): %w",
			headers.Column, headersMigration(table.Sanitize()), err)
	}
	return id, notified, err
}
