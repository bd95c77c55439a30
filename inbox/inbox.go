package inbox

import (
	"cmp"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/xadm/relay"
	"github.com/xadm/relay/internal/signing"
)

// Defaults and bounds of [Config] and [Message].
const (
	// TableDefault is the default of [Config.Table].
	TableDefault = "relay_inbox"
	// MaxBodyDefault is the default of [Config.MaxBody]: 1 MiB.
	MaxBodyDefault = 1 << 20
	// MaxIdempotencyKey is the longest [Message.IdempotencyKey], in bytes. The
	// relay's own are at most 148: a schema, a table, a "/" and an id.
	MaxIdempotencyKey = 255
	// MaxKey is the longest [Message.Key], in bytes, that the inbox keeps a
	// last applied id for, well within what a PostgreSQL index entry holds.
	MaxKey = 1024
	// SignatureToleranceDefault is the default of [Config.SignatureTolerance].
	SignatureToleranceDefault = signing.ToleranceDefault
)

// Config configures an [Inbox]. Its zero value is ready to use: every field
// has a default.
type Config struct {
	// Table is the inbox's table, optionally schema-qualified
	// ("receiver.relay_inbox"): one row per message received. The last
	// applied id of each key lives beside it, in the table of the same
	// schema named Table + "_keys". Each part is an identifier of letters,
	// digits and underscores, quoted in SQL, so case-sensitive. [CreateTable]
	// creates both. Defaults to "relay_inbox" ([TableDefault]).
	Table string

	// KeepStale turns the stale-drop off: every message not received before
	// is applied, whatever its Relay-Message-Id. It suits a receiver that
	// applies each message as a change (appends an event, adds to a balance),
	// for which a dead message an operator re-queued after later messages of
	// its key is new. Defaults to false: a message whose id is not above the
	// last one applied for its key is answered as applied ([Stale]) without
	// calling apply, which suits a receiver that stores each key's state.
	KeepStale bool

	// MaxBody is the largest request body, in bytes, that [Inbox.Handler]
	// reads; a longer one is answered 413. Defaults to 1 MiB ([MaxBodyDefault]).
	MaxBody int64

	// SigningSecrets turn on the verification of [Inbox.Handler]'s requests
	// by the Standard Webhooks scheme, which the relay's HTTPSender signs
	// with (relay.HTTPSenderConfig.SigningSecrets): a request is applied
	// only when its Webhook-Signature holds a signature of its Webhook-Id,
	// Webhook-Timestamp and body by one of these keys, its Webhook-Id is its
	// Idempotency-Key, and its timestamp is within SignatureTolerance;
	// anything else is answered 401, naming which check failed, and nothing
	// is applied or recorded. Each is a "whsec_" secret (HMAC-SHA256, the
	// sender's secret itself) or a "whpk_" Ed25519 public key (of the
	// sender's whsk_ private key). Configure the old and the new one during
	// a rotation. New refuses a malformed one, naming its index, never its
	// value. Defaults to none: the Handler verifies nothing, and the
	// middleware around it must authenticate its requests.
	SigningSecrets []string

	// SignatureTolerance is how far a signed request's Webhook-Timestamp may
	// be from the receiver's clock, either way: a request older than that
	// (a replay, or one the sender's clock put behind) is answered 401. Only
	// with SigningSecrets. Defaults to 5 minutes
	// ([SignatureToleranceDefault]).
	SignatureTolerance time.Duration

	// Logger receives the inbox's logs: a panic in apply, and the causes of
	// the Handler's 5xx answers. Defaults to [slog.Default].
	Logger *slog.Logger
}

// Inbox receives the relay's messages into a PostgreSQL database: for each
// one, in one transaction, it records the message's idempotency key, checks
// its key's last applied id, and calls the receiver's apply function with that
// transaction. Build it with [New]; it is safe for concurrent use.
type Inbox struct {
	pool      *pgxpool.Pool
	table     string // as configured, for messages
	keepStale bool
	maxBody   int64
	logger    *slog.Logger
	sql       statements
	verifier  *signing.Verifier // nil: the Handler verifies no signature
	unsigned  sync.Once         // says once that the Handler verifies nothing
}

