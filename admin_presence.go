package relay

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/xadm/relay/internal/session"
	"github.com/xadm/relay/internal/store"
)

// Replica is a live relay of the Admin's app, as its presence shows it
// (internal/session): a started relay holds its presence locks for as long as its
// process and its session live, whether it is in a pass or not.
type Replica struct {
	// ID is the replica's id, 8 hex digits drawn when the relay was built;
	// the election's statements name it (LockHolder.ReplicaID).
	ID string
	// App is its Config.AppName, and Table its Config.Table as it says
	// them ([Admin.OtherReplicas] lists other apps' relays); App is "" when
	// this role cannot read its session, Table "" for a relay too old to say.
	App, Table string
	// Types are the message types it has senders for. UnnamedTypes counts
	// those whose names the Admin could not read (another role's session
	// without pg_read_all_stats, or a list longer than
	// track_activity_query_size): the locks hash the names.
	Types        []string
	UnnamedTypes int
	MaxAttempts  int // its Config.MaxAttempts
	Partitions   int // its Config.Partitions: 1 is the single-key election

	// Host and Process are the relay's host name and process id, and Since
	// when it was built, as it says itself; empty when unnamed.
	Host    string
	Process int
	Since   time.Time

	// Paused are the types it has paused ([Config.PauseAfter]), as its last
	// statement on its presence session said (within 3s of a change), with
	// their reasons cut to 80 bytes (or left out, when many are paused).
	Paused []PausedType

	// Yielded are the types it has a sender for and does not deliver,
	// because live relays of another app deliver them on its table (one
	// type, one app); Stuck its abandoned Sends still running, per type;
	// Retention its last run of the retention job ([Config.Retention]), nil
	// when it ran none. As its presence said them, within 3s of a change.
	Yielded   []YieldedType
	Stuck     []StuckSends
	Retention *RetentionRun

	// Elected says it holds the app's election right now: it is in a pass
	// (single key), or is a member of the partitioned election. Held are the
	// partitions it holds (Partitions > 1).
	Elected bool
	Held    []int

	// The presence session, as pg_stat_activity shows it.
	PID             int
	ApplicationName string
	ClientAddr      string // "" over a Unix socket or when Hidden
	BackendStart    time.Time
	Hidden          bool // the Admin's role may not read the session: grant it pg_read_all_stats

	At time.Time // the database's clock when it was read
}

// Serves says whether the replica has a sender for typ.
func (r Replica) Serves(typ string) bool { return slices.Contains(r.Types, typ) }

// Replicas returns the live relays of the Admin's app, oldest session first:
// every started relay, single key or partitioned, between passes as in one,
// with the types it serves and whether it holds the election now. A killed
// relay disappears with its session; a frozen or cut-off one within about
// 10 s (internal/session). Relays of other apps, JVM relays and relays that are
// not started (Enabled false, or only [Relay.Run]) are not listed.
func (a *Admin) Replicas(ctx context.Context) ([]Replica, error) {
	reps, err := a.replicas(ctx, a.types)
	if err != nil {
		return nil, err
	}
	holders, err := a.Election(ctx)
	if err != nil {
		return nil, err
	}
	for i := range reps {
		for _, h := range holders {
			if h.Granted && h.ReplicaID != "" && h.ReplicaID == reps[i].ID {
				reps[i].Elected, reps[i].Held = true, h.Partitions
			}
		}
	}
	return reps, nil
}

// replicasReads bounds the reads of one Replicas call (see replicas).
const replicasReads = 4

// replicas reads the presence of the app's relays; names are type names to
// recognise besides those the replicas' own statements carry.
func (a *Admin) replicas(ctx context.Context, names []string) ([]Replica, error) {
	read := func(names []string) ([]Replica, map[int][]int64, []int64, error) {
		rows, err := store.ReplicasStatement(ctx, a.pool, a.app, names)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("relay: read the live replicas of app %q: %w", a.app, err)
		}
		var reps []Replica
		hashes := make(map[int][]int64)
		var nameHashes []int64
		for i, x := range rows {
			r := Replica{ID: session.ReplicaID(x.Replica), App: a.app, MaxAttempts: x.MaxAttempts, Partitions: x.Partitions, PID: x.PID,
				ApplicationName: x.ApplicationName, ClientAddr: x.ClientAddr, BackendStart: x.BackendStart, Hidden: x.Hidden, At: x.At}
			if d, ok := session.ParseComment(x.Query); ok && d.App == a.app && d.Replica == r.ID {
				r.Types, r.Host, r.Process, r.Since, r.Table = d.Types, d.Host, d.Process, d.Since, d.Table
				r.described(d)
			}
			hashes[i], nameHashes = x.TypeHashes, x.NameHashes
			reps = append(reps, r)
		}
		if a.afterRead != nil {
			a.afterRead()
		}
		return reps, hashes, nameHashes, nil
	}
	// The names are trusted only as far as the locks bear them out: hash every
	// name heard of and keep, per replica, those it holds a lock for. A
	// replica that came up after a read brings names that read did not hash:
	// read again, a few times at most (a rolling deploy is brief).
	hashed := names
	reps, hashes, nameHashes, err := read(hashed)
	for reads := 1; err == nil; reads++ {
		all := slices.Clone(hashed)
		for _, r := range reps {
			all = append(all, r.Types...)
		}
		slices.Sort(all)
		if all = slices.Compact(all); len(all) == len(hashed) || reads == replicasReads {
			break
		}
		hashed = all
		reps, hashes, nameHashes, err = read(hashed)
	}
	if err != nil {
		return nil, err
	}
	for i := range reps {
		var named []string
		for j, h := range nameHashes {
			if slices.Contains(hashes[i], h) && !slices.Contains(named, hashed[j]) {
				named = append(named, hashed[j])
			}
		}
		slices.Sort(named)
		reps[i].Types = named
		reps[i].UnnamedTypes = len(hashes[i]) - len(named)
		if reps[i].UnnamedTypes < 0 { // two names with one hash
			reps[i].UnnamedTypes = 0
		}
	}
	return reps, nil
}

