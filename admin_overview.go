package relay

import (
	"context"
	"fmt"
	"slices"
	"time"
)

// Overview is one app's table at a glance, as [Admin.Overview] reads it: its
// rows by type and state, how far behind delivery is, and whether the server
// accepts the writes that record outcomes.
type Overview struct {
	AppName     string
	Table       string
	MaxAttempts int       // the ceiling at which a row is dead
	At          time.Time // the database's clock when it was read; every age is measured on it

	// Types has one entry per type with outbound rows that are not SENT (and,
	// when SENT rows are counted exactly, per type with SENT rows), by type:
	// the app's types, and those nothing says are another app's.
	Types []TypeOverview
	// OtherApps are the types another app's: its live relays deliver them,
	// or, while its relays are down, the table's registry gives them to it
	// ([Admin.Owners]). Each has its App; none is counted in the totals below.
	OtherApps []TypeOverview

	Pending  int64         // the Types' Pending rows
	Retrying int64         // the Types' Retrying rows
	Backoff  int64         // the Types' Backoff rows: retrying rows not due yet
	Dead     int64         // the Types' Dead rows
	Lag      time.Duration // the largest of the Types' Lag: how long the relays have kept a row waiting
	Age      time.Duration // the largest of the Types' Age: how long the oldest message not yet delivered has waited

	// Sent is how many outbound SENT rows the table holds. On a small table it
	// is counted (and so is each type's); on a large one it is the planner's
	// estimate from the table's statistics, and SentEstimated is true: the
	// delivered history is never scanned.
	Sent          int64
	SentEstimated bool

	// InRecovery says the server is a standby: it refuses every write, so no
	// relay connected to it can record an outcome.
	InRecovery bool
	// DefaultReadOnly says default_transaction_read_only is on for this
	// session's role and database: writes fail unless a transaction asks for
	// read-write, which the relays do not.
	DefaultReadOnly bool

	// MissingIndexes are the partial indexes of [SchemaSQL] the table lacks
	// (a table made by the JVM service or by hand), with the statements that
	// add them: without them every pass reads past the SENT, dead and other
	// apps' rows.
	MissingIndexes []MissingIndex
}

// TypeOverview is one type's rows in an [Overview]. Pending, Retrying and Dead
// are counted exactly, through the indexes of the live rows.
type TypeOverview struct {
	Type string
	// App is the app whose type it is, as far as the Admin can tell: its
	// own, another app's (in [Overview.OtherApps]), or "" when nothing says
	// (no live relay delivers it, and the registry names no app for it).
	App      string
	Pending  int64 // waiting for their first attempt (PENDING, or a NULL status)
	Retrying int64 // failed below the ceiling (ERROR): they will be retried
	Dead     int64 // failed at or above the ceiling, or of a permanent failure: never retried until re-queued
	Sent     int64 // delivered; counted only when the Overview's SentEstimated is false, else 0

	// Backoff is how many of the Retrying rows wait out their backoff: their
	// next attempt is not due yet, the earliest at NextRetry (zero when none).
	// They wait for the destination, not for the relays: they are not behind.
	Backoff   int64
	NextRetry time.Time

	// Next is the type's row the relays deliver first: the waiting (PENDING
	// or retrying) row with the lowest id. nil when none waits.
	Next *RowHead
	// Oldest is the row of the type that the relays have kept waiting
	// longest: a pending row since it was written or re-queued
	// (WaitingSince), a retrying one since its next attempt came due. A row
	// in its backoff, or held back behind a failed row of its key that is,
	// waits for no relay. nil when no row waits for the relays.
	Oldest *RowHead
	// Lag is how long Oldest has waited for the relays, on the database's
	// clock; 0 when none waits. It is what "behind" means.
	Lag time.Duration
	// FirstDead is the type's dead row with the lowest id; nil when none is dead.
	FirstDead *RowHead

	// Undelivered is the type's oldest message not yet delivered, whatever
	// it waits for: the relays, a retry's backoff, a paused type, a failed
	// row of its key, no relay at all; dead rows aside. Age is how long it
	// has waited since it was written or re-queued (WaitingSince), on the
	// database's clock: what users feel, the age to page on. nil and 0 when
	// nothing of the type waits.
	Undelivered *RowHead
	Age         time.Duration
}

// RowHead is the first row of a type in one state, as [TypeOverview] reports it.
type RowHead struct {
	ID        int64
	Status    string // "PENDING" or "ERROR"
	Attempts  int    // the column: at the ceiling for a dead row, whatever killed it
	CreatedAt time.Time
	// WaitingSince is when the row last became waiting: when it was
	// re-queued (the optional requeued_at column, which [CreateTable] adds),
	// or else when it was written.
	WaitingSince time.Time
	// NextAttempt is when a retrying row (ERROR below the ceiling) is tried
	// again: its last attempt plus its backoff step, as the Admin's
	// [Config.RetryBackoff] sets it. Zero for any other row.
	NextAttempt time.Time
	LastError   string // cut to [LastErrorMax] characters; "" if none
	// Permanent and AttemptsMade are as in [DeadMessage]: the attempts
	// really made, where Attempts of a row killed by a permanent failure
	// holds the ceiling.
	Permanent    bool
	AttemptsMade int
}

// permanence sets Permanent and AttemptsMade from the last error.
func permanence(lastError string, attempts int) (bool, int) {
	if n, ok := ParsePermanent(lastError); ok {
		return true, n
	}
	return false, attempts
}

