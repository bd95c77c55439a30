package console

import (
	"bytes"
	"context"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/xadm/relay"
	"github.com/xadm/relay/internal/tools/diagnose"
)

// viewer is who asks, as Authorize said, and the session's token.
type viewer struct {
	who    string
	canAct bool
	token  string
}

type viewerKey struct{}

func withViewer(ctx context.Context, v viewer) context.Context {
	return context.WithValue(ctx, viewerKey{}, v)
}

func viewerOf(ctx context.Context) viewer {
	v, _ := ctx.Value(viewerKey{}).(viewer)
	return v
}

// page is what every template gets.
type page struct {
	Title   string
	Who     string
	CanAct  bool // this viewer may act (Actions on and Authorize said so)
	Actions bool // the console offers actions at all
	Token   string
	Nav     []navItem
	Flash   string
	Took    time.Duration // reading the database
	Content any
}

type navItem struct {
	Index      int
	App, Table string
	Current    bool
}

func (c *Console) newPage(r *http.Request, title string, current int) page {
	v := viewerOf(r.Context())
	p := page{Title: title, Who: v.who, CanAct: v.canAct, Actions: c.opts.Actions, Token: v.token}
	for i, s := range c.sources {
		p.Nav = append(p.Nav, navItem{Index: i, App: s.Admin.AppName(), Table: s.Admin.Table(), Current: i == current})
	}
	return p
}

// render writes the page with the template name, or an error page if it fails.
func (c *Console) render(w http.ResponseWriter, r *http.Request, status int, name string, p page) {
	var b bytes.Buffer
	if err := c.pages[name].ExecuteTemplate(&b, "layout", p); err != nil {
		c.logger.LogAttrs(r.Context(), slog.LevelError, "relay console: render", slog.String("page", name), slog.Any("error", err))
		http.Error(w, "relay console: the page could not be rendered: "+err.Error(), http.StatusInternalServerError)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Frame-Options", "DENY") // no clickjacking of the action buttons
	h.Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; img-src data:; form-action 'self'; frame-ancestors 'none'")
	w.WriteHeader(status)
	_, _ = w.Write(b.Bytes())
}

func (c *Console) errorPage(w http.ResponseWriter, r *http.Request, status int, msg, who string) {
	p := page{Title: http.StatusText(status), Who: who, Content: msg}
	c.render(w, r, status, "error", p)
}

// sourceOf returns the source the query's s names (0 by default).
func (c *Console) sourceOf(w http.ResponseWriter, r *http.Request) (int, *source, bool) {
	i := 0
	if v := r.FormValue("s"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			c.errorPage(w, r, http.StatusBadRequest, fmt.Sprintf("s=%q is not an app number.", cut(v)), viewerOf(r.Context()).who)
			return 0, nil, false
		}
		if n < 0 || n >= len(c.sources) {
			c.errorPage(w, r, http.StatusNotFound, fmt.Sprintf("No app number %d here.", n), viewerOf(r.Context()).who)
			return 0, nil, false
		}
		i = n
	}
	return i, c.sources[i], true
}

// look reads s once and diagnoses it against the console's earlier look.
func (c *Console) look(ctx context.Context, s *source) (diagnose.Look, diagnose.Diagnosis, error) {
	o, err := s.Admin.Overview(ctx)
	if err != nil {
		return diagnose.Look{}, diagnose.Diagnosis{}, err
	}
	h, err := s.Admin.Election(ctx)
	if err != nil {
		return diagnose.Look{}, diagnose.Diagnosis{}, err
	}
	reps, err := s.Admin.Replicas(ctx)
	if err != nil {
		return diagnose.Look{}, diagnose.Diagnosis{}, err
	}
	var types []string
	for _, t := range o.Types {
		types = append(types, t.Type)
	}
	others, err := s.Admin.OtherReplicas(ctx, types...)
	if err != nil {
		return diagnose.Look{}, diagnose.Diagnosis{}, err
	}
	now := diagnose.Look{Overview: o, Holders: h, Replicas: reps, PresenceKnown: true, Others: others}
	in := diagnose.Input{Now: now, StallAfter: c.opts.StallAfter}
	if s.Relay != nil {
		st := s.Relay.Stats()
		in.Stats = &st
		s.sample(st, time.Now())
	}
	s.mu.Lock()
	if s.last != nil {
		if age := o.At.Sub(s.last.Overview.At); age >= time.Second && age <= lookMemory {
			in.Before = s.last
		}
	}
	// Keep the older look while it is young, so that quick reloads compare
	// with a look far enough apart to tell.
	if in.Before == nil || o.At.Sub(s.last.Overview.At) > 5*time.Second {
		s.last = &now
	}
	s.mu.Unlock()
	return now, diagnose.Diagnose(in), nil
}

