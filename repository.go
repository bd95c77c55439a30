package relay

import (
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"slices"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ---- The producer (Enqueue) and the operator's statements (Admin) ----

// enqueue inserts one outbound PENDING row and returns its id. The payload
// goes as text cast to jsonb, which works in every pgx query mode.
//
// It first takes the key's order lock (keyOrderLockSQL) in the same statement,
// before the id is drawn: two transactions writing messages of one key get
// their ids in the order they commit.
func enqueue(ctx context.Context, q Querier, table pgx.Identifier, m Outgoing, wakeChannel string, wakeWindowDue bool) (int64, error) {
	// The NOTIFY, when there is one, rides in the same statement: it is sent
	// when the producer's transaction commits, and never if it rolls back.
	wake, args := "", []any{m.Type, m.Key, string(m.Payload), table[len(table)-1]}
	if wakeChannel != "" {
		wake, args = ", "+wakeTokenSQL, append(args, wakeChannel, wakeWindowDue)
	}
	var id int64
	err := q.QueryRow(ctx, `INSERT INTO `+table.Sanitize()+` (direction, type, natural_key, payload, status, attempts)
SELECT 'OUT', $1, $2, $3::jsonb, 'PENDING', 0
FROM (SELECT `+keyOrderLockSQL+wake+`) AS key_order
RETURNING id`, args...).Scan(&id)
	return id, err
}

// wakeTokenSQL notifies channel $5 of type $1 when this transaction takes the
// wake-up token (a transaction-scoped try-lock: one notifying transaction in
// flight at a time, so notifying commits never queue behind each other), or
// when $6, the producer's own window, says a NOTIFY is due anyway (a token
// held by a long transaction must not silence everyone else for its length).
// WakeTriggerSQL's trigger takes the same token.
//
// The token is tried first, in a CASE of its own: "try OR $6" would let the
// planner fold a true $6 and never take the token.
const wakeTokenSQL = `CASE WHEN pg_try_advisory_xact_lock(hashtext('relay:wake'), hashtext($5)) THEN pg_notify($5, $1)
  WHEN $6::bool THEN pg_notify($5, $1) END`

// keyOrderLockSQL is the lock a producer takes, in its transaction, before it
// writes a message of key $2 into table $4 (its name without schema), so that
// ids of one key are drawn in commit order. It is transaction-scoped and
// two-int, apart from the elections' one-bigint session locks. A producer that
// writes by plain SQL takes the same lock:
//
//	SELECT pg_advisory_xact_lock(hashtext('relay:' || 'mensagem_m2m'), hashtext(<key>));
const keyOrderLockSQL = `pg_advisory_xact_lock(hashtext('relay:' || $4), hashtext($2))`

// adminRepository holds the statements of Admin for one table. A dead row is
// an outbound ERROR row whose attempts reached the ceiling ($1 everywhere).
type adminRepository struct {
	table          string // quoted
	countSQL       string
	deadPageSQL    string
	deadTypeSQL    string
	requeueAllSQL  string
	requeueTypeSQL string
	requeueIDsSQL  string
	purgeSQL       string

	liveGroupsSQL    string
	sentByTypeSQL    string
	estimateSentSQL  string
	sampleSentSQL    string
	countPurgeSQL    string
	estimatePurgeSQL string
}

func newAdminRepository(table string) (*adminRepository, error) {
	id, err := parseTable(table)
	if err != nil {
		return nil, err
	}
	t := id.Sanitize()
	const dead = `direction = 'OUT' AND status = 'ERROR' AND attempts >= $1`
	// Re-queue touches only rows dead at the moment of the statement; no pass
	// reads them, so it never races a delivery.
	const requeue = `SET status = 'PENDING', attempts = 0, updated_at = now() WHERE ` + dead
	// A page of dead rows: keyed on id, never an offset; the payload and the
	// error are cut by the server, so a page never carries whole payloads.
	// $2 after this id, $3 limit, $4 preview characters (+1 to tell a cut), $5 error characters.
	deadPage := func(byType string) string {
		return `SELECT id, type, natural_key, attempts, left(coalesce(last_error, ''), $5), created_at, updated_at,
  left(payload::text, $4 + 1) FROM ` + t + `
WHERE ` + dead + ` AND id > $2` + byType + ` ORDER BY id LIMIT $3`
	}
	const sent = `direction = 'OUT' AND status = 'SENT'`
	return &adminRepository{
		table: t,
		countSQL: `SELECT type, status, status = 'ERROR' AND attempts >= $1 AS dead, count(*) FROM ` + t + `
WHERE direction = 'OUT' GROUP BY 1, 2, 3 ORDER BY 1, 2, 3`,
		deadPageSQL:    deadPage(""),
		deadTypeSQL:    deadPage(" AND type = $6"),
		requeueAllSQL:  `UPDATE ` + t + ` ` + requeue,
		requeueTypeSQL: `UPDATE ` + t + ` ` + requeue + ` AND type = $2`,
		requeueIDsSQL:  `UPDATE ` + t + ` ` + requeue + ` AND id = ANY($2::bigint[])`,
		// One bounded chunk, oldest first: short statements, few locks. SENT
		// rows are never written by a pass again. id = ANY(ARRAY(...)) deletes
		// by primary key; "id IN (subquery)" plans a hash join that reads the
		// whole table for every chunk.
		purgeSQL: `DELETE FROM ` + t + ` WHERE id = ANY(ARRAY(SELECT id FROM ` + t + `
WHERE direction = 'OUT' AND status = 'SENT' AND sent_at < $1 ORDER BY id LIMIT $2))`,

		// The live rows by type and state, each group with its first row (the
		// lowest id). Each branch repeats a partial index's predicate word for
		// word (the pending and the error index of schema.sql), so it reads that
		// index and never the SENT history. $1 ceiling, $2 error characters.
		liveGroupsSQL: `WITH g AS (
  SELECT type, 'PENDING' AS status, false AS dead, count(*) AS n, min(id) AS head FROM ` + t + `
  WHERE direction = 'OUT' AND (status = 'PENDING' OR status IS NULL) GROUP BY type
  UNION ALL
  SELECT type, 'ERROR', attempts >= $1, count(*), min(id) FROM ` + t + `
  WHERE direction = 'OUT' AND status = 'ERROR' GROUP BY type, attempts >= $1
)
SELECT g.type, g.status, g.dead, g.n, h.id, coalesce(h.status, 'PENDING'), h.attempts, h.created_at,
  left(coalesce(h.last_error, ''), $2)
FROM g JOIN ` + t + ` h ON h.id = g.head
ORDER BY g.type, g.status, g.dead`,
		// Only on a small table: the SENT rows have no index.
		sentByTypeSQL: `SELECT type, count(*) FROM ` + t + ` WHERE ` + sent + ` GROUP BY type ORDER BY type`,
		// The planner's row estimates, from the table's statistics: no scan.
		estimateSentSQL: `EXPLAIN (FORMAT JSON) SELECT 1 FROM ` + t + ` WHERE ` + sent,
		// A table never analyzed: count a sample of its pages ($1 percent).
		sampleSentSQL:    `SELECT count(*) FROM ` + t + ` TABLESAMPLE SYSTEM ($1) WHERE ` + sent,
		countPurgeSQL:    `SELECT count(*) FROM ` + t + ` WHERE ` + sent + ` AND sent_at < $1`,
		estimatePurgeSQL: `EXPLAIN (FORMAT JSON) SELECT 1 FROM ` + t + ` WHERE ` + sent + ` AND sent_at < $1`,
	}, nil
}

func (r *adminRepository) countByStatus(ctx context.Context, db querier, ceiling int) ([]StatusCount, error) {
	rows, err := db.Query(ctx, r.countSQL, ceiling)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (StatusCount, error) {
		var c StatusCount
		err := row.Scan(&c.Type, &c.Status, &c.Dead, &c.Count)
		return c, err
	})
}

