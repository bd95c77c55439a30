package console

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/xadm/relay"
	"github.com/xadm/relay/internal/tools/diagnose"
)

// action checks that r may act and returns its source; otherwise it answers
// and returns nil. Cross-origin requests never get here: the
// CrossOriginProtection in front of the mux refuses them.
func (c *Console) action(w http.ResponseWriter, r *http.Request, name string) (int, *source) {
	v := viewerOf(r.Context())
	refuse := func(status int, reason, msg string) {
		c.logger.LogAttrs(r.Context(), slog.LevelWarn, "relay console: refused: "+reason,
			slog.String("who", v.who), slog.String("action", name), slog.String("remote", r.RemoteAddr))
		c.errorPage(w, r, status, msg, v.who)
	}
	switch {
	case !c.opts.Actions:
		refuse(http.StatusForbidden, "actions are off", "Refused: this console is read-only (the service did not turn actions on).")
		return 0, nil
	case !v.canAct:
		refuse(http.StatusForbidden, "may not act", fmt.Sprintf("Refused: %s may see this console but not act on it.", v.who))
		return 0, nil
	case !tokenOK(r):
		refuse(http.StatusForbidden, "missing or wrong session token",
			"Refused: the form's session token is missing or stale. Reload the console's page and try again.")
		return 0, nil
	}
	i, s, ok := c.sourceOf(w, r)
	if !ok {
		return 0, nil
	}
	return i, s
}

// badRequest answers a request whose input makes no sense: 400, a page that
// says which value and why, and no ERROR log (nothing failed on our side).
func (c *Console) badRequest(w http.ResponseWriter, r *http.Request, msg string) {
	c.errorPage(w, r, http.StatusBadRequest, msg, viewerOf(r.Context()).who)
}

// checkText says what is wrong with v as a value PostgreSQL stores (a type),
// or "": a NUL byte or invalid UTF-8 would fail the statement, blank names
// nothing.
func checkText(v string) string {
	switch {
	case !utf8.ValidString(v):
		return "is not valid UTF-8"
	case strings.ContainsRune(v, 0):
		return "contains a NUL byte"
	case strings.TrimSpace(v) == "":
		return "is blank"
	}
	return ""
}

// confirmed says the form is the second POST of a confirmation: the first
// shows what would change, the second (confirm=1) acts.
func confirmed(r *http.Request) bool { return r.PostFormValue("confirm") == "1" }

// confirmView is the page between the first POST of an action and its second.
type confirmView struct {
	Index   int
	App     string
	Table   string
	Ceiling int
	Action  string // "requeue" or "purge": the form's action
	Title   string
	Lead    string
	Types   []relay.TypeCount
	Dead    []relay.DeadMessage // the rows of a re-queue by id
	Rows    int64
	Exact   bool
	Note    string
	Button  string
	Back    string      // the page Cancel returns to
	Fields  [][2]string // the hidden fields the second POST repeats, with confirm=1
	start   time.Time   // when the count began, for the page's footer
}

func (c *Console) confirm(w http.ResponseWriter, r *http.Request, i int, s *source, v confirmView) {
	v.Index, v.App, v.Table, v.Ceiling = i, s.Admin.AppName(), s.Admin.Table(), s.Admin.MaxAttempts()
	if v.Back == "" {
		v.Back = "./app?s=" + strconv.Itoa(i)
	}
	p := c.newPage(r, v.Title+" · "+s.Admin.AppName(), i)
	p.Took, p.Content = time.Since(v.start), v
	c.render(w, r, http.StatusOK, "confirm", p)
}