// sourceView is one source's overview for the templates.
type sourceView struct {
	Index   int
	O       relay.Overview
	D       diagnose.Diagnosis
	Holders []holderView
	Stats   *statsView
	// Replicas are the app's live relays, Others the other apps' on the
	// table; Scope says which types the actions write (Admin.Scope), and
	// ScopeErr why none, when none.
	Replicas []replicaView
	Others   []replicaView
	Scope    relay.AdminScope
	ScopeErr string
}

// PausedOf is the pause of typ by a live relay of the app, or nil.
func (v sourceView) PausedOf(typ string) *relay.PausedType {
	for _, r := range v.Replicas {
		for i := range r.Paused {
			if r.Paused[i].Type == typ {
				return &r.Paused[i]
			}
		}
	}
	return nil
}

// Acts says whether the actions may write rows of typ.
func (v sourceView) Acts(typ string) bool { return v.Scope.Includes(typ) }

type replicaView struct {
	relay.Replica
	Description string
}

type holderView struct {
	relay.LockHolder
	Description    string
	PartitionsText string // a partitioned member's: "0-3, 8 of 16"
}

type statsView struct {
	relay.Stats
	LastErr string
}

func newSourceView(i int, s *source, l diagnose.Look, d diagnose.Diagnosis, scope relay.AdminScope) sourceView {
	v := sourceView{Index: i, O: l.Overview, D: d, Scope: scope}
	if err := scope.Err(); err != nil {
		v.ScopeErr = err.Error()
	}
	for _, h := range l.Holders {
		v.Holders = append(v.Holders, holderView{LockHolder: h, Description: diagnose.Holder(h),
			PartitionsText: strings.TrimPrefix(diagnose.PartitionsText(h.Partitions, h.PartitionsOf), "partitions ")})
	}
	for _, r := range l.Replicas {
		v.Replicas = append(v.Replicas, replicaView{Replica: r, Description: diagnose.Replica(r)})
	}
	for _, r := range l.Others {
		v.Others = append(v.Others, replicaView{Replica: r, Description: diagnose.Replica(r)})
	}
	if s.Relay != nil {
		st := s.Relay.Stats()
		v.Stats = &statsView{Stats: st}
		if st.LastPassErr != nil {
			v.Stats.LastErr = st.LastPassErr.Error()
		}
	}
	return v
}

// index shows every source at a glance; with one source, its page.
func (c *Console) index(w http.ResponseWriter, r *http.Request) {
	if len(c.sources) == 1 {
		c.app(w, r)
		return
	}
	start := time.Now()
	var views []sourceView
	for i, s := range c.sources {
		l, d, err := c.look(r.Context(), s)
		if err != nil {
			c.dbError(w, r, err)
			return
		}
		views = append(views, newSourceView(i, s, l, d, relay.AdminScope{}))
	}
	p := c.newPage(r, "relay console", -1)
	p.Took, p.Content = time.Since(start), views
	c.render(w, r, http.StatusOK, "index", p)
}

