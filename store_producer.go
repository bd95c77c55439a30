package relay

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/xadm/relay/internal/headers"
	"github.com/xadm/relay/internal/store"
)

// Enqueue's and EnqueueMany's inserts, in sql/producer.sql.

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
	if hdrs == 1 && noHeadersColumn(err) {
		return 0, false, headersColumnMissing(table, err)
	}
	return id, notified, err
}

// enqueueMany inserts ms as outbound PENDING rows, in one statement, and
// returns their ids in the order of ms. With wakeTypes it also tries the
// wake-up token (force: notify without it), notifies each of them, and
// reports whether it notified.
func enqueueMany(ctx context.Context, q Querier, table pgx.Identifier, ms []Outgoing, wakeTypes []string, force bool) (ids []int64, notified bool, err error) {
	types, keys, payloads := make([]string, len(ms)), make([]string, len(ms)), make([]string, len(ms))
	n := 0
	for i := range ms {
		n += len(ms[i].Payload)
	}
	var all strings.Builder // the payloads in one copy, one allocation: each is a part of it
	all.Grow(n)
	for i := range ms {
		all.Write(ms[i].Payload)
	}
	text := all.String()
	var hdrs []string // nil unless a message has headers
	for i := range ms {
		types[i], keys[i] = ms[i].Type, ms[i].Key
		payloads[i], text = text[:len(ms[i].Payload)], text[len(ms[i].Payload):]
		if len(ms[i].Headers) == 0 {
			continue
		}
		h, err := headers.Encode(ms[i].Headers)
		if err != nil {
			return nil, false, fmt.Errorf("messages[%d]: %w", i, err)
		}
		if hdrs == nil {
			hdrs = make([]string, len(ms)) // '' is no headers (SQL NULL)
		}
		hdrs[i] = *h
	}
	args := []any{types, keys, payloads, table[len(table)-1]}
	wake, withHeaders := 0, 0
	if len(wakeTypes) > 0 {
		wake, args = 1, append(args, store.WakeChannel(table), wakeTypes, force)
	}
	if hdrs != nil {
		withHeaders, args = 1, append(args, hdrs) // @headers is the last parameter
	}
	sql := store.EnqueueManySQL[wake][withHeaders]
	row := q.QueryRow(ctx, sql[0]+table.Sanitize()+sql[1], args...)
	var list string
	if wake == 1 {
		err = row.Scan(&list, &notified)
	} else {
		err = row.Scan(&list)
	}
	if err != nil {
		if withHeaders == 1 && noHeadersColumn(err) {
			return nil, false, headersColumnMissing(table, err)
		}
		return nil, false, err
	}
	ids = make([]int64, 0, len(ms))
	for s := range strings.SplitSeq(list, ",") {
		id, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return nil, false, fmt.Errorf("read the new rows' ids: %w", err)
		}
		ids = append(ids, id)
	}
	if len(ids) != len(ms) {
		return nil, false, fmt.Errorf("the statement wrote %d rows for %d messages", len(ids), len(ms))
	}
	slices.Sort(ids) // drawn in the messages' order: sorted, they are in it
	return ids, notified, nil
}

// noHeadersColumn reports whether err says the table has no headers column
// (SQLSTATE 42703 naming it), from pgx or a database/sql driver.
func noHeadersColumn(err error) bool {
	var coded interface{ SQLState() string }
	return errors.As(err, &coded) && coded.SQLState() == "42703" && strings.Contains(err.Error(), `"`+headers.Column+`"`)
}

// headersColumnMissing is the error of a message with headers written into
// a table without the column.
func headersColumnMissing(table pgx.Identifier, err error) error {
	return fmt.Errorf("the table has no %s column, which a message with Headers needs: add it with %s (docs/operations.md): %w",
		headers.Column, headersMigration(table.Sanitize()), err)
}
