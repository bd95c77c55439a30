package session

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/xadm/relay/internal/lease"
	"github.com/xadm/relay/internal/relaytype"
	"github.com/xadm/relay/internal/store"
)

// This file is presence: every started relay (single key or partitioned)
// makes itself visible, for as long as its process lives, without a table
// and without writing anything. On one session it holds for its whole life
// (the wake-up listener's, wake.go, or one of its own when WakeOnCommit is
// off) it takes SHARED advisory locks, two-int keys in namespaces of their
// own, all derived from the app's name:
//
//	(hashtext('relay_presence_app'), hashtext(app))                  a replica of app
//	(hashtext('relay_presence_replica:' || app), id)                 its replica id (random, 32 bits)
//	(hashtext('relay_presence_max_attempts:' || app), MaxAttempts)   its ceiling
//	(hashtext('relay_presence_partitions:' || app), Partitions)      its Partitions
//	(hashtext('relay_presence_type:' || app), hashtext(type))        one per type it has a sender for
//	(hashtext('relay_presence_table'), hashtext(table))              its table (without the schema)
//
// pg_locks joins them to pg_stat_activity (pid, client address, application
// name, backend start): [Admin.Replicas] reads them. Shared locks conflict
// with nothing but an exclusive lock of the same two ints, which nobody
// takes; and they share no key with the election (a one-bigint key), the
// partitions (two ints led by hashtext(app || '_relay_m2m')), the key-order
// locks (led by hashtext('relay:' || table)) or the wake-up token (led by
// hashtext('relay:wake')). The statement that takes them, and the session's
// keepalive, carry a comment with the same facts in words (the type names,
// which the locks only hash): pg_stat_activity.query shows it.
//
// No statement runs per pass. A killed process's session ends with it; a
// frozen or silently cut-off one is ended by the server: the session runs
// with idle_session_timeout = presenceLease (PostgreSQL 14 and later; TCP
// keepalives before), and a keepalive touches it every presenceBeat. Stop
// lets go of the locks before it returns; a reconnected listener takes them
// again.

// Timings of presence: the lease of the election, and the keepalive of a
// session that holds locks for nothing in flight (internal/lease).
const (
	presenceBeat  = lease.IdleHeartbeat
	presenceLease = lease.Server
)

// Presence is what a relay says of itself, and the statements that say it.
type Presence struct {
	id   string // the replica id: 8 hex digits of num
	num  int32  // the replica lock's second int
	app  string
	args []any // of takePresenceSQL: app, id, MaxAttempts, Partitions, types, table
	desc Descriptor
	// marks is the comment the statements carry: desc, with the types
	// paused now (Follow), yielded (ownership.go), with Sends stuck
	// (Follow) and the last retention run (SetRetention). The next
	// statement on the session says it.
	marks atomic.Pointer[string]

	mu        sync.Mutex // the state marks says
	paused    []PausedDescriptor
	stuck     []StuckDescriptor
	retention *RetentionDescriptor
	own       *Ownership // nil: the relay claims no type (no Start)
}

// Descriptor is the comment the presence statements carry.
type Descriptor struct {
	App         string             `json:"app"`
	Table       string             `json:"table,omitempty"`
	Replica     string             `json:"replica"`
	Types       []string           `json:"types"`
	MaxAttempts int                `json:"max_attempts"`
	Partitions  int                `json:"partitions"`
	Host        string             `json:"host,omitempty"`
	Process     int                `json:"process,omitempty"`
	Since       time.Time          `json:"since"`
	Paused      []PausedDescriptor `json:"paused,omitempty"`
	// Yielded are the types it has a sender for and does not deliver:
	// another app's live relays do (ownership.go).
	Yielded []YieldDescriptor `json:"yielded,omitempty"`
	// Stuck are, per type, its abandoned Sends still running (those that
	// ignored their context), and since when the oldest runs.
	Stuck []StuckDescriptor `json:"stuck,omitempty"`
	// Retention is its last run of the retention job, when it ran one.
	Retention *RetentionDescriptor `json:"retention,omitempty"`
}

// YieldDescriptor is a type yielded to another app, as presence says it.
type YieldDescriptor struct {
	Type  string    `json:"t"`
	App   string    `json:"a"`
	Since time.Time `json:"s"`
}

