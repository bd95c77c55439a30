package store

import (
	"context"
	"fmt"
	"hash/fnv"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/xadm/relay/internal/lease"
)

// One type, one app: the delivers keys a started relay holds and the table's
// registry of types, in sql/registry.sql (internal/session's ownership.go
// takes them; the relay's Admin reads the registry).

var (
	registryExistsSQL = Statements.Positional("registryExists", Data{})
	claimLockSQL      = Statements.Positional("claimLock", Data{})
	claimTakeSQL      = Statements.Positional("claimTake", Data{})
	deliversRelease   = Statements.Positional("deliversRelease", Data{})
	claimLookBareSQL  = Statements.Positional("claimLook", Data{})
)

// registrySuffix ends the name of a table's registry of types.
const registrySuffix = "_types"

// RegistryName is the quoted name of table's registry of types: in table's
// schema, named after it ("mensagem_m2m_types"), cut and tagged as
// [IndexName] does past 63 bytes.
func RegistryName(table pgx.Identifier) string {
	name := table[len(table)-1]
	if len(name)+len(registrySuffix) > 63 {
		h := fnv.New32a()
		h.Write([]byte(name))
		tag := fmt.Sprintf("_%08x", h.Sum32())
		name = name[:63-len(registrySuffix)-len(tag)] + tag
	}
	id := append(pgx.Identifier{}, table[:len(table)-1]...)
	return append(id, name+registrySuffix).Sanitize()
}

// Registry is the statements of one table's registry of types.
type Registry struct {
	Name      string // quoted
	lookSQL   string
	recordSQL string
	readSQL   string
}

// NewRegistry returns the statements of the registry of table (valid, as
// [ParseTable] reads it).
func NewRegistry(table pgx.Identifier) *Registry {
	d := Data{Registry: RegistryName(table)}
	return &Registry{Name: d.Registry, lookSQL: Statements.Positional("claimLook", d),
		recordSQL: Statements.Positional("claimRecord", d), readSQL: Statements.Positional("registryRead", d)}
}

// Exists says whether the registry exists; mark goes before the statement
// (a presence session's descriptor, or "").
func (r *Registry) Exists(ctx context.Context, db Querier, mark string) (bool, error) {
	var ok bool
	err := db.QueryRow(ctx, mark+registryExistsSQL, r.Name).Scan(&ok)
	return ok, err
}

// Claim is one type as a claim found it.
type Claim struct {
	Type string
	// PID is a session of another app that delivers the type now; 0: none.
	// Query is that session's last statement (its presence descriptor).
	PID   int
	Query string
	// Registered is the app the registry names for the type; "" when it
	// names none, or there is no registry.
	Registered string
}

// claimWait bounds the wait of a claim for the claims' lock, and for the
// registry's row locks: a claim that cannot decide in time is tried again.
const claimWait = 3 * time.Second

// ClaimTx runs fn in a transaction on conn that holds the claims' lock of
// table (its name without the schema) until it ends, so that no two relays
// of the table decide at once. Every statement of the transaction, its
// BEGIN and COMMIT too, is sent after mark (the presence descriptor), so
// that the session's last statement always says it (pg_stat_activity).
func ClaimTx(ctx context.Context, conn *pgx.Conn, mark, table string, fn func() error) (err error) {
	if _, err := conn.Exec(ctx, mark+"BEGIN"); err != nil {
		return err
	}
	defer func() {
		if err != nil {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
			defer cancel()
			_, _ = conn.Exec(rctx, mark+"ROLLBACK")
			return
		}
		_, err = conn.Exec(ctx, mark+"COMMIT")
	}()
	if _, err := conn.Exec(ctx, mark+claimLockSQL, table, strconv.Itoa(int(lease.Server/time.Millisecond)),
		strconv.Itoa(int(claimWait/time.Millisecond))); err != nil {
		return err
	}
	return fn()
}

// Look reads, for each of types, whether a session of another app than app
// delivers it on table, and the app the registry names (reg nil: none).
func Look(ctx context.Context, conn *pgx.Conn, mark string, reg *Registry, app, table string, types []string) ([]Claim, error) {
	sql := claimLookBareSQL
	if reg != nil {
		sql = reg.lookSQL
	}
	rows, err := conn.Query(ctx, mark+sql, app, table, types)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (Claim, error) {
		var c Claim
		var pid int32
		err := row.Scan(&c.Type, &pid, &c.Query, &c.Registered)
		c.PID = int(pid)
		return c, err
	})
}

// Take takes the delivers keys of types on table for this session; false
// when one was refused (an exclusive holder, which no relay is).
func Take(ctx context.Context, conn *pgx.Conn, mark, table string, types []string) (bool, error) {
	var ok bool
	err := conn.QueryRow(ctx, mark+claimTakeSQL, table, types).Scan(&ok)
	return ok, err
}

// Record writes that app delivers types, with its ceiling, in a savepoint
// of the claim's transaction: a registry this role may not write costs the
// record, not the claim.
func (r *Registry) Record(ctx context.Context, conn *pgx.Conn, mark, app string, maxAttempts int, types []string) error {
	if _, err := conn.Exec(ctx, mark+"SAVEPOINT relay_record"); err != nil {
		return err
	}
	_, err := conn.Exec(ctx, mark+r.recordSQL, types, app, maxAttempts)
	if err != nil {
		_, _ = conn.Exec(ctx, mark+"ROLLBACK TO SAVEPOINT relay_record")
		return err
	}
	_, err = conn.Exec(ctx, mark+"RELEASE SAVEPOINT relay_record")
	return err
}

// ReleaseDelivers lets go of the delivers keys of types on backend pid;
// false when it ran elsewhere or a key was not held.
func ReleaseDelivers(ctx context.Context, db Querier, table string, types []string, pid uint32) (bool, error) {
	var ok *bool
	err := db.QueryRow(ctx, deliversRelease, table, types, pid).Scan(&ok)
	return err == nil && ok != nil && *ok, err
}

// Owner is one row of the registry.
type Owner struct {
	Type, App   string
	Since       time.Time // since when the app delivers it
	StartedAt   time.Time // the last start of a relay of the app that delivers it
	MaxAttempts int       // 0 when not recorded
}

// Read reads the registry, by type.
func (r *Registry) Read(ctx context.Context, db Querier) ([]Owner, error) {
	rows, err := db.Query(ctx, r.readSQL)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (Owner, error) {
		var o Owner
		var n int32
		err := row.Scan(&o.Type, &o.App, &o.Since, &o.StartedAt, &n)
		o.MaxAttempts = int(n)
		return o, err
	})
}