func (r *adminRepository) deadPage(ctx context.Context, db querier, ceiling int, q DeadQuery) ([]DeadMessage, error) {
	sql, args := r.deadPageSQL, []any{ceiling, q.AfterID, q.Limit, PayloadPreviewMax, LastErrorMax}
	if q.Type != "" {
		sql, args = r.deadTypeSQL, append(args, q.Type)
	}
	rows, err := db.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (DeadMessage, error) {
		var d DeadMessage
		err := row.Scan(&d.ID, &d.Type, &d.Key, &d.Attempts, &d.LastError, &d.CreatedAt, &d.UpdatedAt, &d.Payload)
		if n := utf8.RuneCountInString(d.Payload); n > PayloadPreviewMax {
			d.Payload, d.PayloadCut = cutRunes(d.Payload, PayloadPreviewMax), true
		}
		return d, err
	})
}

// cutRunes returns the first n runes of s.
func cutRunes(s string, n int) string {
	for i := range s {
		if n == 0 {
			return s[:i]
		}
		n--
	}
	return s
}

func (r *adminRepository) requeueAll(ctx context.Context, db execer, ceiling int) (int64, error) {
	return rowsAffected(db.Exec(ctx, r.requeueAllSQL, ceiling))
}

func (r *adminRepository) requeueType(ctx context.Context, db execer, ceiling int, typ string) (int64, error) {
	return rowsAffected(db.Exec(ctx, r.requeueTypeSQL, ceiling, typ))
}

