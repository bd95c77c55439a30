package session

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/xadm/relay/internal/store"
)

// This file is one type, one app (decision 0043). Two apps whose relays both
// have a sender for a type on one table (a renamed app in a rolling deploy, a
// type registered twice by mistake) would each deliver its rows: twice, and
// out of its keys' order. So a started relay delivers a type only while its
// presence session holds the type's delivers key, in shared mode
// (sql/registry.sql): the relays of one app hold it together, and a relay
// takes it only while no session of another app holds it, deciding under a
// transaction lock on the table's name, so that two apps never both take it.
// The first app to deliver a type keeps it; another app's relays yield it,
// say so loudly, look again every claimEvery, and take it over once the first
// app's relays have all stopped (their sessions, and so their keys, gone).
//
// The decision is made on the presence session before the relay's first
// pass (the loop waits for the listener), and again after each
// reconnection. Between a session's loss and the next claim a relay keeps
// its last decision: a fault of that session opens the same short window of
// duplicates as any fault in flight.
//
// The table's registry of types records which app took each type, and since
// when, so that the tools tell an app's rows from another's while its relays
// are down. A table without one (made by another migration) is claimed all the
// same, by the keys alone; the relay says once how to add it.

// claimEvery is how often a relay that yields a type looks again whether
// the app that delivers it still runs.
const claimEvery = 3 * time.Second

// claimTimeout bounds one claim.
const claimTimeout = 5 * time.Second

// yieldLogEvery is how often the loud error of a type yielded is said again
// while it lasts.
const yieldLogEvery = 5 * time.Minute

// Yield is a type a relay has a sender for and does not deliver, because
// live relays of another app deliver it on its table.
type Yield struct {
	Type  string
	App   string // the other app, as the registry or its presence names it
	Since time.Time
}

// Ownership is a started relay's claim on its types.
type Ownership struct {
	app, table  string // table: the key's name, without the schema
	tableFull   string // as configured, for the messages
	maxAttempts int
	types       []string
	reg         *store.Registry
	logger      *slog.Logger
	changed     func() // told when the yields change

	mu        sync.Mutex
	held      []string // the delivers keys the current session holds
	heldPID   uint32
	yields    []Yield
	logged    map[string]time.Time // the loud error's last time, per type
	lastClaim time.Time
	failed    bool // the last claim failed: the next is due at claimEvery
	noReg     bool // the registry is missing: said once
	regFailed bool // a write to the registry failed: said once

	now atomic.Pointer[[]Yield] // yields, for readers that take no lock
}

// NewOwnership is the claim of a relay of app on table (as configured,
// valid) for types.
func NewOwnership(app, table string, maxAttempts int, types []string, logger *slog.Logger) *Ownership {
	id, _ := store.ParseTable(table)
	o := &Ownership{app: app, table: TableName(table), tableFull: table, maxAttempts: maxAttempts, types: types,
		reg: store.NewRegistry(id), logger: logger, logged: map[string]time.Time{}}
	o.now.Store(&[]Yield{})
	return o
}

// Yielded are the types the relay does not deliver now, by type.
func (o *Ownership) Yielded() []Yield {
	if o == nil {
		return nil
	}
	return *o.now.Load()
}

// YieldedTypes are the types of Yielded, nil when it yields none.
func (o *Ownership) YieldedTypes() []string {
	ys := o.Yielded()
	if len(ys) == 0 {
		return nil
	}
	types := make([]string, len(ys))
	for i, y := range ys {
		types[i] = y.Type
	}
	return types
}

// OnChange has f told when the yields change.
func (o *Ownership) OnChange(f func()) { o.changed = f }

// due says a claim is due on the session: the relay yields a type, and its
// last look is claimEvery old.
func (o *Ownership) due() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return (len(o.yields) > 0 || o.failed) && time.Since(o.lastClaim) >= claimEvery
}

// claim decides, on conn (backend pid, fresh: a session that holds no key
// yet), which types the relay delivers: it takes the keys no other app's
// session holds, records them in the registry, and yields the others.
func (o *Ownership) claim(ctx context.Context, conn *pgx.Conn, pid uint32, mark string, fresh bool) error {
	cctx, cancel := context.WithTimeout(ctx, claimTimeout)
	defer cancel()
	o.mu.Lock()
	defer o.mu.Unlock()
	o.lastClaim = time.Now()
	if fresh || o.heldPID != pid {
		o.held, o.heldPID = nil, pid
	}
	var reg *store.Registry
	ok, err := o.reg.Exists(cctx, conn, mark)
	switch {
	case err != nil:
		o.failed = true
		return fmt.Errorf("relay: look for the registry of types %s: %w", o.reg.Name, err)
	case ok:
		reg = o.reg
	case !o.noReg:
		o.noReg = true
		o.logger.LogAttrs(ctx, slog.LevelWarn, "relay: the table has no registry of its types: while this app's relays are down, "+
			"the tools cannot tell its rows from another app's; relay.CreateTable (or relay.SchemaSQL) adds it",
			slog.String("registry", o.reg.Name), slog.String("table", o.tableFull))
	}
	var claims []store.Claim
	for {
		err = o.claimTx(ctx, cctx, conn, mark, reg, &claims)
		var pgErr *pgconn.PgError
		if reg == nil || !errors.As(err, &pgErr) || pgErr.Code != "42501" { // insufficient_privilege
			break
		}
		// A registry this role may not read: claim by the keys alone.
		if !o.regFailed {
			o.regFailed = true
			o.logger.LogAttrs(ctx, slog.LevelWarn, "relay: cannot read the registry of types: this app's types are claimed by the live relays alone, "+
				"and the tools will not know them while its relays are down; grant the relay's role SELECT, INSERT and UPDATE on it",
				slog.String("registry", reg.Name), slog.String("error", err.Error()))
		}
		reg = nil
	}
	if o.failed = err != nil; o.failed {
		return fmt.Errorf("relay: claim the types of app %q on %s: %w", o.app, o.tableFull, err)
	}
	o.decided(ctx, claims)
	return nil
}

