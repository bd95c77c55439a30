package relay

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/xadm/relay/internal/store"
)

// PurgeChunk is how many SENT rows one statement of [Admin.PurgeSent] deletes
// at most, so that a purge of a long history never holds many locks for long.
const PurgeChunk = 1000

// Admin operates one outbox table while relays deliver from it: it counts rows,
// lists and re-queues dead ones, and purges the SENT history. Build it with
// [NewAdmin].
//
// It takes the relay's [Config], not a table name and a number, because a row
// is dead only relative to the relays' ceiling (ERROR with attempts at or above
// [Config.MaxAttempts]): an Admin built from the same Config as the relays,
// typically [ConfigFromEnv], cannot disagree with them about which rows are
// dead, and so never re-queues a row a relay may still be retrying.
//
// Every method is safe to run while any number of replicas deliver: each is
// one statement ([Admin.PurgeSent] one per chunk), and none writes a live row
// (PENDING, or ERROR below the ceiling), which is all a pass reads. Re-queue
// writes only rows that are dead at the moment of its statement, and purge only
// SENT rows, which no pass touches again. An Admin is safe for concurrent use.
//
// It writes only its app's rows ([Admin.Scope]): never those of a type that
// another app's live relays serve, and nothing at all while it cannot tell
// its app's types.
type Admin struct {
	pool        *pgxpool.Pool
	app         string
	key         string // the app's election key
	table       string
	maxAttempts int
	backoff     time.Duration // Config.RetryBackoff: when a failed row is retried
	repo        *adminRepository
	repoQueued  *adminRepository // repo, for a table with the requeued_at column
	queued      atomic.Bool      // the table was seen with its requeued_at column
	types       []string         // AdminTypes; nil: the live replicas' (or all, with allTypes)
	allTypes    bool
	otherApps   []string        // AdminOtherApp: other apps whose registered types it may write
	registry    *store.Registry // the table's registry of types (admin_owners.go)

	afterRead func() // a test's, run after each read of the replicas
}

// AdminOption configures an [Admin] at [NewAdmin].
type AdminOption func(*Admin) error

// AdminTypes makes the Admin act on the rows of these types only, whatever
// the live relays of its app serve. Without it (and without
// [AdminAllTypes]), an Admin acts on the types the live relays of its app
// have senders for. A type that another app's live relays serve is refused
// ([ErrOtherApp]).
func AdminTypes(types ...string) AdminOption {
	types = slices.Clone(types)
	return func(a *Admin) error {
		if len(types) == 0 {
			return errors.New("relay: AdminTypes: name at least one type (AdminAllTypes acts on every type)")
		}
		for _, t := range types {
			if strings.TrimSpace(t) == "" {
				return fmt.Errorf("relay: AdminTypes: type %q is blank", t)
			}
		}
		slices.Sort(types)
		a.types = slices.Compact(types)
		return nil
	}
}

// AdminAllTypes makes the Admin act on the rows of every type of the table,
// those of the other apps sharing it too, but for the types that other apps'
// live relays serve, which it leaves alone ([AdminScope.Excluded]).
func AdminAllTypes() AdminOption {
	return func(a *Admin) error {
		a.allTypes = true
		return nil
	}
}

// NewAdmin returns an Admin for cfg.Table whose ceiling is cfg.MaxAttempts,
// reporting the election of cfg.AppName. cfg must come from [DefaultConfig] or
// [ConfigFromEnv], as for [New]; pass the relays' own Config.
//
// What it re-queues and purges is its scope ([Admin.Scope]): by default the
// types the live relays of cfg.AppName have senders for, so that an app's
// tools leave the rows of the other apps sharing the table alone;
// [AdminTypes] names the types, [AdminAllTypes] takes every type.
func NewAdmin(pool *pgxpool.Pool, cfg Config, opts ...AdminOption) (*Admin, error) {
	if pool == nil {
		return nil, errors.New("relay: NewAdmin needs a *pgxpool.Pool, got nil")
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	repo, err := newAdminRepository(cfg.Table, false)
	if err != nil {
		return nil, &FieldError{Field: "Table", msg: err.Error()}
	}
	queued, err := newAdminRepository(cfg.Table, true)
	if err != nil {
		return nil, &FieldError{Field: "Table", msg: err.Error()}
	}
	id, _ := store.ParseTable(cfg.Table) // valid: newAdminRepository checked it
	a := &Admin{pool: pool, app: cfg.AppName, key: cfg.lockKey(), table: cfg.Table, maxAttempts: cfg.MaxAttempts,
		backoff: cfg.RetryBackoff, repo: repo, repoQueued: queued, registry: store.NewRegistry(id)}
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o(a); err != nil {
			return nil, err
		}
	}
	if a.allTypes && a.types != nil {
		return nil, errors.New("relay: NewAdmin: AdminTypes and AdminAllTypes exclude each other")
	}
	if slices.Contains(a.otherApps, a.app) {
		return nil, fmt.Errorf("relay: NewAdmin: AdminOtherApp(%q) names the Admin's own app", a.app)
	}
	return a, nil
}

