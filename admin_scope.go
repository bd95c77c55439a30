package relay

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/xadm/relay/internal/store"
)

// An Admin's scope: what it may write. Its app's types, never those another
// app's live relays serve, nothing while it cannot tell its app's types, and
// only with the ceiling the live relays of its app run with.

// AdminScope is what an [Admin] re-queues and purges, as [Admin.Scope] says.
type AdminScope struct {
	// All says every type of the table ([AdminAllTypes]) but Excluded; Types
	// is empty then.
	All bool
	// Unknown says no live relay of the app tells its types and none were
	// named: the Admin writes nothing ([ErrScopeUnknown]).
	Unknown bool
	Types   []string
	// Source says where Types came from: "explicit" ([AdminTypes]), "live
	// replicas" (the default), "all", or "no live relay".
	Source string
	// Replicas are the live relays of the app, read for the default scope
	// and for the ceiling check of a re-queue.
	Replicas []Replica
	// Others are the live relays of other apps on the table
	// ([Admin.OtherReplicas]); Excluded the types they serve, which the
	// Admin never writes, even with [AdminAllTypes].
	Others   []Replica
	Excluded []string
	// Registered are the Excluded types that the table's registry gives to
	// another app whose relays are down; OtherApps the apps named with
	// [AdminOtherApp], whose registered types the Admin may write.
	Registered []string
	OtherApps  []string

	registry map[string]TypeOwner
	err      error
}

// Err says why the Admin writes nothing now: [ErrScopeUnknown] or
// [ErrOtherApp], wrapped with what to do; nil when it may write its scope.
func (s AdminScope) Err() error { return s.err }

// Includes says whether a re-queue or purge may write rows of typ.
func (s AdminScope) Includes(typ string) bool {
	switch {
	case s.err != nil || slices.Contains(s.Excluded, typ):
		return false
	case s.All:
		return true
	}
	return slices.Contains(s.Types, typ)
}

// String says the scope in words: `types "a", "b" (live replicas)`.
func (s AdminScope) String() string {
	var b strings.Builder
	switch {
	case s.Unknown:
		return "no type: no live relay of the app to learn its types from " +
			"(name them with relay.AdminTypes or relayctl --types, or take every type with relay.AdminAllTypes or relayctl --all-types)"
	case s.All:
		b.WriteString("every type (all apps' rows)")
	default:
		b.WriteString("types " + quoteAll(s.Types) + " (" + s.Source + ")")
	}
	var live []string
	for _, t := range s.Excluded {
		if !slices.Contains(s.Registered, t) {
			live = append(live, t)
		}
	}
	if len(live) > 0 {
		b.WriteString(" but " + quoteAll(live) + ", served by live relays of " + otherApps(s.Others, live))
	}
	if len(s.Registered) > 0 {
		b.WriteString(" but " + quoteAll(s.Registered) + ", another app's by the registry of types (" + s.registeredApps() + ")")
	}
	return b.String()
}

// registeredApps names the apps the registry gives the Registered types to.
func (s AdminScope) registeredApps() string {
	var apps []string
	for _, t := range s.Registered {
		if o, ok := s.registry[t]; ok {
			apps = append(apps, strconv.Quote(o.App))
		}
	}
	slices.Sort(apps)
	return "app " + strings.Join(slices.Compact(apps), ", ")
}

// AppOf is the app whose type typ is, as the Scope read it: another app's
// by its live relays or the registry, or "" when this scope cannot say.
func (s AdminScope) AppOf(typ string) string {
	for _, r := range s.Others {
		if r.Delivers(typ) {
			return r.App
		}
	}
	if o, ok := s.registry[typ]; ok {
		return o.App
	}
	return ""
}

func quoteAll(ss []string) string {
	q := make([]string, len(ss))
	for i, t := range ss {
		q[i] = strconv.Quote(t)
	}
	return strings.Join(q, ", ")
}

