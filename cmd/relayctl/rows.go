package main

import (
	"context"
	"flag"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/xadm/relay"
	"github.com/xadm/relay/internal/tools/diagnose"
)

func deadFlags(fs *flag.FlagSet, o *opts) {
	fs.StringVar(&o.deadType, "type", "", "only the dead rows of this type")
	fs.Int64Var(&o.after, "after", 0, "rows after this id: the last id of the previous page")
	fs.IntVar(&o.limit, "limit", relay.DeadPageDefault, fmt.Sprintf("rows per page (1-%d)", relay.ListDeadMax))
}

type jsonDead struct {
	ID         int64     `json:"id"`
	Type       string    `json:"type"`
	Key        string    `json:"key"`
	Attempts   int       `json:"attempts"`
	Permanent  bool      `json:"permanent"`
	Made       int       `json:"attempts_made"`
	LastError  string    `json:"last_error"`
	CreatedAt  time.Time `json:"created_at"`
	UpdatedAt  time.Time `json:"updated_at"`
	Payload    string    `json:"payload_preview"`
	PayloadCut bool      `json:"payload_cut"`
	App        string    `json:"app"` // whose type: "" when nothing says
}

func runDead(ctx context.Context, e *env) int {
	if e.o.limit < 1 || e.o.limit > relay.ListDeadMax {
		return e.usageErr("--limit must be between 1 and %d, got %d", relay.ListDeadMax, e.o.limit)
	}
	if e.o.after < 0 {
		return e.usageErr("--after must not be negative, got %d", e.o.after)
	}
	page, err := e.admin.DeadPage(ctx, relay.DeadQuery{Type: e.o.deadType, AfterID: e.o.after, Limit: e.o.limit})
	if err != nil {
		return e.fail(err)
	}
	var next *int64
	if len(page) == e.o.limit {
		id := page[len(page)-1].ID
		next = &id
	}
	if e.o.json {
		rows := make([]jsonDead, 0, len(page))
		for _, d := range page {
			rows = append(rows, jsonDead{d.ID, d.Type, d.Key, d.Attempts, d.Permanent, d.AttemptsMade, d.LastError, d.CreatedAt.UTC(), d.UpdatedAt.UTC(),
				d.Payload, d.PayloadCut, d.App})
		}
		err := writeJSON(e.stdout, struct {
			Rows      []jsonDead `json:"rows"`
			NextAfter *int64     `json:"next_after"` // null on the last page
		}{rows, next})
		if err != nil {
			return e.fail(err)
		}
		return exitOK
	}

	if len(page) == 0 {
		what := "no dead rows"
		if e.o.deadType != "" {
			what += " of type " + strconv.Quote(e.o.deadType)
		}
		if e.o.after > 0 {
			what += fmt.Sprintf(" after id %d", e.o.after)
		}
		fprintf(e.stdout, "%s in %s (a row is dead at %d attempts).\n", what, e.cfg.Table, e.cfg.MaxAttempts)
		return exitOK
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 0, 2, ' ', 0)
	fprintf(tw, "id\ttype\tapp\tkey\tattempts\tdied\tlast error\tpayload\n")
	var own *relay.DeadMessage
	theirs := map[string]int{}
	for i, d := range page {
		payload := oneLine(d.Payload, 60)
		if d.PayloadCut && !strings.HasSuffix(payload, "…") {
			payload += "…"
		}
		app := d.App
		switch {
		case app == "":
			app = "?"
		case app != e.cfg.AppName:
			theirs[app]++
		case own == nil:
			own = &page[i]
		}
		fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", d.ID, d.Type, app, oneLine(d.Key, 30), diagnose.Attempts(d.Permanent, d.AttemptsMade, d.Attempts),
			stamp(d.UpdatedAt), oneLine(d.LastError, 70), payload)
	}
	_ = tw.Flush()
	fprintf(e.stdout, "(app: whose type the row is of, by the live relays or the registry of types; ?: nothing says)\n")
	if next != nil {
		more := fmt.Sprintf("relayctl dead --after %d", *next)
		if e.o.deadType != "" {
			more += " --type " + strconv.Quote(e.o.deadType)
		}
		fprintf(e.stdout, "\nnext page: %s\n", more)
	}
	for app, n := range theirs {
		fprintf(e.stdout, "%d row(s) on this page are app %q's: re-queue them as that app (relayctl --app %s), "+
			"or, while its relays are down, take them over with --other-app %s\n", n, app, app, app)
	}
	if own != nil {
		fprintf(e.stdout, "re-queue: relayctl requeue --id %d (or --type T, --all)\n", own.ID)
	}
	return exitOK
}

// idList is a repeatable --id flag of comma-separated ids.
type idList []int64

func (l *idList) String() string {
	s := make([]string, len(*l))
	for i, id := range *l {
		s[i] = strconv.FormatInt(id, 10)
	}
	return strings.Join(s, ",")
}

func (l *idList) Set(v string) error {
	for _, f := range strings.Split(v, ",") {
		id, err := strconv.ParseInt(strings.TrimSpace(f), 10, 64)
		if err != nil || id < 1 {
			return fmt.Errorf("%q is not a row id (a positive integer)", f)
		}
		*l = append(*l, id)
	}
	return nil
}