func (r *adminRepository) requeueIDs(ctx context.Context, db execer, ceiling int, ids []int64) (int64, error) {
	return rowsAffected(db.Exec(ctx, r.requeueIDsSQL, ceiling, ids))
}

// cutoff is the database's now() minus retention, fixed once for a whole purge.
func (r *adminRepository) cutoff(ctx context.Context, db querier, retention time.Duration) (time.Time, error) {
	var t time.Time
	err := db.QueryRow(ctx, `SELECT now() - make_interval(secs => $1::float8)`, retention.Seconds()).Scan(&t)
	return t, err
}

func (r *adminRepository) purgeChunk(ctx context.Context, db execer, cutoff time.Time, limit int) (int64, error) {
	return rowsAffected(db.Exec(ctx, r.purgeSQL, cutoff, limit))
}

func (r *adminRepository) countSentBefore(ctx context.Context, db querier, cutoff time.Time) (int64, error) {
	srv, err := r.server(ctx, db)
	if err != nil {
		return 0, err
	}
	if srv.pages > sentCountMaxPages {
		return r.estimate(ctx, db, r.estimatePurgeSQL, cutoff)
	}
	var n int64
	err = db.QueryRow(ctx, r.countPurgeSQL, cutoff).Scan(&n)
	return n, err
}

// liveGroup is one row of liveGroupsSQL: a type's rows in one state.
type liveGroup struct {
	typ, status string
	dead        bool
	count       int64
	head        RowHead
}

func (r *adminRepository) liveGroups(ctx context.Context, db querier, ceiling int) ([]liveGroup, error) {
	rows, err := db.Query(ctx, r.liveGroupsSQL, ceiling, LastErrorMax)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (liveGroup, error) {
		var g liveGroup
		err := row.Scan(&g.typ, &g.status, &g.dead, &g.count,
			&g.head.ID, &g.head.Status, &g.head.Attempts, &g.head.CreatedAt, &g.head.LastError)
		return g, err
	})
}

// typeCount is a count of one type's rows.
type typeCount struct {
	typ   string
	count int64
}

func (r *adminRepository) sentByType(ctx context.Context, db querier) ([]typeCount, error) {
	rows, err := db.Query(ctx, r.sentByTypeSQL)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (typeCount, error) {
		var c typeCount
		err := row.Scan(&c.typ, &c.count)
		return c, err
	})
}

// serverState is what Overview reads of the server and of the table's size.
type serverState struct {
	now                         time.Time
	inRecovery, defaultReadOnly bool
	analyzed                    bool  // the table has statistics (reltuples is known)
	pages                       int64 // the table's size now, in pages
}

