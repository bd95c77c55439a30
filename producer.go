package relay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/xadm/relay/internal/headers"
	"github.com/xadm/relay/internal/store"
	"github.com/xadm/relay/internal/wake"
)

// Querier is what [Enqueue] writes through: pgx.Tx (as pool.Begin returns
// it), *pgxpool.Pool, *pgxpool.Conn and *pgx.Conn satisfy it.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Outgoing is a message to write to the outbox with [Enqueue].
type Outgoing struct {
	// Type chooses the [Sender] that delivers the message: the relay of the app
	// that registered a sender for it. Required.
	Type string
	// Key is the natural key, the receiver's unit of state and order: the
	// messages of one key are delivered one at a time, in id order. Required.
	Key string
	// Payload is the message's body, one JSON document, stored as jsonb: the
	// Sender gets it back normalised (spacing and key order may differ).
	// Required; json.Marshal builds it.
	Payload []byte
	// Headers travel with the message to its destination (the request's,
	// record's or message's headers): see [HeadersMax] for the rules Enqueue
	// checks. They are stored in the table's headers column, which CreateTable
	// adds; a table without it takes no headers (docs/operations.md). Optional.
	Headers map[string]string
}

// errEnqueue prefixes the errors of Enqueue.
const errEnqueue = "relay: enqueue: "

// Enqueue writes m as a PENDING outbound row of table (optionally
// schema-qualified, as [Config.Table]) through q and returns the new row's id.
//
// Pass the caller's pgx.Tx as q, so that the business write and the message
// commit or roll back together: the relay sees the message only once the
// transaction commits, and never if it rolls back. Through a pool, the row is
// committed at once, on its own.
//
// The relay delivers a key's messages in id order, and ids are drawn at
// INSERT, not at commit: two transactions writing messages of one key at once
// could commit in the other order. So Enqueue first takes the key's order
// lock, a transaction-scoped advisory lock on (table, key), in the same
// statement: a second transaction writing the same key waits until the first
// commits or rolls back, and ids follow commits. Transactions that write
// several keys should write them in a consistent order (sorted, say), as with
// any row locks, or two of them can deadlock, and PostgreSQL aborts one
// (SQLSTATE 40P01). A producer that writes by plain SQL keeps the order by
// taking the same lock first (docs/architecture.md), or by locking the
// aggregate's own row (SELECT … FOR UPDATE) before it writes the message.
//
// Enqueue validates table and m before it writes anything: table must be a
// name as [Config.Table] takes it, Type and Key must not be empty or blank,
// and Payload must be one valid JSON document. The error names the field it
// refuses ("Outgoing.Key must not be empty ...").
//
// By default Enqueue also wakes the relays of table when the transaction
// commits (a NOTIFY in the same statement), so the message reaches its Sender
// within milliseconds instead of at the next poll; see [WithoutWakeUp]. When
// one process's Enqueues of a type and table come less than 2ms apart, at
// most one per 5ms carries the wake-up; the others' rows are found by the
// pass it wakes, or by the relay's follow-up poll a few milliseconds after it.
// Enqueue is one statement, one round trip, either way.
func Enqueue(ctx context.Context, q Querier, table string, m Outgoing, opts ...EnqueueOption) (int64, error) {
	o := enqueueOptions{wakes: wake.Enqueues}
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	id, err := store.ParseTable(table)
	if err != nil {
		return 0, errors.New(errEnqueue + err.Error())
	}
	if err := m.validate(); err != nil {
		return 0, err
	}
	if q == nil {
		return 0, errors.New(errEnqueue + "nil Querier: pass the transaction (pgx.Tx) the message must commit with")
	}
	var w *wake.State
	channel, force := "", false
	if !o.noWake {
		if w, force = o.wakes.Attempt(store.WakeChannel(id), m.Type); w != nil {
			channel = w.Channel()
		}
	}
	newID, notified, err := enqueue(ctx, q, id, m, channel, force)
	if err != nil {
		return 0, fmt.Errorf(errEnqueue+"insert a message of type %q, key %q into %s: %w", m.Type, m.Key, table, err)
	}
	if notified {
		w.NotifiedNow()
	}
	return newID, nil
}

// EnqueueOption changes what [Enqueue] does.
type EnqueueOption func(*enqueueOptions)

type enqueueOptions struct {
	noWake bool
	wakes  *wake.Windows // wake.Enqueues, or a test's own (withWakeWindows)
}

// withWakeWindows makes Enqueue keep its wake-up attempts in w instead of the
// process's: for tests that need other timings.
func withWakeWindows(w *wake.Windows) EnqueueOption {
	return func(o *enqueueOptions) { o.wakes = w }
}

// WithoutWakeUp makes [Enqueue] write the message without waking the relays:
// they find it at their next poll, within Config.Interval. A wake-up is a
// NOTIFY, and PostgreSQL commits notifying transactions one at a time; Enqueue
// already lets only one transaction at a time carry it, and a busy process at
// most one per 5ms (internal/wake), which keeps producers' commits concurrent, so this
// option is for producers that want no NOTIFY at all (bulk loads, say).
func WithoutWakeUp() EnqueueOption { return func(o *enqueueOptions) { o.noWake = true } }

// validate names the first field of m that Enqueue refuses.
func (m *Outgoing) validate() error {
	bad := func(field, format string, args ...any) error {
		return fmt.Errorf(errEnqueue+"Outgoing."+field+" "+format, args...)
	}
	switch {
	case strings.TrimSpace(m.Type) == "":
		return bad("Type", "must not be empty: it chooses the Sender that delivers the message")
	case strings.TrimSpace(m.Key) == "":
		return bad("Key", "must not be empty: it is the receiver's unit of state and order")
	case len(m.Payload) == 0:
		return bad("Payload", "must not be empty: it must be a JSON document")
	case !json.Valid(m.Payload):
		return bad("Payload", "is not valid JSON: %.80q", m.Payload)
	}
	if err := headers.Validate(m.Headers); err != nil {
		return bad("Headers", "%w", err)
	}
	return nil
}