func requeueFlags(fs *flag.FlagSet, o *opts) {
	fs.Var(&o.ids, "id", "re-queue these dead rows: an id, or ids separated by commas (repeatable)")
	fs.StringVar(&o.typ, "type", "", "re-queue every dead row of this type")
	fs.BoolVar(&o.all, "all", false, "re-queue every dead row")
	scopeFlags(fs, o)
}

func runRequeue(ctx context.Context, e *env) int {
	modes := 0
	for _, set := range []bool{len(e.o.ids) > 0, e.o.typSet, e.o.all} {
		if set {
			modes++
		}
	}
	if modes != 1 {
		return e.usageErr("requeue: give exactly one of --id, --type or --all")
	}
	if len(e.o.ids) > relay.ListDeadMax {
		return e.usageErr("requeue: at most %d ids at once, got %d", relay.ListDeadMax, len(e.o.ids))
	}
	scope, code, ok := e.scope(ctx)
	if !ok {
		return code
	}
	// What it would re-queue, to confirm: the dead rows of the scope.
	var counts []relay.TypeCount
	var rows []relay.DeadMessage
	var total int64
	switch {
	case len(e.o.ids) > 0:
		page, err := e.admin.DeadRows(ctx, e.o.ids...)
		if err != nil {
			return e.fail(err)
		}
		var theirs []string
		for _, d := range page {
			switch {
			case scope.Includes(d.Type):
				rows = append(rows, d)
			case d.App != "" && d.App != e.cfg.AppName:
				how := fmt.Sprintf("its relays run: re-queue it as that app (relayctl --app %s)", d.App)
				if !slices.ContainsFunc(scope.Others, func(r relay.Replica) bool { return r.App == d.App }) {
					how = fmt.Sprintf("its relays are down: re-queue it as that app (relayctl --app %s), or take its rows over with --other-app %s", d.App, d.App)
				}
				theirs = append(theirs, fmt.Sprintf("row %d (type %q) is app %q's, not %q's; %s", d.ID, d.Type, d.App, e.cfg.AppName, how))
			}
		}
		if len(theirs) > 0 {
			fprintf(e.stderr, "relayctl requeue: nothing re-queued: %s\n", strings.Join(theirs, "; "))
			return exitError
		}
		total = int64(len(rows))
	case e.o.typSet && !scope.Includes(e.o.typ):
		_, err := e.admin.RequeueType(ctx, e.o.typ) // refused: it says why
		return e.fail(err)
	default:
		o, err := e.admin.Overview(ctx)
		if err != nil {
			return e.fail(err)
		}
		for _, t := range o.Types {
			if t.Dead > 0 && scope.Includes(t.Type) && (!e.o.typSet || t.Type == e.o.typ) {
				counts = append(counts, relay.TypeCount{Type: t.Type, Rows: t.Dead})
				total += t.Dead
			}
		}
	}
	if total == 0 {
		return e.requeued(0, scope)
	}
	if !e.o.yes {
		fprintf(e.stderr, "relayctl: re-queue %s dead row(s) of %s: status PENDING, attempts 0; the next pass delivers them:\n", num(total), e.cfg.Table)
		for _, c := range counts {
			fprintf(e.stderr, "  %s  %s\n", num(c.Rows), c.Type)
		}
		for _, d := range rows {
			fprintf(e.stderr, "  id %d  %s  %s: %s\n", d.ID, d.Type, diagnose.Attempts(d.Permanent, d.AttemptsMade, d.Attempts), oneLine(d.LastError, 80))
		}
		if n := len(e.o.ids) - len(rows); len(e.o.ids) > 0 && n > 0 {
			fprintf(e.stderr, "  (%d of the ids given: not dead, or not this app's: left alone)\n", n)
		}
	}
	if code, ok := e.confirm(ctx, "requeue", fmt.Sprintf("Re-queue these %s row(s)", num(total))); !ok {
		return code
	}
	var n int64
	var err error
	switch {
	case e.o.all:
		n, err = e.admin.RequeueAll(ctx)
	case e.o.typSet:
		n, err = e.admin.RequeueType(ctx, e.o.typ)
	default:
		n, err = e.admin.RequeueIDs(ctx, e.o.ids...)
	}
	if err != nil {
		return e.fail(err)
	}
	return e.requeued(n, scope)
}

// requeued says how many rows requeue re-queued.
func (e *env) requeued(n int64, scope relay.AdminScope) int {
	if e.o.json {
		if err := writeJSON(e.stdout, map[string]any{"requeued": n, "types": scope.Types, "all_types": scope.All,
			"excluded": scope.Excluded}); err != nil {
			return e.fail(err)
		}
		return exitOK
	}
	switch {
	case n == 0:
		fprintf(e.stdout, "nothing re-queued: no dead row of this app matched (a row is dead at %d attempts; live and SENT rows, "+
			"and other apps' types, are left alone)\n", e.cfg.MaxAttempts)
	case len(e.o.ids) > 0:
		fprintf(e.stdout, "re-queued %d of the %d row(s) given (the others were not dead, or not this app's); the next pass delivers them\n", n, len(e.o.ids))
	case e.o.typSet:
		fprintf(e.stdout, "re-queued %d dead row(s) of type %q; the next pass delivers them\n", n, e.o.typ)
	default:
		fprintf(e.stdout, "re-queued %d dead row(s); the next pass delivers them\n", n)
	}
	return exitOK
}
