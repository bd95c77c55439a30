package relay

import (
	"context"
	_ "embed"
	"slices"

	"github.com/jackc/pgx/v5"
)

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