// OtherReplicas returns the live relays of the other apps that deliver from
// the Admin's table (their presence holds its name's key), oldest session
// first, each with the app, table and types its session says
// ([Replica.App]). A relay too old to hold that key may deliver from it: it
// is listed. One whose session this role cannot read (another role's,
// without pg_read_all_stats) has no App; of its types, only those among
// names are told, by their locks. An Admin never writes a type that another
// app's live relays serve on its table ([Admin.Scope]).
func (a *Admin) OtherReplicas(ctx context.Context, names ...string) ([]Replica, error) {
	names = slices.Clone(names)
	slices.Sort(names)
	names = slices.Compact(names)
	// A descriptor's type names count as far as the session's locks bear
	// them out: read again with those the first read did not hash.
	for reads := 1; ; reads++ {
		rows, err := store.OtherReplicasStatement(ctx, a.pool, a.app, names, session.TableName(a.table))
		if err != nil {
			return nil, fmt.Errorf("relay: read the live relays of other apps: %w", err)
		}
		all := slices.Clone(names)
		var reps []Replica
		for _, x := range rows {
			r := Replica{PID: x.PID, ApplicationName: x.ApplicationName, ClientAddr: x.ClientAddr, BackendStart: x.BackendStart,
				Hidden: x.Hidden, At: x.At}
			if d, ok := session.ParseComment(x.Query); ok && d.App != a.app {
				r.App, r.Table, r.ID, r.MaxAttempts, r.Partitions = d.App, d.Table, d.Replica, d.MaxAttempts, d.Partitions
				r.Host, r.Process, r.Since = d.Host, d.Process, d.Since
				r.described(d)
				all = append(all, d.Types...)
			}
			for i, h := range x.NameHashes {
				if slices.Contains(x.Locks, h) && !slices.Contains(r.Types, names[i]) {
					r.Types = append(r.Types, names[i])
				}
			}
			slices.Sort(r.Types)
			if x.OnTable && r.Table == "" {
				r.Table = a.table // its key says so; its descriptor could not
			}
			if x.OnTable || !x.Tabled && sameTable(r.Table, a.table) {
				reps = append(reps, r)
			}
		}
		slices.Sort(all)
		if all = slices.Compact(all); len(all) == len(names) || reads == replicasReads {
			return reps, nil
		}
		names = all
	}
}

// described sets what r's descriptor says of its state: the types paused,
// yielded, with Sends stuck, and its last retention run.
func (r *Replica) described(d session.Descriptor) {
	for _, p := range d.Paused {
		r.Paused = append(r.Paused, PausedType(p))
	}
	for _, y := range d.Yielded {
		r.Yielded = append(r.Yielded, YieldedType(y))
	}
	for _, k := range d.Stuck {
		r.Stuck = append(r.Stuck, StuckSends(k))
	}
	if x := d.Retention; x != nil {
		took, _ := time.ParseDuration(x.Took)
		age, _ := time.ParseDuration(x.Age)
		r.Retention = &RetentionRun{At: x.At, Deleted: x.Deleted, Err: x.Err, Age: age, Took: took, Total: x.Total}
	}
}

// Yields says whether the replica has a sender for typ and yields it to
// another app.
func (r Replica) Yields(typ string) bool {
	return slices.ContainsFunc(r.Yielded, func(y YieldedType) bool { return y.Type == typ })
}

// Delivers says whether the replica delivers typ: it has a sender for it
// and does not yield it.
func (r Replica) Delivers(typ string) bool { return r.Serves(typ) && !r.Yields(typ) }