// repoOf returns the statements for the table as it is now: with its
// optional requeued_at column once it has one (CreateTable adds it).
func (a *Admin) repoOf(ctx context.Context) (*adminRepository, error) {
	if a.queued.Load() {
		return a.repoQueued, nil
	}
	has, err := store.HasColumn(ctx, a.pool, a.repo.Table, "requeued_at")
	if err != nil {
		return nil, fmt.Errorf("relay: read the columns of %s: %w", a.table, err)
	}
	if !has {
		return a.repo, nil
	}
	a.queued.Store(true)
	return a.repoQueued, nil
}

// AppName is the app whose election the Admin reports: [Config.AppName].
func (a *Admin) AppName() string { return a.app }

// Table is the outbox table the Admin operates: [Config.Table].
func (a *Admin) Table() string { return a.table }

// MaxAttempts is the ceiling at which a row is dead: [Config.MaxAttempts].
func (a *Admin) MaxAttempts() int { return a.maxAttempts }

// StatusCount is how many outbound rows of one type are in one status, as
// [Admin.CountByStatus] reports them.
type StatusCount struct {
	Type   string
	Status string // "PENDING", "ERROR" or "SENT"
	Dead   bool   // ERROR rows at or above the ceiling: never retried until re-queued
	Count  int64
}

// CountByStatus counts the outbound rows by type and status, ordered by type,
// status and Dead. Dead rows are counted apart from the ERROR rows that
// will still be retried: a type's ERROR status may appear twice, with Dead
// false and with Dead true. It reads the whole table, SENT history
// included.
//
// Deprecated: Use [Admin.Overview], which counts the live rows exactly through
// their indexes and estimates the SENT history of a large table instead of
// scanning it.
func (a *Admin) CountByStatus(ctx context.Context) ([]StatusCount, error) {
	counts, err := a.repo.countByStatus(ctx, a.pool, a.maxAttempts)
	if err != nil {
		return nil, fmt.Errorf("relay: count the rows of %s by status: %w", a.table, err)
	}
	return counts, nil
}

// DeadMessage is a dead row, as [Admin.ListDead] and [Admin.DeadPage] report it.
type DeadMessage struct {
	ID        int64
	Type      string
	Key       string // the natural key
	Attempts  int    // at or above the ceiling
	LastError string // the last failure's text, cut to [LastErrorMax] bytes; "" if none was recorded
	// Permanent says the row died of a permanent failure ([Permanent], a 4xx)
	// rather than by reaching the ceiling; AttemptsMade is then how many
	// attempts were really made (Attempts is set to the ceiling, which keeps
	// the row dead). Otherwise AttemptsMade is Attempts. See [ParsePermanent].
	Permanent    bool
	AttemptsMade int
	CreatedAt    time.Time // when it was written
	UpdatedAt    time.Time // when it died

	// Payload is the start of the payload's JSON text, at most
	// [PayloadPreviewMax] characters, cut by the database: a page of dead rows
	// never reads whole payloads. PayloadCut says there is more.
	Payload    string
	PayloadCut bool

	// App is the app whose type the row is of ([Admin.Owners]): the Admin's
	// own, another app's (which the Admin does not re-queue unless named
	// with [AdminOtherApp]), or "" when nothing says.
	App string
}

// Bounds of what [Admin.DeadPage] reads of a dead row.
const (
	PayloadPreviewMax = 200  // characters of the payload's JSON text
	LastErrorMax      = 2000 // characters of last_error
)