// sentCountMaxPages is the largest table (in 8 kB pages: 32 MB) whose SENT
// rows Overview counts; above it, it asks the planner for its estimate.
const sentCountMaxPages = 4096

// Overview reads the table's rows by type and state, the age of each type's
// oldest waiting row, and whether the server accepts writes. It is cheap at any
// size: the live rows (PENDING and ERROR) are counted through their partial
// indexes and the SENT history is estimated, not scanned, once the table is
// larger than a few tens of megabytes. It is what a dashboard may read every
// few seconds, and what replaces the deprecated [Admin.CountByStatus].
func (a *Admin) Overview(ctx context.Context) (Overview, error) {
	o := Overview{AppName: a.app, Table: a.table, MaxAttempts: a.maxAttempts}
	repo, err := a.repoOf(ctx)
	if err != nil {
		return o, err
	}
	groups, err := repo.liveGroups(ctx, a.pool, a.maxAttempts, a.backoff)
	if err != nil {
		return o, fmt.Errorf("relay: count the live rows of %s: %w", a.table, err)
	}
	// Read after the groups, so that no row is younger than At.
	srv, err := a.repo.server(ctx, a.pool)
	if err != nil {
		return o, fmt.Errorf("relay: read the state of the server and of %s: %w", a.table, err)
	}
	o.At, o.InRecovery, o.DefaultReadOnly = srv.now, srv.inRecovery, srv.defaultReadOnly
	if o.MissingIndexes, err = missingIndexes(ctx, a.pool, a.table); err != nil {
		return o, fmt.Errorf("relay: read the indexes of %s: %w", a.table, err)
	}

	byType := make(map[string]*TypeOverview)
	get := func(typ string) *TypeOverview {
		t, ok := byType[typ]
		if !ok {
			t = &TypeOverview{Type: typ}
			byType[typ] = t
		}
		return t
	}
	var order []string
	for _, g := range groups {
		if _, seen := byType[g.typ]; !seen {
			order = append(order, g.typ)
		}
		t := get(g.typ)
		head := g.head
		switch g.kind {
		case liveIsDead:
			t.Dead += g.count
			t.FirstDead = &head
			continue
		case liveIsUndelivered:
			if age := max(o.At.Sub(head.WaitingSince), 0); t.Undelivered == nil || age > t.Age {
				t.Undelivered, t.Age = &head, age
			}
			continue
		case liveIsCandidate:
			// A pending row waits since it became waiting, a failed one
			// since its retry came due.
			since := head.WaitingSince
			if !head.NextAttempt.IsZero() {
				since = head.NextAttempt
			}
			if lag := max(o.At.Sub(since), 0); t.Oldest == nil || lag > t.Lag {
				t.Oldest, t.Lag = &head, lag
			}
			continue
		case liveIsBackoff:
			t.Retrying += g.count
			t.Backoff += g.count
			t.NextRetry = g.at
		case liveIsDue:
			t.Retrying += g.count
		default:
			t.Pending += g.count
		}
		if t.Next == nil || head.ID < t.Next.ID {
			t.Next = &head
		}
	}

	// Whose each type is: another app's are told apart, and not counted.
	w, err := a.whose(ctx, order...)
	if err != nil {
		return o, err
	}
	var ours []string
	for _, typ := range order {
		t := byType[typ]
		if t.App = w.appOf(typ); t.App == "?" {
			t.App = "" // an app this role cannot name: the relay's presence says it is not ours
		}
		if w.theirs(typ) {
			continue
		}
		ours = append(ours, typ)
	}
	for _, typ := range ours {
		t := byType[typ]
		o.Pending += t.Pending
		o.Retrying += t.Retrying
		o.Backoff += t.Backoff
		o.Dead += t.Dead
		o.Lag = max(o.Lag, t.Lag)
		o.Age = max(o.Age, t.Age)
	}

	switch {
	case srv.pages <= sentCountMaxPages:
		sent, err := a.repo.sentByType(ctx, a.pool)
		if err != nil {
			return o, fmt.Errorf("relay: count the SENT rows of %s: %w", a.table, err)
		}
		for _, s := range sent {
			if _, seen := byType[s.typ]; !seen {
				order = append(order, s.typ)
			}
			get(s.typ).Sent = s.count
			if !w.theirs(s.typ) {
				o.Sent += s.count
			}
		}
	case srv.analyzed:
		o.SentEstimated = true
		if o.Sent, err = a.repo.estimate(ctx, a.pool, a.repo.EstimateSentSQL); err != nil {
			return o, fmt.Errorf("relay: estimate the SENT rows of %s: %w", a.table, err)
		}
	default:
		// Never analyzed (a bulk load autovacuum has not reached yet): the
		// planner would guess, so count a sample of the pages instead.
		o.SentEstimated = true
		if o.Sent, err = a.repo.sampleSent(ctx, a.pool, srv.pages); err != nil {
			return o, fmt.Errorf("relay: estimate the SENT rows of %s: %w", a.table, err)
		}
	}

	slices.Sort(order)
	o.Types = make([]TypeOverview, 0, len(order))
	for _, typ := range order {
		if w.theirs(typ) {
			o.OtherApps = append(o.OtherApps, *byType[typ])
		} else {
			o.Types = append(o.Types, *byType[typ])
		}
	}
	return o, nil
}
