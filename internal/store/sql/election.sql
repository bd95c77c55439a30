-- The elections' statements (election.go): the guard's lock of one key
-- (guard.go), its lease's heartbeat (lease.go), and the partitioned
-- election's membership and partitions (partitions.go).
--
-- Every statement the guard runs on the lock's session starts with
-- electionMark, so that pg_stat_activity.query tells a Go relay's election
-- from any other holder's (a JVM relay, an operator); the heartbeat's says
-- since when. parseElectionMark (guard.go) reads them back.

-- name: electionMark
/* relay election */

-- name: lock @key @idle_timeout @keepalive_idle @keepalive_interval @keepalive_count @user_timeout @pid
-- Tries the lock in one round trip with .Lock (pg_try_advisory_lock, or
-- pg_try_advisory_lock_shared for the partitioned election's hold of the
-- app's key), and, when it wins, sets the session's lease. Its columns:
-- locked (NULL: the lock is already held by this very session, which would
-- stack: a connection handed back to the pool by another holder still holding
-- it — the guard coalesces), the backend's pid, whether the server is
-- read-only (then it tries nothing), and the session's idle_session_timeout
-- as it was, for the unlock to restore. The subqueries fence the order: the
-- lock is tried before the lease is set, and only on a writable server.
--
-- @idle_timeout idle_session_timeout (ms), @keepalive_idle tcp keepalive idle
-- (s), @keepalive_interval interval (s), @keepalive_count count,
-- @user_timeout tcp_user_timeout (ms), @pid the backend the lock must be
-- taken on: on any other it tries nothing (a pooler that does not keep
-- sessions ran it elsewhere; pooling.go).
{{template "electionMark"}} SELECT s.locked, s.pid, s.read_only, s.idle,
  CASE WHEN s.locked AND s.version >= 140000 THEN set_config('idle_session_timeout', @idle_timeout, false) END,
  CASE WHEN s.locked AND s.version < 140000 THEN set_config('tcp_keepalives_idle', @keepalive_idle, false) || set_config('tcp_keepalives_interval', @keepalive_interval, false)
    || set_config('tcp_keepalives_count', @keepalive_count, false) || set_config('tcp_user_timeout', @user_timeout, false) END
FROM (SELECT CASE WHEN r.read_only OR pg_backend_pid() <> @pid::int THEN false
      WHEN EXISTS (SELECT 1 FROM pg_locks
        WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND objsubid = 1 AND granted
          AND classid = ((hashtext(@key)::bigint >> 32) & 4294967295)::oid
          AND objid = (hashtext(@key)::bigint & 4294967295)::oid) THEN NULL
      ELSE {{.Lock}}(hashtext(@key)) END AS locked,
    pg_backend_pid() AS pid, r.read_only, current_setting('idle_session_timeout', true) AS idle,
    current_setting('server_version_num')::int AS version
  FROM (SELECT pg_is_in_recovery() OR current_setting('transaction_read_only')::bool AS read_only OFFSET 0) r
  OFFSET 0) s

-- name: unlock @key @idle @pid
-- Releases the lock with .Unlock and gives the session back its own
-- idle_session_timeout (@idle: NULL on PostgreSQL 13), on backend @pid
-- only: on another, it releases nothing there and lets go of what backend
-- @pid holds of the election (stranded).
{{template "electionMark"}} SELECT CASE WHEN pg_backend_pid() = @pid::int THEN {{.Unlock}}(hashtext(@key)) END, pg_backend_pid(),
  CASE WHEN pg_backend_pid() = @pid::int AND @idle::text IS NOT NULL THEN set_config('idle_session_timeout', @idle::text, false) END,
  {{template "stranded"}}

-- name: stranded
-- A column for the statements on the lock's session: when it runs on
-- another backend than the lock's, @pid, and that backend holds a lock of the
-- election @key (its key, or a partition, member mark or configuration lock
-- of the partitioned election), it ends that backend, which lets go of the
-- locks stranded there. Only a pooler that does not keep sessions makes a
-- statement land on another backend.
CASE WHEN pg_backend_pid() <> @pid::int AND EXISTS (SELECT 1 FROM pg_locks
    WHERE locktype = 'advisory' AND pid = @pid::int AND (
      (objsubid = 1 AND classid = ((hashtext(@key)::bigint >> 32) & 4294967295)::oid
        AND objid = (hashtext(@key)::bigint & 4294967295)::oid)
      OR (objsubid = 2 AND classid = (hashtext(@key)::bigint & 4294967295)::oid)))
  THEN pg_terminate_backend(@pid::int) END

-- name: letGo @key @pid
-- Lets go of every lock of the election's session, backend @pid, from
-- wherever a pooler ran it: there, every session advisory lock of the
-- backend; elsewhere, by ending the backend if it holds one of the election's
-- (stranded).
{{template "electionMark"}} SELECT CASE WHEN pg_backend_pid() = @pid::int THEN pg_advisory_unlock_all()::text END, {{template "stranded"}}

-- name: heartbeat
-- The heartbeat of an election won at .Since (RFC 3339, UTC).
/* relay election since {{.Since}} */ SELECT pg_backend_pid()

-- The partitioned election. A member's locks are two-int advisory locks
-- beside the app's own one-bigint key, all with hashtext(<app key>) first, so
-- that pg_locks tells who holds what with which N:
--
--   (k, n<<16 | p)      partition p of n, exclusive
--   (k, n<<16 | 65535)  the member mark of n, shared: a member with N = n
--   (k, -1)             the configuration lock, for one rebalance at a time

-- name: partitionMark @key @n @pid
-- Takes the member mark, once, after the join, on the membership's backend
-- @pid only (like every statement of the membership: a pooler that does not
-- keep sessions may run it on another); its second column says where it ran.
{{template "electionMark"}} SELECT CASE WHEN pg_backend_pid() = @pid::int THEN pg_try_advisory_lock_shared(hashtext(@key), (@n::int << 16) | 65535) END,
  pg_backend_pid()

-- name: partitionConfig @key
-- Takes the configuration lock until the end of the transaction: rebalance,
-- sent with it in one batch (one implicit transaction), so that two members
-- never decide on the same state.
{{template "electionMark"}} SELECT pg_advisory_xact_lock(hashtext(@key), -1)

-- name: rebalance
-- A member's look at the election, and its taking of free partitions: how
-- many members run with @n (marks, this one among them); whether a partition
-- of another count is held (foreign: then nobody of @n takes one); whether an
-- exclusive request waits for the app's key (an operator's pause: members
-- leave); the fewest partitions a member of @n holds; and the partitions this
-- member holds after it took free ones, up to its share, ceil(@n / members),
-- starting from @start so that members spread, and none while a member holds
-- fewer than floor(@n / members) and this one does not: those are left for
-- it; and how many partitions of @n others hold. It takes nothing unless it
-- runs on the membership's backend @pid; its first column says where it ran. pg_locks is read before any lock is tried
-- (the lateral row comes first), and the CASE keeps a partition this session
-- holds from being locked twice (session locks stack).
{{template "electionMark"}} SELECT pg_backend_pid(), st.members, st.foreign_n, st.waiter, st.fewest, cardinality(st.taken), st.mine || coalesce((
    SELECT array_agg(x.p) FROM (
      SELECT c.p FROM (SELECT (@start::int + g) % @n::int AS p FROM generate_series(0, @n::int - 1) g) c
      WHERE CASE WHEN pg_backend_pid() <> @pid::int OR st.foreign_n IS NOT NULL OR st.waiter OR c.p = ANY(st.taken) OR c.p = ANY(st.mine) THEN false
        ELSE pg_try_advisory_lock(hashtext(@key), (@n::int << 16) | c.p) END
      LIMIT CASE WHEN cardinality(st.mine) >= @n::int / st.members AND st.fewest < @n::int / st.members THEN 0
        ELSE greatest((@n::int + st.members - 1) / st.members - cardinality(st.mine), 0) END) x), '{}')
