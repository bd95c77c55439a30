package relay

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// Whose rows are whose (decision 0043): an Admin tells its app's types from
// another app's by the live relays (presence: who delivers which type now)
// and, while an app's relays are down, by the table's registry of types,
// which the relays write when they start and when they take a type over. It
// neither counts nor writes another app's rows unless the operator names that
// app ([AdminOtherApp]), and never while that app's relays run.

// AdminOtherApp lets the Admin re-queue and purge the rows of the types the
// table's registry gives to app, another app, while none of that app's
// relays runs: the operator takes its rows over, for instance after a rename
// whose old app will not run again. Without it, an Admin never writes another
// app's rows; with it, it still never writes the types another app's live
// relays deliver. It may be given several times.
func AdminOtherApp(app string) AdminOption {
	return func(a *Admin) error {
		if msg := checkAppName(app); msg != "" {
			return fmt.Errorf("relay: AdminOtherApp: the app %s", msg)
		}
		if !slices.Contains(a.otherApps, app) {
			a.otherApps = append(a.otherApps, app)
		}
		return nil
	}
}

// TypeOwner is one row of the table's registry of types ([Admin.Owners]):
// the app that delivered the type last, as its relays recorded it.
type TypeOwner struct {
	Type string
	App  string
	// Since is when App's relays took the type (from another app, or first);
	// StartedAt the last start of one of them; MaxAttempts its ceiling (0
	// when not recorded).
	Since, StartedAt time.Time
	MaxAttempts      int
}

// ErrNoRegistry says the table has no registry of types: made by another
// migration, or before the registry existed. [CreateTable] adds it.
var ErrNoRegistry = errors.New("relay: the table has no registry of types")

// Owners reads the table's registry of types, by type: which app's relays
// delivered each type last. It returns [ErrNoRegistry] (wrapped) when the
// table has none. A JVM relay never writes it: its types are not there
// unless written by hand (docs/operations.md, "Whose rows").
func (a *Admin) Owners(ctx context.Context) ([]TypeOwner, error) {
	ok, err := a.registry.Exists(ctx, a.pool, "")
	if err != nil {
		return nil, fmt.Errorf("relay: look for the registry of types of %s: %w", a.table, err)
	}
	if !ok {
		return nil, fmt.Errorf("%w: %s (relay.CreateTable adds it)", ErrNoRegistry, a.registry.Name)
	}
	rows, err := a.registry.Read(ctx, a.pool)
	if err != nil {
		return nil, fmt.Errorf("relay: read the registry of types %s: %w", a.registry.Name, err)
	}
	out := make([]TypeOwner, len(rows))
	for i, o := range rows {
		out[i] = TypeOwner{Type: o.Type, App: o.App, Since: o.Since, StartedAt: o.StartedAt, MaxAttempts: o.MaxAttempts}
	}
	return out, nil
}

// owners is Owners by type; empty without a registry, or one this role may
// not read (the Admin then knows another app's types by its live relays only,
// as before the registry).
func (a *Admin) owners(ctx context.Context) (map[string]TypeOwner, error) {
	list, err := a.Owners(ctx)
	var pgErr *pgconn.PgError
	if errors.Is(err, ErrNoRegistry) || errors.As(err, &pgErr) && pgErr.Code == "42501" { // insufficient_privilege
		return map[string]TypeOwner{}, nil
	}
	if err != nil {
		return nil, err
	}
	m := make(map[string]TypeOwner, len(list))
	for _, o := range list {
		m[o.Type] = o
	}
	return m, nil
}

// whose is who delivers which type of the table at one look.
type whose struct {
	app      string
	own      []Replica // the app's live relays
	others   []Replica // other apps' live relays on the table
	registry map[string]TypeOwner
}

// look reads whose for the types of names (and those the relays name).
func (a *Admin) whose(ctx context.Context, names ...string) (whose, error) {
	w := whose{app: a.app}
	var err error
	if w.registry, err = a.owners(ctx); err != nil {
		return w, err
	}
	for t := range w.registry {
		names = append(names, t)
	}
	if w.own, err = a.replicas(ctx, names); err != nil {
		return w, err
	}
	for _, r := range w.own {
		names = append(names, r.Types...)
	}
	others, err := a.OtherReplicas(ctx, names...)
	if err != nil {
		return w, err
	}
	for _, r := range others {
		if sameTable(r.Table, a.table) {
			w.others = append(w.others, r)
		}
	}
	return w, nil
}

// appOf is the app typ's rows are: the app whose live relays deliver it (the
// Admin's own first), else the app the registry names, else the app its own
// relays yield it to; "" when nothing says.
func (w whose) appOf(typ string) string {
	for _, r := range w.own {
		if r.Delivers(typ) {
			return w.app
		}
	}
	for _, r := range w.others {
		if r.Delivers(typ) {
			if r.App == "" {
				return "?"
			}
			return r.App
		}
	}
	if o, ok := w.registry[typ]; ok {
		return o.App
	}
	for _, r := range w.own {
		for _, y := range r.Yielded {
			if y.Type == typ {
				return y.App
			}
		}
	}
	return ""
}

// theirs says typ's rows are another app's: not the Admin's to count.
func (w whose) theirs(typ string) bool {
	app := w.appOf(typ)
	return app != "" && app != w.app
}

// markApps sets each dead row's App.
func (a *Admin) markApps(ctx context.Context, dead []DeadMessage) error {
	if len(dead) == 0 {
		return nil
	}
	var types []string
	for _, d := range dead {
		types = append(types, d.Type)
	}
	w, err := a.whose(ctx, types...)
	if err != nil {
		return err
	}
	for i := range dead {
		dead[i].App = w.appOf(dead[i].Type)
	}
	return nil
}

// otherAppsText names the apps of types by w, for a message.
func (w whose) otherAppsText(types []string) string {
	var apps []string
	for _, t := range types {
		if app := w.appOf(t); app != "" && app != w.app {
			apps = append(apps, fmt.Sprintf("%q", app))
		}
	}
	slices.Sort(apps)
	return strings.Join(slices.Compact(apps), ", ")
}

// includes says whether a statement of w may write typ.
func (w writeScope) includes(typ string) bool {
	if slices.Contains(w.exclude, typ) {
		return false
	}
	return w.types == nil || slices.Contains(w.types, typ)
}

// registryTypes are the types the registry gives to app, by name.
func (w whose) registryTypes(app string) []string {
	var out []string
	for t, o := range w.registry {
		if o.App == app {
			out = append(out, t)
		}
	}
	slices.Sort(out)
	return out
}
