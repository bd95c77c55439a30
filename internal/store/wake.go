package store

import (
	"context"
	"fmt"
	"hash/fnv"
	"strings"

	"github.com/jackc/pgx/v5"
)

// The wake-up's statements, in sql/wake.sql; wake.go is the wake-up itself.

// wakeProbeSQL is the listener's test notification.
var wakeProbeSQL = Statements.Positional("wakeProbe", Data{})

// WakeProbe notifies channel with payload, the listener's test notification.
func WakeProbe(ctx context.Context, db execer, channel, payload string) error {
	_, err := db.Exec(ctx, wakeProbeSQL, channel, payload)
	return err
}

// ListenSQL subscribes a connection to channel.
func ListenSQL(channel string) string {
	return Statements.Text("listen", Data{Channel: pgx.Identifier{channel}.Sanitize()})
}

// WakeTriggerSQL returns the DDL of a trigger that wakes the relays of table
// (optionally schema-qualified) whenever rows are inserted by any producer,
// for producers that do not call [Enqueue] (a JVM service, plain SQL). It is
// idempotent. One statement notifies once per type it inserted; of several
// transactions inserting at once, only the one holding the wake-up token
// carries the NOTIFY, so the producers' commits stay concurrent. Its price is
// one more function call per INSERT statement. Unlike Enqueue it has no
// window of its own: while a long transaction holds the token, the relays
// find the rows of the others at their next poll.
func WakeTriggerSQL(table string) (string, error) {
	id, err := ParseTable(table)
	if err != nil {
		return "", fmt.Errorf("relay: %w", err)
	}
	fn := append(pgx.Identifier{}, id...)
	fn[len(fn)-1] = strings.Trim(IndexName(id[len(id)-1], "_relay_wake"), `"`)
	channel := WakeChannel(id)
	return Statements.Text("wakeTrigger", Data{Table: id.Sanitize(), Function: fn.Sanitize(), Channel: quoteLiteral(channel)}) +
		"\n", nil // a script ends its last line
}

// CreateWakeTrigger installs [WakeTriggerSQL]'s trigger on table.
func CreateWakeTrigger(ctx context.Context, db Beginner, table string) error {
	ddl, err := WakeTriggerSQL(table)
	if err != nil {
		return err
	}
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, schemaLockSQL, "relay_schema:"+table); err != nil {
			return fmt.Errorf("relay: create the wake-up trigger on %s: %w", table, err)
		}
		if _, err := tx.Exec(ctx, ddl); err != nil {
			return fmt.Errorf("relay: create the wake-up trigger on %s: %w", table, err)
		}
		return nil
	})
}

func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// WakeChannel is the NOTIFY channel of table: "relay:" and the table's name
// without its schema (producers and relays may name it either way), cut
// with a hash of the whole past PostgreSQL's 63 bytes.
func WakeChannel(table pgx.Identifier) string {
	name := "relay:" + table[len(table)-1]
	if len(name) > 63 {
		h := fnv.New32a()
		h.Write([]byte(name))
		tag := fmt.Sprintf("_%08x", h.Sum32())
		name = name[:63-len(tag)] + tag
	}
	return name
}
