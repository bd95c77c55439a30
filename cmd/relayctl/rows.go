package main

import (
	"context"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/xadm/relay"
	"github.com/xadm/relay/internal/diagnose"
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
			rows = append(rows, jsonDead{d.ID, d.Type, d.Key, d.Attempts, d.Permanent, d.AttemptsMade, d.LastError, d.CreatedAt.UTC(), d.UpdatedAt.UTC(), d.Payload, d.PayloadCut})
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
	fprintf(tw, "id\ttype\tkey\tattempts\tdied\tlast error\tpayload\n")
	for _, d := range page {
		payload := oneLine(d.Payload, 60)
		if d.PayloadCut && !strings.HasSuffix(payload, "…") {
			payload += "…"
		}
		fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\n", d.ID, d.Type, oneLine(d.Key, 30), diagnose.Attempts(d.Permanent, d.AttemptsMade, d.Attempts),
			stamp(d.UpdatedAt), oneLine(d.LastError, 70), payload)
	}
	_ = tw.Flush()
	if next != nil {
		more := fmt.Sprintf("relayctl dead --after %d", *next)
		if e.o.deadType != "" {
			more += " --type " + strconv.Quote(e.o.deadType)
		}
		fprintf(e.stdout, "\nnext page: %s\n", more)
	}
	fprintf(e.stdout, "re-queue: relayctl requeue --id %d (or --type T, --all)\n", page[0].ID)
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
	scope, err := e.scope(ctx)
	if err != nil {
		return e.fail(err)
	}
	var n int64
	var what string
	switch {
	case e.o.all:
		n, err = e.admin.RequeueAll(ctx)
		what = "dead row(s)"
	case e.o.typSet:
		n, err = e.admin.RequeueType(ctx, e.o.typ)
		what = fmt.Sprintf("dead row(s) of type %q", e.o.typ)
	default:
		n, err = e.admin.RequeueIDs(ctx, e.o.ids...)
		what = fmt.Sprintf("of the %d row(s) given", len(e.o.ids))
	}
	if err != nil {
		return e.fail(err)
	}
	if e.o.json {
		if err := writeJSON(e.stdout, map[string]any{"requeued": n, "types": scope.Types, "all_types": scope.All}); err != nil {
			return e.fail(err)
		}
		return exitOK
	}
	switch {
	case n == 0:
		fprintf(e.stdout, "nothing re-queued: no dead row matched (a row is dead at %d attempts; live and SENT rows are left alone)\n", e.cfg.MaxAttempts)
	case len(e.o.ids) > 0:
		fprintf(e.stdout, "re-queued %d %s (the others were not dead); the next pass delivers them\n", n, what)
	default:
		fprintf(e.stdout, "re-queued %d %s; the next pass delivers them\n", n, what)
	}
	return exitOK
}
