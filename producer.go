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

// Querier is what [Enqueue] and [EnqueueMany] write through: pgx.Tx (as
// pool.Begin returns it), *pgxpool.Pool, *pgxpool.Conn and *pgx.Conn satisfy
// it; [FromSQL] makes one of a database/sql *sql.Tx, *sql.DB or *sql.Conn.
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

// errEnqueue prefixes the errors of Enqueue and EnqueueMany.
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
		return 0, fmt.Errorf(errEnqueue+"%w", err)
	}
	if q == nil {
		return 0, errNilQuerier
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

// errNilQuerier is what Enqueue and EnqueueMany return for a nil Querier.
var errNilQuerier = errors.New(errEnqueue + "nil Querier: pass the transaction the message must commit with " +
	"(a pgx.Tx, or relay.FromSQL(tx) for a database/sql *sql.Tx)")

// The bounds of one [EnqueueMany], checked before it sends anything: past
// either, it returns an error, writes nothing and leaves the transaction as
// it was, so that the caller can write the messages in several calls.
const (
	// EnqueueManyMax is the most messages one EnqueueMany writes: 10,000.
	//
	// The server bounds a call too: each distinct key of a call takes one
	// lock of the server's lock table until the transaction ends, and that
	// table, shared by every session, is sized by max_locks_per_transaction
	// × max_connections (and a few more backends): measured, some 12,800
	// locks with PostgreSQL 15's defaults, 64 and 100. Calls whose
	// transactions together hold more fail with "out of shared memory"
	// (SQLSTATE 53200), which aborts their transactions: nothing of them is
	// written. Several producers writing thousands of distinct keys at once
	// need max_locks_per_transaction raised (docs/operations.md).
	EnqueueManyMax = 10_000
	// EnqueueManyBytesMax is the most bytes of types, keys, payloads and
	// headers (names and values) one EnqueueMany writes: 64 MiB. The
	// statement carries them as a handful of parameters, and PostgreSQL
	// takes at most 1 GiB in one; far below that, a batch this large is
	// better split for the memory it holds on both sides.
	EnqueueManyBytesMax = 64 << 20
)

// EnqueueMany writes ms, in their order, as PENDING outbound rows of table
// through q in one statement (one round trip), and returns their ids in
// the same order. It is [Enqueue] for many messages: the same table, the
// same checks, the same order locks and the same wake-up, and what Enqueue
// says of the transaction holds here: pass the caller's pgx.Tx (or
// [FromSQL] of its *sql.Tx), and the messages commit or roll back with the
// business write. Through a pool they commit at once, all or none.
//
// Before it sends anything, EnqueueMany checks table, every message as
// Enqueue checks one (the error names the message's index and the field:
// "messages[3]: Outgoing.Key must not be empty ..."), and the bounds
// [EnqueueManyMax] and [EnqueueManyBytesMax]; on any error nothing is
// written: a refused batch sends nothing, and a statement the server
// refuses writes no row of it. An empty ms writes nothing and returns no ids.
//
// The statement first takes the order lock of every distinct key of ms,
// sorted by the locks' own numbers, before it draws any id: two batches that
// share keys take their common locks in the same order and never deadlock
// each other, and a key's ids follow the order in which the transactions
// that wrote it committed, as with Enqueue. Within ms, a key's messages get
// increasing ids in their order in ms, and are delivered in that order. A
// transaction that also writes keys by other calls (Enqueue, a second
// EnqueueMany) holds their locks in the order of its calls: two such
// transactions can deadlock each other, as with any row locks, and
// PostgreSQL aborts one (SQLSTATE 40P01).
//
// The wake-up is one per statement: the statement tries the wake-up token
// once, as Enqueue does, and when it notifies, it notifies each type of ms
// once; [WithoutWakeUp] turns it off.
func EnqueueMany(ctx context.Context, q Querier, table string, ms []Outgoing, opts ...EnqueueOption) ([]int64, error) {
	o := enqueueOptions{wakes: wake.Enqueues}
	for _, opt := range opts {
		if opt != nil {
			opt(&o)
		}
	}
	id, err := store.ParseTable(table)
	if err != nil {
		return nil, errors.New(errEnqueue + err.Error())
	}
	if len(ms) > EnqueueManyMax {
		return nil, fmt.Errorf(errEnqueue+"%d messages, more than EnqueueManyMax (%d): write them in several calls "+
			"(in one transaction, if they must commit together)", len(ms), EnqueueManyMax)
	}
	size := 0
	for i := range ms {
		if err := ms[i].validate(); err != nil {
			return nil, fmt.Errorf(errEnqueue+"messages[%d]: %w", i, err)
		}
		size += ms[i].size()
	}
	if size > EnqueueManyBytesMax {
		return nil, fmt.Errorf(errEnqueue+"%d messages of %d bytes (types, keys, payloads and headers), more than EnqueueManyBytesMax (%d): "+
			"write them in several calls (in one transaction, if they must commit together)", len(ms), size, EnqueueManyBytesMax)
	}
	if q == nil {
		return nil, errNilQuerier
	}
	if len(ms) == 0 {
		return nil, nil
	}
	var woken []*wake.State // the attempts of the types that try the wake-up
	var wakeTypes []string
	force := false
	if !o.noWake {
		channel := store.WakeChannel(id)
		for _, typ := range distinctTypes(ms) {
			if w, f := o.wakes.Attempt(channel, typ); w != nil {
				woken, wakeTypes, force = append(woken, w), append(wakeTypes, typ), force || f
			}
		}
	}
	ids, notified, err := enqueueMany(ctx, q, id, ms, wakeTypes, force)
	if err != nil {
		return nil, fmt.Errorf(errEnqueue+"insert %d messages into %s: %w", len(ms), table, err)
	}
	if notified {
		for _, w := range woken {
			w.NotifiedNow()
		}
	}
	return ids, nil
}

// distinctTypes are the types of ms, each once, in the order they first
// appear.
func distinctTypes(ms []Outgoing) []string {
	types := []string{ms[0].Type}
	var seen map[string]bool // only once a second type shows
	for i := 1; i < len(ms); i++ {
		t := ms[i].Type
		if t == ms[i-1].Type {
			continue
		}
		if seen == nil {
			seen = map[string]bool{types[0]: true}
		}
		if !seen[t] {
			seen[t] = true
			types = append(types, t)
		}
	}
	return types
}

// EnqueueOption changes what [Enqueue] and [EnqueueMany] do.
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

// WithoutWakeUp makes [Enqueue] (or [EnqueueMany]) write without waking the relays:
// they find it at their next poll, within Config.Interval. A wake-up is a
// NOTIFY, and PostgreSQL commits notifying transactions one at a time; Enqueue
// already lets only one transaction at a time carry it, and a busy process at
// most one per 5ms (internal/wake), which keeps producers' commits concurrent, so this
// option is for producers that want no NOTIFY at all (bulk loads, say).
func WithoutWakeUp() EnqueueOption { return func(o *enqueueOptions) { o.noWake = true } }

// validate names the first field of m that Enqueue refuses; the caller
// says which call and which message.
func (m *Outgoing) validate() error {
	bad := func(field, format string, args ...any) error {
		return fmt.Errorf("Outgoing."+field+" "+format, args...)
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

// size is the bytes of m that EnqueueManyBytesMax counts.
func (m *Outgoing) size() int {
	n := len(m.Type) + len(m.Key) + len(m.Payload)
	for name, value := range m.Headers {
		n += len(name) + len(value)
	}
	return n
}