func (r *adminRepository) server(ctx context.Context, db querier) (serverState, error) {
	var s serverState
	err := db.QueryRow(ctx, `SELECT now(), pg_is_in_recovery(), current_setting('default_transaction_read_only') = 'on',
  c.reltuples >= 0, pg_relation_size(c.oid) / current_setting('block_size')::bigint
FROM pg_class c WHERE c.oid = $1::regclass`, r.table).Scan(&s.now, &s.inRecovery, &s.defaultReadOnly, &s.analyzed, &s.pages)
	return s, err
}

// sampledPages is how many pages sampleSent reads of a table never analyzed.
const sampledPages = 256

// sampleSent estimates the SENT rows of a table of pages pages that has no
// statistics yet, from a sample of about sampledPages of its pages.
func (r *adminRepository) sampleSent(ctx context.Context, db querier, pages int64) (int64, error) {
	pct := min(100, 100*float64(sampledPages)/float64(max(pages, 1)))
	var n int64
	if err := db.QueryRow(ctx, r.sampleSentSQL, pct).Scan(&n); err != nil {
		return 0, err
	}
	return int64(float64(n) * 100 / pct), nil
}

// estimate runs an EXPLAIN (FORMAT JSON) and returns its top plan's row estimate.
func (r *adminRepository) estimate(ctx context.Context, db querier, explainSQL string, args ...any) (int64, error) {
	var doc []byte
	if err := db.QueryRow(ctx, explainSQL, args...).Scan(&doc); err != nil {
		return 0, err
	}
	var plans []struct {
		Plan struct {
			Rows float64 `json:"Plan Rows"`
		}
	}
	if err := json.Unmarshal(doc, &plans); err != nil || len(plans) != 1 {
		return 0, fmt.Errorf("read the planner's estimate: unexpected EXPLAIN output %.200q", doc)
	}
	return int64(plans[0].Plan.Rows), nil
}

// lockHoldersSQL lists the sessions that hold or wait for the advisory locks
// of keys, taken as the relays take them: pg_try_advisory_lock(hashtext(key))
// is a one-bigint lock (objsubid 1) whose bigint splits into classid (high 32
// bits) and objid (low 32 bits). Locks of another database are not ours. With
// each, the partitions its session holds (two-int locks, partitions.go).
const lockHoldersSQL = `SELECT k.key, l.mode, l.granted, coalesce(l.pid, 0), coalesce(a.usename::text, ''),
  coalesce(a.application_name, ''), coalesce(host(a.client_addr), ''),
  a.backend_start, coalesce(a.state, ''), a.state_change, a.backend_start IS NULL, now(),
  coalesce(a.query, ''), a.query_start,
  (SELECT array_agg((p.objid::bigint & 65535)::int ORDER BY p.objid) FROM pg_locks p
    WHERE p.locktype = 'advisory' AND p.objsubid = 2 AND p.granted AND p.pid = l.pid AND p.database = l.database
      AND p.classid = (hashtext(k.key)::bigint & 4294967295)::oid AND p.objid::bigint & 65535 <> 65535),
  (SELECT min((p.objid::bigint >> 16)::int) FROM pg_locks p
    WHERE p.locktype = 'advisory' AND p.objsubid = 2 AND p.granted AND p.pid = l.pid AND p.database = l.database
      AND p.classid = (hashtext(k.key)::bigint & 4294967295)::oid AND p.objid::bigint <> 4294967295)
FROM unnest($1::text[]) AS k(key)
JOIN pg_locks l ON l.locktype = 'advisory' AND l.objsubid = 1
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND l.classid = ((hashtext(k.key)::bigint >> 32) & 4294967295)::oid
  AND l.objid = (hashtext(k.key)::bigint & 4294967295)::oid
LEFT JOIN pg_stat_activity a ON a.pid = l.pid
ORDER BY k.key, l.granted DESC, l.mode, a.backend_start, l.pid`