// requeue re-queues one dead row (id), a type's (type) or all (all=1), each
// after a confirmation that says which rows.
func (c *Console) requeue(w http.ResponseWriter, r *http.Request) {
	i, s := c.action(w, r, "requeue")
	if s == nil {
		return
	}
	v := viewerOf(r.Context())
	id, typ, all := strings.TrimSpace(r.PostFormValue("id")), r.PostFormValue("type"), r.PostFormValue("all")
	_, hasType := r.PostForm["type"]
	if all != "" && all != "1" {
		c.badRequest(w, r, fmt.Sprintf("all=%q: re-queue all takes all=1.", cut(all)))
		return
	}
	back := "app"
	if r.PostFormValue("back") == "dead" {
		back = "dead"
	}
	filter := r.PostFormValue("type_filter")
	if checkText(filter) != "" {
		filter = ""
	}
	var (
		n     int64
		err   error
		scope []slog.Attr
		cv    = confirmView{Action: "requeue", Exact: true, Fields: [][2]string{{"back", back}, {"type_filter", filter}}, start: time.Now(),
			Note: "Counted now; rows that die before you confirm are re-queued too. A re-queued row arrives after any later message of its key that was delivered while it was dead."}
	)
	if back == "dead" {
		cv.Back = "./dead?" + url.Values{"s": {strconv.Itoa(i)}, "type": {filter}}.Encode()
		if filter == "" {
			cv.Back = "./dead?s=" + strconv.Itoa(i)
		}
	}
	switch {
	case id != "" && !hasType && all == "":
		rowID, perr := strconv.ParseInt(id, 10, 64)
		if perr != nil || rowID < 1 {
			c.badRequest(w, r, fmt.Sprintf("id=%q is not a row id (a positive integer).", cut(id)))
			return
		}
		if !confirmed(r) {
			sc, ok := c.scopeFor(w, r, "requeue", s)
			if !ok {
				return
			}
			rows, err := s.Admin.DeadRows(r.Context(), rowID)
			if err != nil {
				c.dbError(w, r, err)
				return
			}
			cv.Title, cv.Button = "Re-queue a dead row", "Re-queue it"
			cv.Fields = append(cv.Fields, [2]string{"id", id})
			if len(rows) == 1 && sc.Includes(rows[0].Type) {
				cv.Dead, cv.Rows = rows, 1
				cv.Lead = fmt.Sprintf("Re-queue row %d (type %q) of %s: status PENDING, attempts 0; the next pass delivers it.", rowID, rows[0].Type, s.Admin.Table())
			} else {
				cv.Lead = fmt.Sprintf("Row %d of %s is not a dead row of %s: confirming changes nothing.", rowID, s.Admin.Table(), sc)
			}
			c.confirm(w, r, i, s, cv)
			return
		}
		n, err = s.Admin.RequeueIDs(r.Context(), rowID)
		scope = []slog.Attr{slog.Int64("id", rowID)}
	case hasType && id == "" && all == "":
		if msg := checkText(typ); msg != "" {
			c.badRequest(w, r, fmt.Sprintf("type=%q %s: give a message type.", cut(typ), msg))
			return
		}
		if !confirmed(r) {
			cv.Title, cv.Button = "Re-queue the dead rows of "+typ, "Re-queue them"
			cv.Fields = append(cv.Fields, [2]string{"type", typ})
			if !c.countDead(w, r, s, &cv, func(t string) bool { return t == typ }) {
				return
			}
			c.confirm(w, r, i, s, cv)
			return
		}
		n, err = s.Admin.RequeueType(r.Context(), typ)
		scope = []slog.Attr{slog.String("type", typ)}
	case all == "1" && id == "" && !hasType:
		if !confirmed(r) {
			cv.Title, cv.Button = "Re-queue all dead rows", "Re-queue them"
			cv.Fields = append(cv.Fields, [2]string{"all", "1"})
			if !c.countDead(w, r, s, &cv, func(string) bool { return true }) {
				return
			}
			c.confirm(w, r, i, s, cv)
			return
		}
		n, err = s.Admin.RequeueAll(r.Context())
		scope = []slog.Attr{slog.Bool("all", true)}
	default:
		c.badRequest(w, r, "Re-queue takes one of id, type or all.")
		return
	}
	if err != nil {
		c.actionFailed(w, r, "requeue", s, err)
		return
	}
	attrs := append([]slog.Attr{slog.String("who", v.who), slog.String("action", "requeue"),
		slog.String("app", s.Admin.AppName()), slog.String("table", s.Admin.Table()), slog.Int64("requeued", n),
		slog.String("remote", r.RemoteAddr)}, scope...)
	c.logger.LogAttrs(r.Context(), slog.LevelInfo, "relay console: re-queued dead rows", attrs...)
	c.redirect(w, back, i, "requeued", n, filter)
}