// ListDeadMax is the most rows one [Admin.DeadPage] (or [Admin.ListDead]) returns.
const ListDeadMax = 10_000

// ListDead returns at most limit dead rows, oldest (lowest id) first. limit
// must be between 1 and [ListDeadMax].
//
// Deprecated: Use [Admin.DeadPage] with DeadQuery{Limit: limit}: the same first
// page, and its AfterID reads the next ones.
func (a *Admin) ListDead(ctx context.Context, limit int) ([]DeadMessage, error) {
	if limit < 1 || limit > ListDeadMax {
		return nil, fmt.Errorf("relay: ListDead: limit must be between 1 and %d, got %d", ListDeadMax, limit)
	}
	return a.DeadPage(ctx, DeadQuery{Limit: limit})
}

// DeadPageDefault is the size of a page of [Admin.DeadPage] when
// [DeadQuery.Limit] is 0.
const DeadPageDefault = 50

// DeadQuery selects one page of dead rows for [Admin.DeadPage].
type DeadQuery struct {
	// Type keeps only the dead rows of this type. "" keeps every type.
	Type string
	// AfterID keeps only the rows with a higher id: pass the last ID of the
	// previous page to read the next one. 0 starts at the oldest dead row.
	AfterID int64
	// Limit is the most rows of the page, from 1 to [ListDeadMax]. 0 means
	// [DeadPageDefault].
	Limit int
}

// DeadPage returns one page of dead rows, oldest (lowest id) first, keyed on
// the id rather than an offset, so that every page costs the same however deep
// it is in a long list. A page shorter than the limit is the last.
func (a *Admin) DeadPage(ctx context.Context, q DeadQuery) ([]DeadMessage, error) {
	if q.Limit == 0 {
		q.Limit = DeadPageDefault
	}
	if q.Limit < 1 || q.Limit > ListDeadMax {
		return nil, fmt.Errorf("relay: DeadPage: Limit must be between 1 and %d, got %d", ListDeadMax, q.Limit)
	}
	if q.AfterID < 0 {
		return nil, fmt.Errorf("relay: DeadPage: AfterID must not be negative, got %d", q.AfterID)
	}
	dead, err := a.repo.deadPage(ctx, a.pool, a.maxAttempts, q)
	if err != nil {
		return nil, fmt.Errorf("relay: list the dead rows of %s: %w", a.table, err)
	}
	return dead, a.markApps(ctx, dead)
}

// DeadRows returns the rows of ids that are dead, as [Admin.RequeueIDs] would
// find them, oldest first: what a confirmation shows before a re-queue by id.
// At most [ListDeadMax] ids.
func (a *Admin) DeadRows(ctx context.Context, ids ...int64) ([]DeadMessage, error) {
	if len(ids) > ListDeadMax {
		return nil, fmt.Errorf("relay: DeadRows: at most %d ids, got %d", ListDeadMax, len(ids))
	}
	if len(ids) == 0 {
		return nil, nil
	}
	dead, err := a.repo.deadRows(ctx, a.pool, a.maxAttempts, ids)
	if err != nil {
		return nil, fmt.Errorf("relay: read %d row(s) of %s by id: %w", len(ids), a.table, err)
	}
	return dead, a.markApps(ctx, dead)
}

// RequeueAll re-queues every dead row of the Admin's scope ([Admin.Scope]):
// status PENDING, attempts 0, last_error kept for the record, and requeued_at
// now() when the table has that column (from then on the row waits). The
// next pass delivers them. It returns how many rows it re-queued. It refuses,
// with [ErrCeilingDiffers], while a live relay of the app runs with another
// MaxAttempts, and, with the scope's error ([AdminScope.Err]), while it
// cannot tell its app's types or was named another app's.
//
// A re-queued row goes back in its key's order by id: if later messages of the
// same key were delivered while it was dead, it now arrives after them, and the
// receiver must tolerate that as it tolerates any redelivery.
func (a *Admin) RequeueAll(ctx context.Context) (int64, error) {
	scope, err := a.scope(ctx, true)
	if err != nil {
		return 0, err
	}
	repo, err := a.repoOf(ctx)
	if err != nil {
		return 0, err
	}
	n, err := repo.requeueAll(ctx, a.pool, a.maxAttempts, scope)
	if err != nil {
		return 0, fmt.Errorf("relay: re-queue the dead rows of %s: %w", a.table, err)
	}
	return n, nil
}