// app shows one source: the diagnosis, the counts, the election, the stats
// and the actions.
func (c *Console) app(w http.ResponseWriter, r *http.Request) {
	i, s, ok := c.sourceOf(w, r)
	if !ok {
		return
	}
	start := time.Now()
	l, d, err := c.look(r.Context(), s)
	if err != nil {
		c.dbError(w, r, err)
		return
	}
	scope, err := s.Admin.Scope(r.Context())
	if err != nil {
		c.dbError(w, r, err)
		return
	}
	p := c.newPage(r, s.Admin.AppName()+" · "+s.Admin.Table(), i)
	p.Took, p.Content = time.Since(start), newSourceView(i, s, l, d, scope)
	p.Flash = flash(r)
	c.render(w, r, http.StatusOK, "app", p)
}

// deadView is a page of dead rows.
type deadView struct {
	Index     int
	App       string
	Table     string
	Ceiling   int
	Type      string // the filter; "" for all
	After     int64
	Rows      []relay.DeadMessage
	NextAfter int64 // 0 on the last page
	Types     []string
	Scope     relay.AdminScope // which rows the buttons may re-queue
}

// Acts says whether the actions may write rows of typ.
func (v deadView) Acts(typ string) bool { return v.Scope.Includes(typ) }

func (c *Console) dead(w http.ResponseWriter, r *http.Request) {
	i, s, ok := c.sourceOf(w, r)
	if !ok {
		return
	}
	q := relay.DeadQuery{Type: r.FormValue("type"), Limit: c.opts.PageSize}
	if _, set := r.Form["type"]; set {
		if msg := checkText(q.Type); msg != "" {
			c.badRequest(w, r, fmt.Sprintf("type=%q %s: give a message type, or none for every type.", cut(q.Type), msg))
			return
		}
	}
	if v := r.FormValue("after"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			c.badRequest(w, r, fmt.Sprintf("after=%q is not a row id (an integer, 0 or more).", cut(v)))
			return
		}
		q.AfterID = n
	}
	if v := r.FormValue("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > relay.ListDeadMax {
			c.badRequest(w, r, fmt.Sprintf("limit=%q is not a page size: from 1 to %d rows.", cut(v), relay.ListDeadMax))
			return
		}
		q.Limit = n
	}
	start := time.Now()
	rows, err := s.Admin.DeadPage(r.Context(), q)
	if err != nil {
		c.dbError(w, r, err)
		return
	}
	// The type links come from the console's last look at the source, when
	// it has one: navigation need not cost a count.
	s.mu.Lock()
	last := s.last
	s.mu.Unlock()
	var o relay.Overview
	if last != nil {
		o = last.Overview
	} else if o, err = s.Admin.Overview(r.Context()); err != nil {
		c.dbError(w, r, err)
		return
	}
	scope, err := s.Admin.Scope(r.Context())
	if err != nil {
		c.dbError(w, r, err)
		return
	}
	v := deadView{Index: i, App: s.Admin.AppName(), Table: s.Admin.Table(), Ceiling: s.Admin.MaxAttempts(),
		Type: q.Type, After: q.AfterID, Rows: rows, Scope: scope}
	if len(rows) == q.Limit {
		v.NextAfter = rows[len(rows)-1].ID
	}
	for _, t := range o.Types {
		if t.Dead > 0 || t.Type == q.Type {
			v.Types = append(v.Types, t.Type)
		}
	}
	p := c.newPage(r, "dead rows · "+s.Admin.AppName(), i)
	p.Took, p.Content = time.Since(start), v
	p.Flash = flash(r)
	c.render(w, r, http.StatusOK, "dead", p)
}

// charts draws one source's last hour: per type, the rows delivered per
// minute and the lag, from Admin.History; and this process's relay's
// deliveries, from its Stats sampled at each view.
func (c *Console) charts(w http.ResponseWriter, r *http.Request) {
	i, s, ok := c.sourceOf(w, r)
	if !ok {
		return
	}
	start := time.Now()
	h, cached, err := s.cachedHistory(r.Context(), start)
	if err != nil {
		c.dbError(w, r, err)
		return
	}
	v := newChartsView(i, s, h)
	v.Cached = cached
	if s.Relay != nil {
		st := s.Relay.Stats()
		v.Process = newProcessView(st, s.sample(st, time.Now()), time.Now())
	}
	p := c.newPage(r, "charts · "+s.Admin.AppName(), i)
	p.Took, p.Content = time.Since(start), v
	c.render(w, r, http.StatusOK, "charts", p)
}