func (r *adminRepository) lockHolders(ctx context.Context, db querier, keys []string) ([]LockHolder, error) {
	rows, err := db.Query(ctx, lockHoldersSQL, keys)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (LockHolder, error) {
		var h LockHolder
		var mode string
		var start, change, queryStart *time.Time
		var pid int32
		var parts []int32
		var of *int32
		err := row.Scan(&h.Key, &mode, &h.Granted, &pid, &h.User, &h.ApplicationName, &h.ClientAddr,
			&start, &h.State, &change, &h.Hidden, &h.At, &h.query, &queryStart, &parts, &of)
		for _, p := range parts {
			h.Partitions = append(h.Partitions, int(p))
		}
		if of != nil {
			h.PartitionsOf = int(*of)
		}
		if queryStart != nil {
			h.queryStart = *queryStart
		}
		h.PID = int(pid)
		h.Mode = LockExclusive
		if mode == "ShareLock" {
			h.Mode = LockShared
		}
		if start != nil {
			h.BackendStart = *start
		}
		if change != nil {
			h.StateChange = *change
		}
		return h, err
	})
}

func rowsAffected(tag pgconn.CommandTag, err error) (int64, error) {
	if err != nil {
		return 0, err
	}
	return tag.RowsAffected(), nil
}

// databaseNow reads the database's clock: the one clock every replica's
// [Scheduler] agrees on, whatever their own clocks say.
func databaseNow(ctx context.Context, db querier) (time.Time, error) {
	var t time.Time
	err := db.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&t)
	return t, err
}

// ---- The partitioned election (partitions.go) ----
//
// A member's locks are two-int advisory locks beside the app's own one-bigint
// key, all with hashtext(<app key>) first, so that pg_locks tells who holds
// what with which N:
//
//	(k, n<<16 | p)      partition p of n, exclusive
//	(k, n<<16 | 65535)  the member mark of n, shared: a member with N = n
//	(k, -1)             the configuration lock, for one rebalance at a time

// markSQL takes the member mark, once, after the join.
var markSQL = electionMark + `SELECT pg_try_advisory_lock_shared(hashtext($1), ($2::int << 16) | 65535)`

// partitionConfigSQL takes the configuration lock until the end of the
// transaction: rebalanceSQL, sent with it in one batch (one implicit
// transaction), so that two members never decide on the same state.
var partitionConfigSQL = electionMark + `SELECT pg_advisory_xact_lock(hashtext($1), -1)`

// rebalanceSQL is a member's look at the election, and its taking of free
// partitions: how many members run with @n (marks, this one among them);
// whether a partition of another count is held (foreign: then nobody of
// @n takes one); whether an exclusive request waits for the app's key (an
// operator's pause: members leave); the fewest partitions a member of @n
// holds; and the partitions this member holds after it took free ones, up to
// its share, ceil(@n / members), starting from @start so that members
// spread, and none while a member holds fewer than floor(@n / members) and
// this one does not: those are left for it. pg_locks is read before any lock
// is tried (the lateral row comes first), and the CASE keeps a partition this
// session holds from being locked twice (session locks stack).
var rebalanceSQL = numbered(electionMark + `SELECT st.members, st.foreign_n, st.waiter, st.fewest, st.mine || coalesce((
    SELECT array_agg(x.p) FROM (
      SELECT c.p FROM (SELECT (@start::int + g) % @n::int AS p FROM generate_series(0, @n::int - 1) g) c
      WHERE CASE WHEN st.foreign_n IS NOT NULL OR st.waiter OR c.p = ANY(st.taken) OR c.p = ANY(st.mine) THEN false
        ELSE pg_try_advisory_lock(hashtext(@key), (@n::int << 16) | c.p) END
      LIMIT CASE WHEN cardinality(st.mine) >= @n::int / st.members AND st.fewest < @n::int / st.members THEN 0
        ELSE greatest((@n::int + st.members - 1) / st.members - cardinality(st.mine), 0) END) x), '{}')
FROM (
  WITH l AS (SELECT pid, mode, granted, objsubid, classid, objid::bigint AS objid FROM pg_locks
      WHERE locktype = 'advisory' AND database = (SELECT oid FROM pg_database WHERE datname = current_database())),
    app AS (SELECT * FROM l WHERE objsubid = 1
      AND classid = ((hashtext(@key)::bigint >> 32) & 4294967295)::oid
      AND objid = hashtext(@key)::bigint & 4294967295),
    mine AS (SELECT * FROM l WHERE granted AND objsubid = 2 AND classid = (hashtext(@key)::bigint & 4294967295)::oid
      AND objid <> 4294967295),
    marks AS (SELECT DISTINCT pid FROM mine WHERE objid & 65535 = 65535 AND objid >> 16 = @n::int
      UNION SELECT pg_backend_pid()),
    parts AS (SELECT pid, (objid >> 16)::int AS n, (objid & 65535)::int AS p FROM mine WHERE objid & 65535 <> 65535)
  SELECT (SELECT count(*)::int FROM marks) AS members,
    (SELECT min(n) FROM parts WHERE n <> @n::int) AS foreign_n,
    EXISTS (SELECT 1 FROM app WHERE NOT granted AND mode = 'ExclusiveLock') AS waiter,
    (SELECT coalesce(min(x.c), 0)::int FROM (SELECT m.pid, count(pp.p) AS c FROM marks m
      LEFT JOIN parts pp ON pp.pid = m.pid AND pp.n = @n::int GROUP BY m.pid) x) AS fewest,
    (SELECT coalesce(array_agg(p), '{}') FROM parts WHERE n = @n::int AND pid <> pg_backend_pid()) AS taken,
    (SELECT coalesce(array_agg(p ORDER BY p), '{}') FROM parts WHERE n = @n::int AND pid = pg_backend_pid()) AS mine
  OFFSET 0) st`)