// New returns an [Inbox] on pool, configured by cfg, or an error naming the
// field it refuses. It does not touch the database: create the tables with
// [CreateTable] or [SchemaSQL] first.
func New(pool *pgxpool.Pool, cfg Config) (*Inbox, error) {
	if pool == nil {
		return nil, errors.New("inbox: New: pool is nil")
	}
	table := cmp.Or(cfg.Table, TableDefault)
	names, err := tableNames(table)
	if err != nil {
		return nil, fmt.Errorf("inbox: Config.Table: %w", err)
	}
	if cfg.MaxBody < 0 {
		return nil, fmt.Errorf("inbox: Config.MaxBody must not be negative (0 means %d), got %d", MaxBodyDefault, cfg.MaxBody)
	}
	if cfg.SignatureTolerance < 0 {
		return nil, fmt.Errorf("inbox: Config.SignatureTolerance must not be negative (0 means %s), got %s", SignatureToleranceDefault, cfg.SignatureTolerance)
	}
	if cfg.SignatureTolerance != 0 && len(cfg.SigningSecrets) == 0 {
		return nil, errors.New("inbox: Config.SignatureTolerance is set without SigningSecrets: nothing would be verified")
	}
	verifier, err := signing.NewVerifier("inbox: Config.SigningSecrets", cfg.SigningSecrets, cfg.SignatureTolerance)
	if err != nil {
		return nil, err
	}
	return &Inbox{
		verifier:  verifier,
		pool:      pool,
		table:     table,
		keepStale: cfg.KeepStale,
		maxBody:   cmp.Or(cfg.MaxBody, MaxBodyDefault),
		logger:    cmp.Or(cfg.Logger, slog.Default()),
		sql:       newStatements(names),
	}, nil
}

// Message is one message as the receiver got it: from an HTTP request's
// headers and body ([Inbox.Handler]), a Kafka record or a JetStream message
// (the kafka and natsjs modules' Receive).
type Message struct {
	// IdempotencyKey names this one message: the same on every delivery of
	// it, different for every other message ([relay.Message.IdempotencyKey],
	// "public.mensagem_m2m/42"). Required; at most 255 bytes
	// ([MaxIdempotencyKey]) of UTF-8 without control characters.
	IdempotencyKey string
	// ID is the message's Relay-Message-Id, the outbox row's id: it grows
	// with each message of a key. Required; positive.
	ID int64
	// Key is the natural key (Relay-Message-Key): the unit of the stale-drop.
	// Empty is a key like any other. At most 1024 bytes ([MaxKey]) of UTF-8
	// without NUL, unless [Config.KeepStale] is set.
	Key string
	// Type is the message type (Relay-Message-Type), for apply.
	Type string
	// Attempt is the relay's attempt (Relay-Attempt), from 1, for logs; 0
	// when absent. It is no deduplication key.
	Attempt int
	// Body is the payload, verbatim.
	Body []byte
}

// source returns the outbox table the message came from: the part of its
// idempotency key before the last "/", "" when there is none. Ids order the
// messages of one table, so the stale-drop compares ids per source and key.
func (m *Message) source() string {
	if i := strings.LastIndexByte(m.IdempotencyKey, '/'); i >= 0 {
		return m.IdempotencyKey[:i]
	}
	return ""
}

// ApplyFunc applies one message in tx, the inbox's transaction in the
// receiver's database: it writes the message's effects through tx and must
// neither commit nor roll it back. A nil error commits the effects with the
// message's record; an error rolls both back. An error wrapped with
// [relay.Permanent] says the message can never be applied (the HTTP answer is
// 422, and the relay marks the row dead); any other error is retried later
// (503). A panic is recovered, logged and retried like an error.
type ApplyFunc func(ctx context.Context, tx pgx.Tx, m Message) error