FROM (
  {{template "partitionLocks"}},
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
  OFFSET 0) st

-- name: partitionLocks
-- A fragment: the partitioned election @key's advisory locks in this
-- database (l), the app key's holders and requests (app), and the granted
-- two-int locks of the election (mine): the member marks (second int
-- @n << 16 | 65535) and partitions (@n << 16 | p), which hold with count @n.
WITH l AS (SELECT pid, mode, granted, objsubid, classid, objid::bigint AS objid FROM pg_locks
      WHERE locktype = 'advisory' AND database = (SELECT oid FROM pg_database WHERE datname = current_database())),
    app AS (SELECT * FROM l WHERE objsubid = 1
      AND classid = ((hashtext(@key)::bigint >> 32) & 4294967295)::oid
      AND objid = hashtext(@key)::bigint & 4294967295),
    mine AS (SELECT * FROM l WHERE granted AND objsubid = 2 AND classid = (hashtext(@key)::bigint & 4294967295)::oid
      AND objid <> 4294967295)

-- name: partitionLook @key @n
-- An idle member's look at the election between two of its rebalances, from
-- the relay's own session, which holds none of its locks: how many members
-- run with @n (their marks), how many partitions of @n are held, and whether
-- an exclusive request waits for the app's key. While these are what its last
-- rebalance left, another would change nothing.
{{template "partitionLocks"}}
SELECT (SELECT count(DISTINCT pid)::int FROM mine WHERE objid & 65535 = 65535 AND objid >> 16 = @n::int),
  (SELECT count(*)::int FROM mine WHERE objid & 65535 <> 65535 AND objid >> 16 = @n::int),
  EXISTS (SELECT 1 FROM app WHERE NOT granted AND mode = 'ExclusiveLock')

-- name: releasePartitions
-- Lets go of the partitions @release of @n, and of the member mark too when
-- @leave; false if this session did not hold one of them. It lets go of
-- nothing unless it runs on the membership's backend @pid; its second column
-- says where it ran.
{{template "electionMark"}} SELECT CASE WHEN pg_backend_pid() = @pid::int THEN
    (NOT @leave::bool OR pg_advisory_unlock_shared(hashtext(@key), (@n::int << 16) | 65535))
      AND coalesce(bool_and(pg_advisory_unlock(hashtext(@key), (@n::int << 16) | p)), true) END,
  pg_backend_pid()
FROM unnest(CASE WHEN pg_backend_pid() = @pid::int THEN @release::int[] END) p

-- name: sessionLocksHeld @pid
-- Whether backend @pid still holds advisory locks: the guard asks after it
-- closed the lock's session of a job the Scheduler abandoned, until the server
-- has dropped them (the backend exits a moment after the client has gone).
SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND pid = @pid)