// releasePartitionsSQL lets go of the partitions @release of @n, and of the
// member mark too when @leave; false if this session did not hold one of them.
var releasePartitionsSQL = numbered(electionMark + `SELECT coalesce(bool_and(pg_advisory_unlock(hashtext(@key), (@n::int << 16) | p)), true)
  AND (NOT @leave::bool OR pg_advisory_unlock_shared(hashtext(@key), (@n::int << 16) | 65535))
FROM unnest(@release::int[]) p`)

// partitionState is what a member learned at rebalanceSQL.
type partitionState struct {
	members  int  // members running with this N: this one among them
	foreignN int  // 0, or the count of partitions held with another N
	waiter   bool // an exclusive request waits for the app's key
	fewest   int  // the fewest partitions a member holds
	held     []int
	excluded bool // (join) an exclusive holder keeps this replica out
}

// rebalanceStatement takes the configuration lock and runs rebalanceSQL, in
// one round trip and one transaction.
func rebalanceStatement(ctx context.Context, db querier, key string, n, start int) (partitionState, error) {
	var st partitionState
	var foreign *int32
	var held []int32
	b := &pgx.Batch{}
	b.Queue(partitionConfigSQL, key)
	b.Queue(rebalanceSQL.sql, rebalanceSQL.args(map[string]any{"key": key, "n": n, "start": start})...).
		QueryRow(func(row pgx.Row) error {
			return row.Scan(&st.members, &foreign, &st.waiter, &st.fewest, &held)
		})
	if err := db.SendBatch(ctx, b).Close(); err != nil {
		return partitionState{}, err
	}
	if foreign != nil {
		st.foreignN = int(*foreign)
	}
	for _, p := range held {
		st.held = append(st.held, int(p))
	}
	slices.Sort(st.held)
	return st, nil
}

// releasePartitionsStatement releases the partitions release of n, and the
// member mark when leave.
func releasePartitionsStatement(ctx context.Context, db querier, key string, n int, release []int, leave bool) (bool, error) {
	var ok bool
	err := db.QueryRow(ctx, releasePartitionsSQL.sql,
		releasePartitionsSQL.args(map[string]any{"key": key, "n": n, "release": release, "leave": leave})...).Scan(&ok)
	return ok, err
}

// markStatement takes the member mark of n.
func markStatement(ctx context.Context, db querier, key string, n int) (bool, error) {
	var ok bool
	err := db.QueryRow(ctx, markSQL, key, n).Scan(&ok)
	return ok, err
}