// scopeFor reads what s's Admin may write, or answers why nothing (no live
// relay to learn the app's types from, another app's types) and returns false.
func (c *Console) scopeFor(w http.ResponseWriter, r *http.Request, name string, s *source) (relay.AdminScope, bool) {
	sc, err := s.Admin.Scope(r.Context())
	if err != nil {
		c.dbError(w, r, err)
		return sc, false
	}
	if err := sc.Err(); err != nil {
		c.actionFailed(w, r, name, s, err)
		return sc, false
	}
	return sc, true
}

// countDead fills cv with the dead rows of the Admin's scope whose type
// match keeps, by type, for a confirmation; false when it answered.
func (c *Console) countDead(w http.ResponseWriter, r *http.Request, s *source, cv *confirmView, match func(string) bool) bool {
	sc, ok := c.scopeFor(w, r, "requeue", s)
	if !ok {
		return false
	}
	o, err := s.Admin.Overview(r.Context())
	if err != nil {
		c.dbError(w, r, err)
		return false
	}
	for _, t := range o.Types {
		if t.Dead > 0 && sc.Includes(t.Type) && match(t.Type) {
			cv.Types = append(cv.Types, relay.TypeCount{Type: t.Type, Rows: t.Dead})
			cv.Rows += t.Dead
		}
	}
	cv.Lead = fmt.Sprintf("Re-queue %s dead row(s) of %s, of %s: status PENDING, attempts 0; the next pass delivers them.",
		diagnose.Count(cv.Rows), s.Admin.Table(), sc)
	return true
}

// purgeUnits are the units of the purge form's age.
var purgeUnits = map[string]time.Duration{"days": 24 * time.Hour, "hours": time.Hour, "minutes": time.Minute}

// purgeAge reads the purge form's age and unit as a retention, or says what
// is wrong with them: an age must be a finite number, 0 or more, and short
// enough for a time.Duration (about 292 years).
func purgeAge(r *http.Request) (time.Duration, string) {
	raw, rawUnit := r.PostFormValue("age"), r.PostFormValue("unit")
	unit, ok := purgeUnits[rawUnit]
	if !ok {
		return 0, fmt.Sprintf("unit=%q: the unit is days, hours or minutes.", cut(rawUnit))
	}
	age, err := strconv.ParseFloat(strings.TrimSpace(raw), 64)
	switch {
	case err != nil && !errors.Is(err, strconv.ErrRange), math.IsNaN(age):
		return 0, fmt.Sprintf("age=%q is not a number: give an age of 0 or more %s.", cut(raw), rawUnit)
	case age < 0:
		return 0, fmt.Sprintf("age=%q is negative: give an age of 0 or more %s.", cut(raw), rawUnit)
	case age*float64(unit) >= math.MaxInt64:
		return 0, fmt.Sprintf("age=%q %s is too long: at most %d %s.", cut(raw), rawUnit, int64(math.MaxInt64/unit), rawUnit)
	}
	return time.Duration(age * float64(unit)), ""
}