// dbError answers a failed read.
func (c *Console) dbError(w http.ResponseWriter, r *http.Request, err error) {
	c.logger.LogAttrs(r.Context(), slog.LevelError, "relay console: read failed", slog.String("path", r.URL.Path), slog.Any("error", err))
	c.errorPage(w, r, http.StatusInternalServerError, "The database could not be read: "+err.Error(), viewerOf(r.Context()).who)
}

// flash is the message of an action's redirect, built from codes only: the
// query never carries text that the page would show.
func flash(r *http.Request) string {
	n, _ := strconv.ParseInt(r.FormValue("n"), 10, 64)
	switch r.FormValue("done") {
	case "requeued":
		if n == 0 {
			return "Nothing was re-queued: no dead row matched (another operator may have re-queued it)."
		}
		return fmt.Sprintf("Re-queued %s dead row(s): the next pass delivers them.", diagnose.Count(n))
	case "purged":
		return fmt.Sprintf("Purged %s SENT row(s).", diagnose.Count(n))
	}
	return ""
}

func parseTemplates() (map[string]*template.Template, error) {
	funcs := template.FuncMap{
		"dur":   diagnose.Duration,
		"count": diagnose.Count,
		"stamp": func(t time.Time) string {
			if t.IsZero() {
				return "-"
			}
			return t.UTC().Format("2006-01-02 15:04:05Z")
		},
		"ago": func(at, t time.Time) string {
			if t.IsZero() {
				return "-"
			}
			return diagnose.Duration(at.Sub(t)) + " ago"
		},
		"cut": diagnose.Cut,
		"attempts": func(d relay.DeadMessage) string {
			return diagnose.Attempts(d.Permanent, d.AttemptsMade, d.Attempts)
		},
		"died": diagnose.Died,
		"head": func(d relay.DeadMessage) relay.RowHead {
			return relay.RowHead{ID: d.ID, Status: "ERROR", Attempts: d.Attempts, Permanent: d.Permanent, AttemptsMade: d.AttemptsMade}
		},
		"code":  codeSpans,
		"upper": strings.ToUpper,
		"ms": func(d time.Duration) string {
			return strconv.FormatFloat(float64(d.Microseconds())/1000, 'f', 1, 64) + " ms"
		},
		"str": func(v any) string { return fmt.Sprint(v) },
	}
	layout, err := fs.ReadFile(templateFS, "templates/layout.html")
	if err != nil {
		return nil, err
	}
	pages := make(map[string]*template.Template)
	for _, name := range []string{"index", "app", "dead", "error", "confirm", "charts"} {
		body, err := fs.ReadFile(templateFS, "templates/"+name+".html")
		if err != nil {
			return nil, err
		}
		t, err := template.New(name).Funcs(funcs).Parse(string(layout))
		if err == nil {
			_, err = t.Parse(string(body))
		}
		if err != nil {
			return nil, fmt.Errorf("console: template %s: %w", name, err)
		}
		pages[name] = t
	}
	return pages, nil
}

// codeSpans writes text with its `quoted` commands as code, the rest
// escaped: a diagnosis quotes what to run between backticks.
func codeSpans(text string) template.HTML {
	var b strings.Builder
	parts := strings.Split(text, "`")
	for i, part := range parts {
		switch {
		case i%2 == 1 && i == len(parts)-1: // a backtick left open: as it is
			b.WriteString(template.HTMLEscapeString("`" + part))
		case i%2 == 1:
			b.WriteString("<code>" + template.HTMLEscapeString(part) + "</code>")
		default:
			b.WriteString(template.HTMLEscapeString(part))
		}
	}
	return template.HTML(b.String())
}