// Outcome is what [Inbox.Receive] made of a message.
type Outcome int

// The outcomes of a message received without error. The zero Outcome is none
// of them.
const (
	// Applied: apply ran and its effects committed with the message's record.
	Applied Outcome = iota + 1
	// Duplicate: the message's idempotency key was recorded already, with
	// the same body. apply did not run.
	Duplicate
	// Stale: a message of the same key with a higher id was applied already.
	// apply did not run; the message's record committed.
	Stale
)

// String returns "applied", "duplicate" or "stale".
func (o Outcome) String() string {
	switch o {
	case Applied:
		return "applied"
	case Duplicate:
		return "duplicate"
	case Stale:
		return "stale"
	}
	return "Outcome(" + strconv.Itoa(int(o)) + ")"
}

// ErrBodyMismatch is the cause of the error [Inbox.Receive] returns for a
// message whose idempotency key was recorded with another body: a row's
// payload edited after a delivery, or a key reused by another sender. The
// error is [relay.Permanent]; the HTTP answer is 422, as the IETF
// Idempotency-Key draft asks. Nothing is applied.
var ErrBodyMismatch = errors.New("the idempotency key was received before with another body")

// Receive receives m in one transaction of the inbox's pool: it records m's
// idempotency key and, unless [Config.KeepStale], checks m's id against the
// last one applied for its key (one statement for both, sent with the BEGIN),
// then calls apply with the transaction and commits.
//
// A duplicate (the key recorded already, with the same body) returns
// [Duplicate] and a stale message returns [Stale]: apply is not called, and
// the answer to the sender is success. Otherwise it returns [Applied] once the
// transaction committed.
//
// An error means nothing was applied, unless the commit's own answer was lost
// (then a re-delivery is a duplicate). It is [relay.Permanent] when m can never
// be applied: a field of m the inbox refuses, [ErrBodyMismatch], or apply's
// permanent error. Any other error (the database away, apply's error, ctx
// ended) is worth retrying.
func (ib *Inbox) Receive(ctx context.Context, m Message, apply ApplyFunc) (Outcome, error) {
	if err := ib.check(&m); err != nil {
		return 0, relay.Permanent(err)
	}
	if apply == nil {
		return 0, relay.Permanent(errors.New("inbox: Receive: apply is nil"))
	}
	hash := sha256.Sum256(m.Body)
	pooled, err := ib.pool.Acquire(ctx)
	if err != nil {
		return 0, fmt.Errorf("inbox: message %s: acquire a connection: %w", m.IdempotencyKey, err)
	}
	// Release closes the connection instead when its transaction is still
	// open: a rollback that failed or was not sent.
	defer pooled.Release()
	conn := pooled.Conn()
	open := true
	defer func() {
		if open && ctx.Err() == nil {
			_, _ = conn.Exec(ctx, "rollback")
		}
	}()

	seen, newest, err := ib.begin(ctx, conn, &m, hash[:])
	if err != nil {
		return 0, fmt.Errorf("inbox: message %s: begin and record: %w", m.IdempotencyKey, err)
	}
	if !seen {
		return ib.duplicate(ctx, conn, &m, hash[:])
	}
	if newest {
		if err := ib.apply(ctx, &tx{conn: conn}, m, apply); err != nil {
			return 0, fmt.Errorf("inbox: message %s: apply: %w", m.IdempotencyKey, err) // a permanent mark stays readable
		}
	}
	// A stale message's record commits too: a replay is then a duplicate,
	// and one with another body a mismatch.
	open = false
	if err := commit(ctx, conn); err != nil {
		return 0, fmt.Errorf("inbox: message %s: commit: %w", m.IdempotencyKey, err)
	}
	if !newest {
		return Stale, nil
	}
	return Applied, nil
}