// RequeueType re-queues the dead rows of type typ, as [Admin.RequeueAll] does,
// and returns how many. typ must not be blank, and must be in the Admin's scope.
func (a *Admin) RequeueType(ctx context.Context, typ string) (int64, error) {
	if strings.TrimSpace(typ) == "" {
		return 0, errors.New("relay: RequeueType: the type must not be empty (use RequeueAll to re-queue every dead row)")
	}
	scope, err := a.scope(ctx, true)
	if err != nil {
		return 0, err
	}
	if slices.Contains(scope.exclude, typ) {
		return 0, fmt.Errorf("%w: RequeueType: type %q is another app's (its live relays serve it, or the registry of types gives it to that app): "+
			"only that app re-queues its rows, unless the operator takes them over (relay.AdminOtherApp, relayctl --other-app)", ErrOtherApp, typ)
	}
	if scope.types != nil && !slices.Contains(scope.types, typ) {
		return 0, fmt.Errorf("relay: RequeueType: type %q is not among the types this Admin acts on (%s): "+
			"name it with AdminTypes (relayctl --types) or use AdminAllTypes (relayctl --all-types)", typ, quoteAll(scope.types))
	}
	repo, err := a.repoOf(ctx)
	if err != nil {
		return 0, err
	}
	n, err := repo.requeueType(ctx, a.pool, a.maxAttempts, typ)
	if err != nil {
		return 0, fmt.Errorf("relay: re-queue the dead rows of type %q in %s: %w", typ, a.table, err)
	}
	return n, nil
}

// RequeueIDs re-queues the rows of ids that are dead, as [Admin.RequeueAll]
// does, and returns how many; ids of rows that are not dead (live, SENT,
// inbound, missing, or of a type outside the Admin's scope) are left alone.
// No ids re-queues nothing. A dead row among ids that is another app's
// ([DeadMessage.App]: its type is registered to another app, or another
// app's live relays deliver it) makes it refuse them all, with
// [ErrOtherApp] naming the rows and their app, unless that app was named
// with [AdminOtherApp] and none of its relays runs.
func (a *Admin) RequeueIDs(ctx context.Context, ids ...int64) (int64, error) {
	if len(ids) == 0 {
		return 0, nil
	}
	scope, err := a.scope(ctx, true)
	if err != nil {
		return 0, err
	}
	if len(ids) <= ListDeadMax {
		rows, err := a.DeadRows(ctx, ids...)
		if err != nil {
			return 0, err
		}
		var theirs []string
		for _, d := range rows {
			if !scope.includes(d.Type) && d.App != "" && d.App != a.app {
				theirs = append(theirs, fmt.Sprintf("row %d (type %q) is app %q's", d.ID, d.Type, d.App))
			}
		}
		if len(theirs) > 0 {
			return 0, fmt.Errorf("%w: nothing re-queued: %s; re-queue them as that app (relayctl --app), or, while none of its relays runs, "+
				"take its rows over with relay.AdminOtherApp (relayctl --other-app)", ErrOtherApp, strings.Join(theirs, ", "))
		}
	}
	repo, err := a.repoOf(ctx)
	if err != nil {
		return 0, err
	}
	n, err := repo.requeueIDs(ctx, a.pool, a.maxAttempts, ids, scope)
	if err != nil {
		return 0, fmt.Errorf("relay: re-queue %d dead row(s) of %s by id: %w", len(ids), a.table, err)
	}
	return n, nil
}

// PurgeSent deletes the outbound SENT rows of the Admin's scope ([Admin.Scope])
// whose sent_at is older than
// retention (measured on the database's clock), oldest first, in statements of
// at most [PurgeChunk] rows each, and returns how many it deleted. Live and
// dead rows, inbound rows and SENT rows within retention are left alone.
// retention must not be negative; 0 purges every SENT row.
//
// It stops at the first error, or when ctx ends between chunks, and then
// returns how many rows it had deleted with the error; running it again
// resumes where it stopped.
func (a *Admin) PurgeSent(ctx context.Context, retention time.Duration) (int64, error) {
	return a.PurgeSentProgress(ctx, retention, nil)
}