// StuckDescriptor is a type's abandoned Sends still running, as presence
// says them: how many, and since when the oldest of them runs.
type StuckDescriptor struct {
	Type  string    `json:"t"`
	Sends int       `json:"n"`
	Since time.Time `json:"s"`
}

// RetentionDescriptor is the last run of the retention job on a replica.
type RetentionDescriptor struct {
	At      time.Time `json:"at"`           // when it ended
	Deleted int64     `json:"n"`            // SENT rows it deleted
	Err     string    `json:"e,omitempty"`  // why it failed, cut
	Age     string    `json:"age"`          // the retention
	Took    string    `json:"d,omitempty"`  // how long it ran
	Total   int64     `json:"tn,omitempty"` // rows deleted by this replica since it started
}

// PausedDescriptor is a paused type as presence says it, in few bytes.
type PausedDescriptor struct {
	Type    string    `json:"t"`
	Reason  string    `json:"r,omitempty"`
	Since   time.Time `json:"s"`
	Until   time.Time `json:"u"`
	Probing bool      `json:"p,omitempty"`
}

// presenceCommentMax is the most bytes of comment that paused types may grow
// the presence statements to: track_activity_query_size (1024 by default)
// cuts a longer query, and Admin could then read no name.
const presenceCommentMax = 800

// pausedReasonMax is how much of a pause's reason presence says.
const pausedReasonMax = 80

// presenceMarkPrefix starts the presence statements' comment.
const presenceMarkPrefix = "/* relay presence "

// NewPresence is the presence of a relay of app on table with ceiling
// maxAttempts, partitions and types, under a replica id drawn now.
func NewPresence(app, table string, maxAttempts, partitions int, types []string) *Presence {
	var b [4]byte
	_, _ = rand.Read(b[:])
	num := int32(binary.BigEndian.Uint32(b[:]))
	p := &Presence{id: ReplicaID(num), num: num, app: app}
	p.args = []any{app, num, maxAttempts, max(partitions, 1), types, TableName(table)}
	host, _ := os.Hostname()
	p.desc = Descriptor{App: app, Table: table, Replica: p.id, Types: types, MaxAttempts: maxAttempts,
		Partitions: max(partitions, 1), Host: host, Process: os.Getpid(), Since: time.Now().UTC().Truncate(time.Second)}
	p.setPaused(nil)
	return p
}

// TableName is table without its schema, as presence's table key hashes it:
// two tables of one name in two schemas look the same, which only makes an
// Admin more careful.
func TableName(table string) string {
	_, name, found := strings.Cut(table, ".")
	if !found {
		return table
	}
	return name
}

// ID is the replica's id: 8 hex digits.
func (p *Presence) ID() string { return p.id }

// Args are the presence keys' arguments: app, replica, MaxAttempts,
// Partitions, types, table.
func (p *Presence) Args() []any { return p.args }

// Mark is the comment the presence statements carry now.
func (p *Presence) Mark() string { return *p.marks.Load() }

// Lanes are what presence says of a pass's lanes (internal/pass's Lanes):
// the types paused now, and those with abandoned Sends still running.
type Lanes interface {
	Paused() []relaytype.PausedType
	Stuck() []relaytype.StuckSends
}

// Follow returns what the lanes' OnChange calls, from the goroutine that saw
// the change: it makes the statements say l's paused types and stuck Sends
// as they are now. The relay wires it once, in New.
func (p *Presence) Follow(l Lanes) func() {
	return func() {
		var paused []PausedDescriptor
		for _, pt := range l.Paused() {
			paused = append(paused, PausedDescriptor{Type: pt.Type, Reason: pt.Reason, Since: pt.Since, Until: pt.Until, Probing: pt.Probing})
		}
		p.setPaused(paused)
		var stuck []StuckDescriptor
		for _, s := range l.Stuck() {
			stuck = append(stuck, StuckDescriptor{Type: s.Type, Sends: s.Sends, Since: s.Since})
		}
		p.setStuck(stuck)
	}
}

// setPaused makes the statements say the types paused now, with as much of
// their reasons as fits presenceCommentMax (then only their names).
// The descriptors come as the lanes say them: Since and Until are rounded,
// and the reasons clipped, here.
func (p *Presence) setPaused(paused []PausedDescriptor) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.paused = paused
	p.remark()
}

