package console

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/xadm/relay"
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

// requeue re-queues one dead row (id), a type's (type) or all (all=1).
func (c *Console) requeue(w http.ResponseWriter, r *http.Request) {
	i, s := c.action(w, r, "requeue")
	if s == nil {
		return
	}
	v := viewerOf(r.Context())
	id, typ, all := strings.TrimSpace(r.PostFormValue("id")), r.PostFormValue("type"), r.PostFormValue("all") == "1"
	var (
		n     int64
		err   error
		scope []slog.Attr
	)
	switch {
	case id != "" && typ == "" && !all:
		rowID, perr := strconv.ParseInt(id, 10, 64)
		if perr != nil || rowID < 1 {
			c.errorPage(w, r, http.StatusBadRequest, fmt.Sprintf("id=%q is not a row id.", id), v.who)
			return
		}
		n, err = s.Admin.RequeueIDs(r.Context(), rowID)
		scope = []slog.Attr{slog.Int64("id", rowID)}
	case typ != "" && id == "" && !all:
		n, err = s.Admin.RequeueType(r.Context(), typ)
		scope = []slog.Attr{slog.String("type", typ)}
	case all && id == "" && typ == "":
		n, err = s.Admin.RequeueAll(r.Context())
		scope = []slog.Attr{slog.Bool("all", true)}
	default:
		c.errorPage(w, r, http.StatusBadRequest, "Re-queue takes one of id, type or all.", v.who)
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
	back := "app"
	if r.PostFormValue("back") == "dead" {
		back = "dead"
	}
	c.redirect(w, back, i, "requeued", n, r.PostFormValue("type_filter"))
}

// purgeUnits are the units of the purge form's age.
var purgeUnits = map[string]time.Duration{"days": 24 * time.Hour, "hours": time.Hour, "minutes": time.Minute}

// purge deletes the SENT rows delivered longer ago than age (in unit).
func (c *Console) purge(w http.ResponseWriter, r *http.Request) {
	i, s := c.action(w, r, "purge")
	if s == nil {
		return
	}
	v := viewerOf(r.Context())
	age, err := strconv.ParseFloat(strings.TrimSpace(r.PostFormValue("age")), 64)
	unit, okUnit := purgeUnits[r.PostFormValue("unit")]
	if err != nil || age < 0 || !okUnit {
		c.errorPage(w, r, http.StatusBadRequest,
			fmt.Sprintf("Purge needs an age of 0 or more and a unit (days, hours or minutes), got %q %q.", r.PostFormValue("age"), r.PostFormValue("unit")), v.who)
		return
	}
	retention := time.Duration(age * float64(unit))
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

// refused says err is the Admin declining to act (no scope, another
// ceiling), which the operator fixes, not a failure of the console.
func refused(err error) bool {
	return errors.Is(err, relay.ErrCeilingDiffers)
}