// purge deletes the SENT rows delivered longer ago than age (in unit), after
// a confirmation that says how many of which types.
func (c *Console) purge(w http.ResponseWriter, r *http.Request) {
	i, s := c.action(w, r, "purge")
	if s == nil {
		return
	}
	v := viewerOf(r.Context())
	retention, msg := purgeAge(r)
	if msg != "" {
		c.badRequest(w, r, "Purge needs an age and a unit: "+msg)
		return
	}
	if !confirmed(r) {
		start := time.Now()
		sc, ok := c.scopeFor(w, r, "purge", s)
		if !ok {
			return
		}
		est, err := s.Admin.EstimatePurge(r.Context(), retention)
		if err != nil {
			c.dbError(w, r, err)
			return
		}
		about := ""
		if !est.Exact {
			about = "about "
		}
		cv := confirmView{Action: "purge", Title: "Purge delivered rows", Rows: est.Rows, Exact: est.Exact, Types: est.Types,
			Button: "Purge them", Fields: [][2]string{{"age", r.PostFormValue("age")}, {"unit", r.PostFormValue("unit")}}, start: start}
		cv.Lead = fmt.Sprintf("Delete %s%s SENT row(s) of %s, of %s, delivered before %s (more than %s %s ago), in chunks of %s.",
			about, diagnose.Count(est.Rows), s.Admin.Table(), sc, est.Cutoff.UTC().Format("2006-01-02 15:04:05Z"),
			strings.TrimSpace(r.PostFormValue("age")), r.PostFormValue("unit"), diagnose.Count(relay.PurgeChunk))
		if est.Exact {
			cv.Note = "Counted now. Live and dead rows are never purged."
		} else {
			cv.Note = fmt.Sprintf("Estimated from a sample of %s of the table's %s pages: the table is too large to count. Live and dead rows are never purged.",
				diagnose.Count(est.SampledPages), diagnose.Count(est.Pages))
		}
		c.confirm(w, r, i, s, cv)
		return
	}
	start := time.Now()
	n, err := s.Admin.PurgeSent(r.Context(), retention)
	if refused(err) {
		c.actionFailed(w, r, "purge", s, err)
		return
	}
	if err != nil {
		// A purge stopped half-way deleted some rows: say how many.
		c.logger.LogAttrs(r.Context(), slog.LevelError, "relay console: purge failed",
			slog.String("who", v.who), slog.String("app", s.Admin.AppName()), slog.String("table", s.Admin.Table()),
			slog.Duration("older_than", retention), slog.Int64("purged", n), slog.Any("error", err))
		c.errorPage(w, r, http.StatusInternalServerError, fmt.Sprintf("The purge stopped after %d row(s): %v", n, err), v.who)
		return
	}
	c.logger.LogAttrs(r.Context(), slog.LevelInfo, "relay console: purged SENT rows",
		slog.String("who", v.who), slog.String("action", "purge"), slog.String("app", s.Admin.AppName()),
		slog.String("table", s.Admin.Table()), slog.Duration("older_than", retention), slog.Int64("purged", n),
		slog.Duration("took", time.Since(start)), slog.String("remote", r.RemoteAddr))
	c.redirect(w, "app", i, "purged", n, "")
}

// cut shortens a value quoted back in an error page.
func cut(v string) string { return diagnose.Cut(v, 80) }

func (c *Console) actionFailed(w http.ResponseWriter, r *http.Request, name string, s *source, err error) {
	v := viewerOf(r.Context())
	if refused(err) {
		c.logger.LogAttrs(r.Context(), slog.LevelWarn, "relay console: action refused",
			slog.String("who", v.who), slog.String("action", name), slog.String("app", s.Admin.AppName()), slog.Any("error", err))
		c.errorPage(w, r, http.StatusConflict, "The action was refused: "+err.Error(), v.who)
		return
	}
	c.logger.LogAttrs(r.Context(), slog.LevelError, "relay console: action failed",
		slog.String("who", v.who), slog.String("action", name), slog.String("app", s.Admin.AppName()), slog.Any("error", err))
	c.errorPage(w, r, http.StatusInternalServerError, "The action failed: "+err.Error(), v.who)
}

// redirect answers an action with 303 See Other to a page, relative to the
// console's own path so that it holds whatever prefix the console is
// mounted at (http.Redirect would resolve it against the stripped path).
func (c *Console) redirect(w http.ResponseWriter, page string, i int, done string, n int64, typeFilter string) {
	q := url.Values{"s": {strconv.Itoa(i)}, "done": {done}, "n": {strconv.FormatInt(n, 10)}}
	if page == "dead" && typeFilter != "" {
		q.Set("type", typeFilter)
	}
	w.Header().Set("Location", "./"+page+"?"+q.Encode())
	w.WriteHeader(http.StatusSeeOther)
}

// refused says err is the Admin declining to act (no types to act on,
// another app's types, another ceiling), which the operator fixes, not a
// failure of the console.
func refused(err error) bool {
	return errors.Is(err, relay.ErrCeilingDiffers) || errors.Is(err, relay.ErrScopeUnknown) || errors.Is(err, relay.ErrOtherApp)
}
