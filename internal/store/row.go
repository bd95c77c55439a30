package store

import (
	"time"

	"github.com/jackc/pgx/v5/pgtype"
)

// Row statuses.
const (
	StatusPending = "PENDING"
	StatusError   = "ERROR"
	StatusSent    = "SENT"
)

// Row is one outbound row as a pass read it: the message's columns, the
// state that fences its outcome, exactly as read (NULLs included), and, for a
// row that cannot be delivered, why.
type Row struct {
	ID        int64
	Type      string
	Key       string
	Payload   []byte
	Attempts  int       // failed attempts before this one (a NULL read as 0)
	CreatedAt time.Time // zero when NULL
	Headers   map[string]string
	Source    string // the schema-qualified table, which names the message with its id

	Status       pgtype.Text // as read; not Valid: NULL (read as PENDING)
	ReadAttempts pgtype.Int8 // as read; not Valid: NULL (read as 0)

	Bad   string // the column that makes the row undeliverable, and how; "" if none
	Size  int    // payload bytes; for a row fetched without its payload, what it will take
	Large bool   // its payload is loaded apart, after the batch, within the batch's bytes
	Held  Held   // an older live row of its key is missing from the batch: it is not sent
	Lane  int    // the pass's lane of its type, set when the pass plans it
}

// Held says why a row of a batch is not sent: an older live row of its key,
// of the relay's types, is missing from the batch (sql/pass.sql, held).
type Held int8

const (
	NotHeld Held = iota
	// HeldAgain: a select from the start finds the older row with it.
	HeldAgain
	// HeldLater: the older row waits out its backoff, or is of a type that
	// cannot send in this pass: the key waits past the pass.
	HeldLater
)

// Batch is one select's answer.
type Batch struct {
	Rows     []Row
	Full     bool      // some lane had more rows than the select took, or it was cut short by the byte bound: more may wait
	Cut      bool      // the select was cut short by the byte bound, before its limit
	More     []string  // the types whose lanes had more rows than the select took (sorted)
	Epoch    int64     // the highest id when the epoch began (a select that starts one only)
	ReadOnly bool      // the server cannot record an outcome: send nothing (preflight only)
	Now      time.Time // the database's clock at the select (preflight only)

	HeadersAdded bool // the table has the headers column, which the select did not read (preflight only)
}

// Update is one row's fenced update, a message's outcome as the table
// records it: the fence (the row's state as read) and what to write.
type Update struct {
	ID           int64
	Status       pgtype.Text // as read
	ReadAttempts pgtype.Int8 // as read
	Sent         bool
	NewAttempts  int64  // the attempts column to write
	LastError    string // a failure's text, as last_error keeps it
}

// State is a row's (status, attempts) as the table holds it now.
type State struct {
	Status   *string
	Attempts *int64
}