// PurgeSentProgress is [Admin.PurgeSent] reporting its progress: once before
// the first chunk (deleted 0) and after each chunk it calls progress with the
// rows deleted so far and how many it expects to delete in all. expected is
// fixed before the first chunk, by
// [Admin.EstimatePurge] (exact on a small table, estimated from a sample of its
// pages on a large one), and never follows deleted: a purge may overtake its
// estimate, or end below it. A nil progress is PurgeSent.
func (a *Admin) PurgeSentProgress(ctx context.Context, retention time.Duration, progress func(deleted, expected int64)) (int64, error) {
	if err := checkRetention(retention); err != nil {
		return 0, err
	}
	scope, err := a.scope(ctx, false)
	if err != nil {
		return 0, err
	}
	cutoff, err := a.repo.cutoff(ctx, a.pool, retention)
	if err != nil {
		return 0, fmt.Errorf("relay: purge the SENT rows of %s: %w", a.table, err)
	}
	var expected int64
	if progress != nil {
		est, err := a.estimatePurge(ctx, cutoff, scope)
		if err != nil {
			return 0, err
		}
		expected = est.Rows
		progress(0, expected)
	}
	var total int64
	for {
		n, err := a.repo.purgeChunk(ctx, a.pool, cutoff, PurgeChunk, scope)
		total += n
		if err != nil {
			return total, fmt.Errorf("relay: purge the SENT rows of %s (%d deleted so far): %w", a.table, total, err)
		}
		if progress != nil {
			progress(total, expected)
		}
		if n < PurgeChunk {
			return total, nil
		}
		if err := ctx.Err(); err != nil {
			return total, fmt.Errorf("relay: purge the SENT rows of %s (%d deleted so far): %w", a.table, total, err)
		}
	}
}

func checkRetention(retention time.Duration) error {
	if retention < 0 {
		return fmt.Errorf("relay: PurgeSent: retention must not be negative, got %s", retention)
	}
	return nil
}

// PurgeEstimate is what a purge would delete, as [Admin.EstimatePurge] reads
// it before deleting anything.
type PurgeEstimate struct {
	// Cutoff is the database's now() minus the retention: the purge deletes
	// the outbound SENT rows delivered (sent_at) before it.
	Cutoff time.Time
	// Rows is how many rows, in all; Types the same by type, ordered by type.
	Rows  int64
	Types []TypeCount
	// Exact says Rows was counted. False on a table larger than a few tens
	// of megabytes: Rows is then scaled from a sample of SampledPages of
	// its Pages (TABLESAMPLE SYSTEM), which reads neither the whole history
	// nor trusts the planner's statistics (absent on a table never analyzed).
	Exact               bool
	SampledPages, Pages int64
}

// TypeCount is how many rows of one type.
type TypeCount struct {
	Type string
	Rows int64
}

// EstimatePurge says how many outbound SENT rows [Admin.PurgeSent] with
// retention would delete now, by type (of the Admin's scope, [Admin.Scope]),
// without deleting any: counted on a
// small table, estimated from a sample of its pages on a large one. It is
// what a confirmation asks about, and the total a purge's progress is
// measured against.
func (a *Admin) EstimatePurge(ctx context.Context, retention time.Duration) (PurgeEstimate, error) {
	if err := checkRetention(retention); err != nil {
		return PurgeEstimate{}, err
	}
	scope, err := a.scope(ctx, false)
	if err != nil {
		return PurgeEstimate{}, err
	}
	cutoff, err := a.repo.cutoff(ctx, a.pool, retention)
	if err != nil {
		return PurgeEstimate{}, fmt.Errorf("relay: estimate the purge of %s: %w", a.table, err)
	}
	return a.estimatePurge(ctx, cutoff, scope)
}

// estimatePurge is EstimatePurge of the types of scope.
func (a *Admin) estimatePurge(ctx context.Context, cutoff time.Time, scope writeScope) (PurgeEstimate, error) {
	est, err := a.repo.estimatePurge(ctx, a.pool, cutoff, scope)
	if err != nil {
		return est, fmt.Errorf("relay: count the SENT rows of %s to purge: %w", a.table, err)
	}
	return est, nil
}