// begin begins a transaction on conn and runs the statement that records m
// and checks its key, in one round trip: seen is false for a key recorded
// before, newest false for a stale message.
func (ib *Inbox) begin(ctx context.Context, conn *pgx.Conn, m *Message, hash []byte) (seen, newest bool, err error) {
	var b pgx.Batch
	b.Queue("begin")
	if ib.keepStale {
		newest = true
		b.Queue(ib.sql.record, m.IdempotencyKey, hash).Exec(func(tag pgconn.CommandTag) error {
			seen = tag.RowsAffected() == 1
			return nil
		})
	} else {
		b.Queue(ib.sql.recordNewest, m.IdempotencyKey, hash, m.source(), m.Key, m.ID).QueryRow(func(row pgx.Row) error {
			return row.Scan(&seen, &newest)
		})
	}
	err = conn.SendBatch(ctx, &b).Close()
	return seen, newest, err
}

// commit commits conn's transaction; pgx.ErrTxCommitRollback when the server
// rolled it back instead (a statement of apply failed and apply returned nil).
func commit(ctx context.Context, conn *pgx.Conn) error {
	tag, err := conn.Exec(ctx, "commit")
	if err == nil && tag.String() == "ROLLBACK" {
		err = pgx.ErrTxCommitRollback
	}
	return err
}

// duplicate answers a message whose key was recorded before: [Duplicate] if
// the body is the one recorded, [ErrBodyMismatch] otherwise. The record is
// read by a statement of its own, whose snapshot sees a record that a
// concurrent delivery committed while the claim waited for it.
func (ib *Inbox) duplicate(ctx context.Context, conn *pgx.Conn, m *Message, hash []byte) (Outcome, error) {
	var stored []byte
	err := conn.QueryRow(ctx, ib.sql.bodyHash, m.IdempotencyKey).Scan(&stored)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return Duplicate, nil // purged since: nothing left to compare
	case err != nil:
		return 0, fmt.Errorf("inbox: message %s: read its record: %w", m.IdempotencyKey, err)
	case string(stored) != string(hash):
		return 0, relay.Permanent(fmt.Errorf("inbox: message %s: %w", m.IdempotencyKey, ErrBodyMismatch))
	}
	return Duplicate, nil
}

// apply calls the receiver's apply under a recover that logs a panic.
func (ib *Inbox) apply(ctx context.Context, t pgx.Tx, m Message, apply ApplyFunc) (err error) {
	defer func() {
		if p := recover(); p != nil {
			ib.logger.LogAttrs(ctx, slog.LevelError, "inbox: apply panicked",
				slog.String("idempotency_key", m.IdempotencyKey), slog.Any("panic", p),
				slog.String("stack", string(debug.Stack())))
			err = fmt.Errorf("panic: %v", p)
		}
	}()
	return apply(ctx, t, m)
}

// check refuses a message the inbox cannot record, naming the field.
func (ib *Inbox) check(m *Message) error {
	switch k := m.IdempotencyKey; {
	case k == "":
		return errors.New("inbox: Message.IdempotencyKey is empty")
	case len(k) > MaxIdempotencyKey:
		return fmt.Errorf("inbox: Message.IdempotencyKey is %d bytes long, over the limit of %d", len(k), MaxIdempotencyKey)
	case !printable(k):
		return fmt.Errorf("inbox: Message.IdempotencyKey %q is not UTF-8 without control characters", k)
	}
	if m.ID <= 0 {
		return fmt.Errorf("inbox: Message.ID must be positive, got %d", m.ID)
	}
	if ib.keepStale {
		return nil
	}
	switch {
	case len(m.Key) > MaxKey:
		return fmt.Errorf("inbox: Message.Key is %d bytes long, over the limit of %d", len(m.Key), MaxKey)
	case !utf8.ValidString(m.Key) || strings.IndexByte(m.Key, 0) >= 0:
		return fmt.Errorf("inbox: Message.Key %q is not UTF-8 without NUL", m.Key)
	}
	return nil
}

// printable reports whether s is valid UTF-8 without control characters.
func printable(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if unicode.IsControl(r) {
			return false
		}
	}
	return true
}