// otherApps names the apps of the relays among others that serve any of types.
func otherApps(others []Replica, types []string) string {
	var apps []string
	for _, r := range others {
		for _, t := range types {
			if r.Serves(t) {
				name := "an app whose name this role cannot read (pid " + strconv.Itoa(r.PID) + ")"
				if r.App != "" {
					name = "app " + strconv.Quote(r.App)
				}
				apps = append(apps, name)
				break
			}
		}
	}
	slices.Sort(apps)
	return strings.Join(slices.Compact(apps), ", ")
}

// ErrScopeUnknown says an Admin refused to write because no live relay of
// its app tells its types and none were named ([AdminTypes], [AdminAllTypes]).
var ErrScopeUnknown = errors.New("relay: no live relay of the app to learn its types from")

// ErrOtherApp says an Admin refused to write types that live relays of
// another app serve, or whose other apps' relays it cannot read.
var ErrOtherApp = errors.New("relay: the types are another app's")

// Scope returns the types the Admin's re-queues and purges act on: those of
// [AdminTypes], every type with [AdminAllTypes], or else its app's types:
// those the live relays of its app deliver ([Admin.Replicas]) and those the
// table's registry gives to it ([Admin.Owners]), so that an app's tools know
// its types while its relays are down. Never a type that another app's live
// relays deliver ([Admin.OtherReplicas]), nor one the registry gives to
// another app, unless that app was named with [AdminOtherApp]. With nothing
// to tell the app's types from another's (no live relay, no registry row, no
// option) it writes nothing ([AdminScope.Unknown], [ErrScopeUnknown]).
func (a *Admin) Scope(ctx context.Context) (AdminScope, error) {
	w, err := a.whose(ctx, a.types...)
	if err != nil {
		return AdminScope{}, err
	}
	return a.scopeOf(w), nil
}

// ScopeOf is [Admin.Scope] from live replicas already read with
// [Admin.Replicas], without the other apps' relays and the registry.
//
// Deprecated: Use [Admin.Scope], which also leaves alone the types that
// other apps' live relays serve, or the registry gives to other apps.
func (a *Admin) ScopeOf(reps []Replica) (AdminScope, error) {
	return a.scopeOf(whose{app: a.app, own: reps}), nil
}

// scopeOf is the scope of w: the app's live relays, the other apps' on the
// table, and the registry.
func (a *Admin) scopeOf(w whose) AdminScope {
	s := AdminScope{Replicas: w.own, Others: w.others, OtherApps: a.otherApps}
	excluded := map[string]string{} // type -> why
	var blind []Replica             // another app's relays whose types this role cannot read
	for _, r := range w.others {
		if r.App == "" {
			blind = append(blind, r)
		}
		for _, t := range r.Types {
			if r.Delivers(t) {
				excluded[t] = "live"
			}
		}
	}
	for t, o := range w.registry {
		if o.App == a.app || slices.Contains(a.otherApps, o.App) || excluded[t] != "" {
			continue
		}
		mine := false
		for _, r := range w.own {
			mine = mine || r.Delivers(t)
		}
		if !mine {
			excluded[t] = "registry"
		}
	}
	for t, why := range excluded {
		s.Excluded = append(s.Excluded, t)
		if why == "registry" {
			s.Registered = append(s.Registered, t)
		}
	}
	slices.Sort(s.Excluded)
	slices.Sort(s.Registered)
	s.registry = w.registry
	switch {
	case a.allTypes:
		s.All, s.Source = true, "all"
		if len(blind) > 0 {
			s.err = fmt.Errorf("%w: a live relay of another app (pid %d) serves types this role cannot read, so every type may include its rows: "+
				"grant this role pg_read_all_stats, or name this app's types (relay.AdminTypes, relayctl --types)", ErrOtherApp, blind[0].PID)
		}
		return s
	case a.types != nil:
		s.Types, s.Source = a.types, "explicit"
		var live, reg []string
		for _, t := range a.types {
			switch excluded[t] {
			case "live":
				live = append(live, t)
			case "registry":
				reg = append(reg, t)
			}
		}
		switch {
		case len(live) > 0:
			s.err = fmt.Errorf("%w: live relays of %s serve %s: this app (%q) may not re-queue or purge them; "+
				"run the tool as that app (relayctl --app), or name only this app's types", ErrOtherApp,
				otherApps(s.Others, live), quoteAll(live), a.app)
		case len(reg) > 0:
			s.err = fmt.Errorf("%w: the registry of types gives %s to app %s, whose relays are down: this app (%q) may not re-queue or purge "+
				"its rows unless the operator takes them over (relay.AdminOtherApp, relayctl --other-app), or runs the tool as that app (relayctl --app)",
				ErrOtherApp, quoteAll(reg), w.otherAppsText(reg), a.app)
		}
		return s
	}
	var types []string
	for _, r := range w.own {
		for _, t := range r.Types {
			if !r.Yields(t) {
				types = append(types, t)
			}
		}
	}
	types = append(types, w.registryTypes(a.app)...)
	for _, app := range a.otherApps {
		types = append(types, w.registryTypes(app)...)
	}
	slices.Sort(types)
	types = slices.Compact(types)
	switch {
	case len(types) == 0:
		s.Unknown, s.Source = true, "no live relay"
		s.err = fmt.Errorf("%w: app %q has no live relay and the registry of types names none of its types, so nothing tells its types from another app's: "+
			"name them (relay.AdminTypes, relayctl --types a,b) or take every type (relay.AdminAllTypes, relayctl --all-types)", ErrScopeUnknown, a.app)
		return s
	case len(w.own) == 0:
		s.Source = "registry"
	default:
		s.Source = "live replicas"
	}
	for _, t := range types {
		if excluded[t] == "" {
			s.Types = append(s.Types, t)
		} else if !slices.Contains(s.Excluded, t) {
			s.Excluded = append(s.Excluded, t)
		}
	}
	return s
}