// setStuck makes the statements say the types whose abandoned Sends still
// run, how many and since when.
func (p *Presence) setStuck(stuck []StuckDescriptor) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stuck = stuck
	p.remark()
}

// SetRetention makes the statements say the last run of the retention job.
func (p *Presence) SetRetention(r *RetentionDescriptor) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.retention = r
	p.remark()
}

// SetOwnership makes the relay claim its types on the presence session
// (ownership.go), and the statements say the types it yields.
func (p *Presence) SetOwnership(o *Ownership) {
	p.mu.Lock()
	p.own = o
	p.mu.Unlock()
	o.OnChange(func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		p.remark()
	})
}

// Ownership is the relay's claim on its types; nil without one.
func (p *Presence) Ownership() *Ownership {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.own
}

// remark builds the comment the statements carry from the state (p.mu held).
func (p *Presence) remark() {
	d := p.desc
	for _, y := range p.own.Yielded() {
		d.Yielded = append(d.Yielded, YieldDescriptor{Type: y.Type, App: clip(y.App, pausedReasonMax), Since: y.Since.UTC().Truncate(time.Second)})
	}
	d.Stuck, d.Retention = p.stuck, p.retention
	paused := p.paused
	base := len(presenceComment(d))
	for _, withReason := range []bool{true, false} {
		d.Paused = nil
		for _, pt := range paused {
			pd := PausedDescriptor{Type: pt.Type, Since: pt.Since.UTC().Truncate(time.Second),
				Until: pt.Until.UTC().Truncate(time.Second), Probing: pt.Probing}
			if withReason {
				pd.Reason = clip(pt.Reason, pausedReasonMax)
			}
			d.Paused = append(d.Paused, pd)
		}
		if m := presenceComment(d); len(m)-base <= presenceCommentMax || !withReason {
			p.marks.Store(&m)
			return
		}
	}
}

// clip makes s valid UTF-8 without NUL bytes, cut to at most width
// characters: what a comment may say of a text of the adopter's.
func clip(s string, width int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	s = strings.ReplaceAll(s, "\x00", "")
	n := 0
	for i := range s {
		if n == width {
			return s[:i]
		}
		n++
	}
	return s
}

// ReplicaID is the id of the replica whose lock's second int is num.
func ReplicaID(num int32) string { return fmt.Sprintf("%08x", uint32(num)) }

// presenceComment writes d as a comment that cannot end early: JSON with
// every "/" escaped, so neither "*/" nor a nested "/*" appears in it.
func presenceComment(d Descriptor) string {
	b, _ := json.Marshal(d)
	return presenceMarkPrefix + strings.ReplaceAll(string(b), "/", `\/`) + " */ "
}

// ParseComment reads a presence statement's descriptor back; false
// when query is not one, or was cut (track_activity_query_size).
func ParseComment(query string) (Descriptor, bool) {
	rest, ok := strings.CutPrefix(query, presenceMarkPrefix)
	if !ok {
		return Descriptor{}, false
	}
	body, _, ok := strings.Cut(rest, " */")
	if !ok {
		return Descriptor{}, false
	}
	var d Descriptor
	if err := json.Unmarshal([]byte(body), &d); err != nil {
		return Descriptor{}, false
	}
	return d, true
}

// MarkedReplica reports whether query is a presence statement, as the relay's
// own session runs them (its idle poll among them), and the replica it names:
// "" when the comment was cut (track_activity_query_size).
func MarkedReplica(query string) (replica string, ok bool) {
	if !strings.HasPrefix(query, presenceMarkPrefix) {
		return "", false
	}
	d, _ := ParseComment(query)
	return d.Replica, true
}

// Take takes the presence locks on conn, a session of this relay's own, and
// returns its backend's pid. With an Ownership, it then claims the relay's
// types on the session (ownership.go); a claim that fails is logged, and
// tried again claimEvery later (Reclaim), the relay keeping its last
// decision meanwhile.
func (p *Presence) Take(ctx context.Context, conn *pgx.Conn) (uint32, error) {
	pid, ok, err := store.PresenceTakeStatement(ctx, conn, p.Mark(), p.args, presenceLease)
	if err != nil {
		return 0, fmt.Errorf("relay: take the presence locks: %w", err)
	}
	if !ok {
		return pid, errors.New("relay: take the presence locks: an exclusive lock of a presence key is held elsewhere")
	}
	if own := p.Ownership(); own != nil {
		if err := own.claim(ctx, conn, pid, p.Mark(), true); err != nil {
			if ctx.Err() != nil || conn.IsClosed() {
				return pid, err
			}
			own.logger.LogAttrs(ctx, slog.LevelError, "relay: could not claim this relay's types; it keeps its last decision and tries again",
				slog.String("error", err.Error()))
		}
	}
	return pid, nil
}