// claimTx is one claim's transaction on conn: the look, the keys taken,
// their record in reg (nil: none) (o.mu held).
func (o *Ownership) claimTx(ctx, cctx context.Context, conn *pgx.Conn, mark string, reg *store.Registry, out *[]store.Claim) error {
	var claims []store.Claim
	defer func() { *out = claims }()
	return store.ClaimTx(cctx, conn, mark, o.table, func() error {
		var err error
		if claims, err = store.Look(cctx, conn, mark, reg, o.app, o.table, o.types); err != nil {
			return err
		}
		var take []string
		for _, c := range claims {
			if c.PID == 0 && !slices.Contains(o.held, c.Type) {
				take = append(take, c.Type)
			}
		}
		if len(take) > 0 {
			if ok, err := store.Take(cctx, conn, mark, o.table, take); err != nil {
				return err
			} else if !ok {
				return errors.New("an exclusive lock of a delivers key is held elsewhere")
			}
			o.held = append(o.held, take...)
		}
		if reg == nil || len(take) == 0 {
			return nil
		}
		if err := reg.Record(cctx, conn, mark, o.app, o.maxAttempts, take); err != nil {
			if cctx.Err() != nil || conn.IsClosed() {
				return err
			}
			if !o.regFailed {
				o.regFailed = true
				o.logger.LogAttrs(ctx, slog.LevelWarn, "relay: cannot record this app's types in the registry: the tools will not know them "+
					"while this app's relays are down; grant the relay's role INSERT and UPDATE on it",
					slog.String("registry", reg.Name), slog.String("error", err.Error()))
			}
		}
		return nil
	})
}

// decided keeps and says the yields of a claim (o.mu held).
func (o *Ownership) decided(ctx context.Context, claims []store.Claim) {
	before := o.yields
	var yields []Yield
	now := time.Now()
	for _, c := range claims {
		if c.PID == 0 {
			if i := slices.IndexFunc(before, func(y Yield) bool { return y.Type == c.Type }); i >= 0 {
				o.logger.LogAttrs(ctx, slog.LevelWarn, "relay: takes over a type: no relay of the app that delivered it runs any more",
					slog.String("type", c.Type), slog.String("from_app", before[i].App), slog.String("table", o.tableFull))
				delete(o.logged, c.Type)
			} else if c.Registered != "" && c.Registered != o.app {
				o.logger.LogAttrs(ctx, slog.LevelWarn, "relay: delivers a type the registry gives to another app, none of whose relays runs: "+
					"this app takes it over (a renamed app does so by design; otherwise, remove this relay's sender for it)",
					slog.String("type", c.Type), slog.String("from_app", c.Registered), slog.String("table", o.tableFull))
			}
			continue
		}
		y := Yield{Type: c.Type, App: otherApp(c), Since: now}
		if i := slices.IndexFunc(before, func(b Yield) bool { return b.Type == c.Type }); i >= 0 {
			y.Since = before[i].Since
		}
		yields = append(yields, y)
		if last, ok := o.logged[c.Type]; !ok || now.Sub(last) >= yieldLogEvery {
			o.logged[c.Type] = now
			o.logger.LogAttrs(ctx, slog.LevelError, "relay: another app's live relays deliver this type on the table: this relay does not deliver it "+
				"while they do (one type, one app); it takes the type over once they stop. Remove this app's sender for it, or stop the other app",
				slog.String("type", c.Type), slog.String("app", o.app), slog.String("other_app", y.App),
				slog.String("table", o.tableFull), slog.Time("since", y.Since))
		}
	}
	o.yields = yields
	same := slices.EqualFunc(before, yields, func(a, b Yield) bool { return a.Type == b.Type && a.App == b.App })
	o.now.Store(&yields)
	if !same && o.changed != nil {
		o.changed()
	}
}

// otherApp names the app of a claim's holder: as its presence descriptor
// says, else as the registry does.
func otherApp(c store.Claim) string {
	if d, ok := ParseComment(c.Query); ok && d.App != "" {
		return d.App
	}
	if c.Registered != "" {
		return c.Registered
	}
	return fmt.Sprintf("an app whose name this role cannot read (pid %d)", c.PID)
}

// release lets go of the delivers keys held on conn, backend pid, before it
// is closed.
func (o *Ownership) release(ctx context.Context, conn *pgx.Conn, pid uint32) {
	o.mu.Lock()
	held := o.held
	o.held = nil
	o.mu.Unlock()
	if len(held) == 0 || conn.IsClosed() {
		return
	}
	_, _ = store.ReleaseDelivers(ctx, conn, o.table, held, pid)
}