// sameTable says whether the table a relay names may be the Admin's own:
// the same name, and the same schema when both name one. A relay that names
// none (an older one) may be.
func sameTable(relayTable, adminTable string) bool {
	r, err1 := store.ParseTable(relayTable)
	a, err2 := store.ParseTable(adminTable)
	if relayTable == "" || err1 != nil || err2 != nil {
		return true
	}
	if r[len(r)-1] != a[len(a)-1] {
		return false
	}
	return len(r) == 1 || len(a) == 1 || r[0] == a[0]
}

// writeScope is a scope for a statement: types nil is every type, never
// those of exclude.
type writeScope struct {
	types, exclude []string
}

// excluded is exclude as a statement takes it: never NULL.
func (w writeScope) excluded() []string {
	if w.exclude == nil {
		return []string{}
	}
	return w.exclude
}

// scope is Scope for a statement, or the reason the Admin writes nothing.
func (a *Admin) scope(ctx context.Context, requeue bool) (writeScope, error) {
	s, err := a.Scope(ctx)
	if err != nil {
		return writeScope{}, err
	}
	if s.err != nil {
		return writeScope{}, s.err
	}
	if requeue {
		if err := a.sameCeiling(s.Replicas); err != nil {
			return writeScope{}, err
		}
	}
	w := writeScope{exclude: s.Excluded}
	if !s.All {
		w.types = s.Types
		if w.types == nil {
			w.types = []string{} // none: a NULL would be every type
		}
	}
	return w, nil
}

// ErrCeilingDiffers says the live relays of the app run with another
// MaxAttempts than the Admin's: a re-queue would reset rows they still retry.
var ErrCeilingDiffers = errors.New("relay: the live relays run with another MaxAttempts than this Admin")

// sameCeiling refuses a re-queue when a live relay's ceiling is not the
// Admin's: rows it still retries would look dead (a higher one), or dead rows
// would be missed (a lower one).
func (a *Admin) sameCeiling(reps []Replica) error {
	for _, r := range reps {
		if r.MaxAttempts != a.maxAttempts {
			return fmt.Errorf("%w: replica %s (pid %d) of app %q runs with MaxAttempts %d, this Admin with %d: "+
				"set RELAY_MAX_ATTEMPTS=%d (relayctl --max-attempts %d) to agree with it",
				ErrCeilingDiffers, r.ID, r.PID, a.app, r.MaxAttempts, a.maxAttempts, r.MaxAttempts, r.MaxAttempts)
		}
	}
	return nil
}