// Reclaim claims the relay's types again on conn, backend pid, when a claim
// is due (a type yielded, or the last claim failed), and then says the
// relay's state on the session (its keepalive). It reports whether it ran.
func (p *Presence) Reclaim(ctx context.Context, conn *pgx.Conn, pid uint32) (bool, error) {
	own := p.Ownership()
	if own == nil || !own.due() {
		return false, nil
	}
	if err := own.claim(ctx, conn, pid, p.Mark(), false); err != nil {
		if ctx.Err() != nil || conn.IsClosed() {
			return true, err
		}
		own.logger.LogAttrs(ctx, slog.LevelError, "relay: could not claim this relay's types; it keeps its last decision and tries again",
			slog.String("error", err.Error()))
	}
	return true, p.Beat(ctx, conn, pid)
}

// ErrPresenceMoved says the presence session answered from another backend
// than the one that took the locks: a transaction-pooling proxy.
var ErrPresenceMoved = errors.New("relay: the presence session answers from another backend than the one holding its locks " +
	"(a transaction-pooling proxy sits between the relay and PostgreSQL; session advisory locks need session pooling)")

// Beat is the keepalive of the presence session: it keeps the session within
// its idle_session_timeout and checks it still is backend pid.
func (p *Presence) Beat(ctx context.Context, conn *pgx.Conn, pid uint32) error {
	bctx, cancel := context.WithTimeout(ctx, lease.HeartbeatTimeout)
	defer cancel()
	got, err := store.PresenceBeatStatement(bctx, conn, p.Mark())
	if err != nil {
		return fmt.Errorf("relay: presence keepalive: %w", err)
	}
	if got != pid {
		return ErrPresenceMoved
	}
	return nil
}

// Release lets go of the presence locks on conn, backend pid, before it is
// closed, so that they are gone when Stop returns (closing alone frees them a
// moment later). It lets go of those locks only, and only on pid: see
// presenceRelease in sql/presence.sql. It reports whether it did.
func (p *Presence) Release(conn *pgx.Conn, pid uint32) bool {
	ctx, cancel := context.WithTimeout(context.Background(), UnlockTimeout)
	defer cancel()
	released, _ := store.PresenceReleaseStatement(ctx, conn, p.args, pid)
	if own := p.Ownership(); own != nil && released {
		own.release(ctx, conn, pid) // the session answers: its delivers keys too
	}
	return released
}

// Leave lets go of the presence on conn, backend pid, whose session ended
// for why: by its release when the session still answers, or else (a
// statement on it was cut short, by Stop say, which closed it) by gone, so
// that Stop does not return with the replica still listed, nor is it listed
// twice after a reconnection. Not when the session moved: then a pooler's
// server connection holds the locks, whose pid is no guide.
func (p *Presence) Leave(conn *pgx.Conn, pool *pgxpool.Pool, pid uint32, why error) error {
	if !conn.IsClosed() && p.Release(conn, pid) || errors.Is(why, ErrPresenceMoved) {
		return nil
	}
	return p.Gone(pool, pid)
}

// Gone returns once backend pid, whose session was closed without its
// release answered, holds no lock of this replica's presence: it ends the
// backend if it still holds it (one in a statement notices its client has
// gone only at the statement's end), and waits for its exit, within
// guardSessionEndTimeout.
func (p *Presence) Gone(pool *pgxpool.Pool, pid uint32) error {
	ctx, cancel := context.WithTimeout(context.Background(), guardSessionEndTimeout)
	defer cancel()
	if err := store.PresenceStrandedStatement(ctx, pool, p.app, p.num, pid); err != nil {
		return fmt.Errorf("relay: end the presence session, backend %d: %w", pid, err)
	}
	return WaitLockGone(ctx, pool, pid)
}
