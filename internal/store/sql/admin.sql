-- The operator's statements (admin.go; the root's store_admin.go runs them: Admin, Overview). A dead row is
-- an outbound ERROR row whose attempts reached the ceiling, @ceiling.

-- name: dead
direction = 'OUT' AND status = 'ERROR' AND attempts >= @ceiling

-- name: countByStatus @ceiling
SELECT type, status, status = 'ERROR' AND attempts >= @ceiling AS dead, count(*) FROM {{.Table}}
WHERE direction = 'OUT' GROUP BY 1, 2, 3 ORDER BY 1, 2, 3

-- name: deadPage @ceiling @after @limit @preview @error_width
-- A page of dead rows: keyed on id, never an offset; the payload and the
-- error are cut by the server, so a page never carries whole payloads:
-- @preview characters of the payload (+1 to tell a cut), @error_width of the
-- error.
SELECT id, type, natural_key, attempts, left(coalesce(last_error, ''), @error_width), created_at, updated_at,
  left(payload::text, @preview + 1) FROM {{.Table}}
WHERE {{template "dead"}} AND id > @after ORDER BY id LIMIT @limit

-- name: deadPageOfType @ceiling @after @limit @preview @error_width @type
-- deadPage, of one type.
SELECT id, type, natural_key, attempts, left(coalesce(last_error, ''), @error_width), created_at, updated_at,
  left(payload::text, @preview + 1) FROM {{.Table}}
WHERE {{template "dead"}} AND id > @after AND type = @type ORDER BY id LIMIT @limit

-- name: deadRows @ceiling @ids @preview @error_width
-- The rows @ids that are dead, as deadPage reads them.
SELECT id, type, natural_key, attempts, left(coalesce(last_error, ''), @error_width), created_at, updated_at,
  left(payload::text, @preview + 1) FROM {{.Table}}
WHERE {{template "dead"}} AND id = ANY(@ids::bigint[]) ORDER BY id

-- name: requeue
-- Re-queue touches only rows dead at the moment of the statement; no pass
-- reads them, so it never races a delivery. A re-queued row is a failed row
-- with 0 attempts, due at once (sql/pass.sql, waiting): live and failed, it
-- holds its key's later messages until it is delivered, also behind a pass's
-- cursor (decision 0041); its last_error keeps the failure that killed it.
-- With the optional requeued_at column (.Requeued), it says since when the
-- row waits again.
UPDATE {{.Table}} SET status = 'ERROR', attempts = 0, updated_at = now(){{if .Requeued}}, requeued_at = now(){{end}} WHERE {{template "dead"}}

-- name: scope
-- The Admin's scope (Admin.Scope): a NULL @scope is every type; the types
-- of @exclude (other apps' live relays serve them) are never touched.
(@scope::text[] IS NULL OR type = ANY(@scope::text[])) AND type <> ALL(@exclude::text[])

-- name: requeueAll @ceiling @scope @exclude
{{template "requeue" .}} AND {{template "scope"}}

-- name: requeueType @ceiling @type
{{template "requeue" .}} AND type = @type

-- name: requeueIDs @ceiling @ids @scope @exclude
{{template "requeue" .}} AND id = ANY(@ids::bigint[]) AND {{template "scope"}}

-- name: purgeCutoff @retention
-- The database's now() minus @retention seconds, fixed once for a whole purge.
SELECT now() - make_interval(secs => @retention::float8)

-- name: purgeChunk @cutoff @limit @scope @exclude
-- One bounded chunk, oldest first: short statements, few locks. SENT rows are
-- never written by a pass again. id = ANY(ARRAY(...)) deletes by primary key;
-- "id IN (subquery)" plans a hash join that reads the whole table for every
-- chunk.
DELETE FROM {{.Table}} WHERE id = ANY(ARRAY(SELECT id FROM {{.Table}}
WHERE direction = 'OUT' AND status = 'SENT' AND sent_at < @cutoff AND {{template "scope"}} ORDER BY id LIMIT @limit))

-- name: liveGroups @ceiling @error_width @backoff @cap
-- The live rows by type and state (kind: 0 pending, 1 retrying and due, 2
-- retrying in its backoff, 3 dead), each group with its first row (the
-- lowest id); (kind 4) each type's candidates for the row that has waited
-- longest for the relays (waitHeads); and (kind 5) its candidates for the
-- oldest message not yet delivered, whatever it waits for (undeliveredHeads). The pending and dead branches
-- repeat a partial index's predicate word for word (the pending and the error
-- index of schema.sql), so they read that index and never the SENT history;
-- the retrying rows are read (failing): their updated_at says when they are
-- retried.
WITH fr AS MATERIALIZED ({{template "failing" .}}
), g AS (
  SELECT type, 0 AS kind, count(*) AS n, min(id) AS head, NULL::timestamptz AS at FROM {{.Table}}
  WHERE direction = 'OUT' AND (status = 'PENDING' OR status IS NULL) GROUP BY type
  UNION ALL
  SELECT type, 3, count(*), min(id), NULL FROM {{.Table}}
  WHERE direction = 'OUT' AND status = 'ERROR' AND attempts >= @ceiling GROUP BY type
  UNION ALL
  SELECT type, CASE WHEN at > now() THEN 2 ELSE 1 END, count(*), min(id), min(at) FROM fr GROUP BY 1, 2
), lt AS (
  SELECT type FROM g WHERE kind = 0
){{template "waitHeads" .}}{{template "undeliveredHeads" .}}
SELECT x.type, x.kind, x.n, x.at, h.id, coalesce(h.status, 'PENDING'), coalesce(h.attempts, 0), h.created_at,
  {{template "waitingSince" (.As "h")}}, {{template "retryAt" (.As "h")}}, left(coalesce(h.last_error, ''), @error_width)
FROM (SELECT type, kind, n, at, head FROM g UNION ALL SELECT type, 4, NULL, NULL, id FROM wh
  UNION ALL SELECT type, 5, NULL, NULL, id FROM uh) x
JOIN {{.Table}} h ON h.id = x.head
ORDER BY x.type, x.kind, h.id

-- name: failing
-- The failed rows below the ceiling, each with when it is retried
-- (nextAttempt), through the error index's range below the ceiling.
{{/* starts on a line of its own */}}
  SELECT m.type, m.id, {{template "nextAttempt" (.As "m")}} AS at, {{template "waitingSince" (.As "m")}} AS since FROM {{.Table}} m
  WHERE m.direction = 'OUT' AND m.status = 'ERROR' AND (m.attempts < @ceiling OR m.attempts IS NULL)

-- name: waitHeads
-- Follows a WITH whose lt(type) are the types with pending rows, and fr the
-- failing rows (failing): wh(type, id) are each type's candidates for the row
-- that has waited longest for the relays. Rows wait since they were written
-- or re-queued (waitingSince), a failed row since its next attempt came due;
-- a row in its backoff, or held back behind a failed row of its key that is
-- (adminHeldBack), waits for no relay. Of the pending rows: the first (by id)
-- never re-queued, which waited longer than any later row (created_at follows
-- the ids, near enough), and the re-queued one before it that waits since the
-- earliest re-queue; of the failed rows, the one whose retry came due first.
-- The type is a range, as in the pass's candidates, so that the pending index
-- serves "ORDER BY type, id".
{{/* starts with a comma, after the caller's last CTE */}}, wp AS (
  SELECT lt.type, x.id FROM lt CROSS JOIN LATERAL (
    SELECT m.id FROM {{.Table}} m
    WHERE m.type >= lt.type AND m.type <= lt.type AND m.direction = 'OUT' AND (m.status = 'PENDING' OR m.status IS NULL){{if .Requeued}} AND m.requeued_at IS NULL{{end}}{{template "adminHeldBack" .}}
    ORDER BY m.type, m.id LIMIT 1) x
), wh AS (
  SELECT type, id FROM wp{{if .Requeued}}
  UNION ALL
  SELECT lt.type, x.id FROM lt LEFT JOIN wp ON wp.type = lt.type CROSS JOIN LATERAL (
    SELECT m.id FROM {{.Table}} m
    WHERE m.type >= lt.type AND m.type <= lt.type AND m.direction = 'OUT' AND (m.status = 'PENDING' OR m.status IS NULL)
      AND m.id < coalesce(wp.id, 9223372036854775807) AND m.requeued_at IS NOT NULL{{template "adminHeldBack" .}}
    ORDER BY m.requeued_at, m.id LIMIT 1) x{{end}}
  UNION ALL
  (SELECT DISTINCT ON (type) type, id FROM fr WHERE at IS NULL OR at <= now() ORDER BY type, at NULLS FIRST, id)
)

-- name: undeliveredHeads
-- Follows waitHeads: uh(type, id) are each type's candidates for its oldest
-- message not yet delivered, whatever it waits for (the relays, a retry's
-- backoff, a paused type, a failed row of its key): the pager's age. As in
-- waitHeads, without the rows held back: the first pending row (by id) never
-- re-queued, the re-queued one before it that waits since the earliest
-- re-queue, and the failed row that waits since the earliest.
{{/* starts with a comma, after waitHeads */}}, up AS (
  SELECT lt.type, x.id FROM lt CROSS JOIN LATERAL (
    SELECT m.id FROM {{.Table}} m
    WHERE m.type >= lt.type AND m.type <= lt.type AND m.direction = 'OUT' AND (m.status = 'PENDING' OR m.status IS NULL){{if .Requeued}} AND m.requeued_at IS NULL{{end}}
    ORDER BY m.type, m.id LIMIT 1) x
), uh AS (
  SELECT type, id FROM up{{if .Requeued}}
  UNION ALL
  SELECT lt.type, x.id FROM lt LEFT JOIN up ON up.type = lt.type CROSS JOIN LATERAL (
    SELECT m.id FROM {{.Table}} m
    WHERE m.type >= lt.type AND m.type <= lt.type AND m.direction = 'OUT' AND (m.status = 'PENDING' OR m.status IS NULL)
      AND m.id < coalesce(up.id, 9223372036854775807) AND m.requeued_at IS NOT NULL
    ORDER BY m.requeued_at, m.id LIMIT 1) x{{end}}
  UNION ALL
  (SELECT DISTINCT ON (type) type, id FROM fr ORDER BY type, since, id)
)

-- name: nextAttempt
-- When failed row .Alias is tried again: its last attempt (updated_at) plus
-- its backoff step, RetryBackoff (@backoff seconds) doubling per attempt,
-- capped at @cap seconds, as the pass's "waiting" reads it; a re-queued row
-- (0 attempts) at once, since its re-queue. NULL when its updated_at is: such
-- a row does not wait.
{{.Alias}}.updated_at + CASE WHEN {{.Alias}}.attempts = 0 THEN interval '0' ELSE make_interval(secs => least(@backoff::float8 * power(2::float8, least(greatest(coalesce({{.Alias}}.attempts, 0), 1) - 1, 40)), @cap::float8)) END

-- name: retryAt
-- nextAttempt of .Alias if it is a failed row below the ceiling, else NULL.
CASE WHEN {{.Alias}}.status = 'ERROR' AND ({{.Alias}}.attempts < @ceiling OR {{.Alias}}.attempts IS NULL) THEN {{template "nextAttempt" .}} END

-- name: waitingSince
-- When row .Alias last became waiting: re-queued (the optional requeued_at
-- column), or else written.
{{if .Requeued}}coalesce({{.Alias}}.requeued_at, {{.Alias}}.created_at){{else}}{{.Alias}}.created_at{{end}}

-- name: adminHeldBack
-- The pass's heldBack, for a row m of any app: an earlier failed row of its
-- key that waits out its backoff holds it back.
{{/* starts on a line of its own */}}
      AND NOT EXISTS (SELECT 1 FROM {{.Table}} e
        WHERE e.natural_key = m.natural_key AND e.id < m.id AND e.direction = 'OUT' AND e.status = 'ERROR'
          AND (e.attempts < @ceiling OR e.attempts IS NULL) AND {{template "nextAttempt" (.As "e")}} > now())

-- name: sent
direction = 'OUT' AND status = 'SENT'

-- name: sentByType
-- Only on a small table: the SENT rows have no index.
SELECT type, count(*) FROM {{.Table}} WHERE {{template "sent"}} GROUP BY type ORDER BY type

-- name: estimateSent
-- The planner's row estimates, from the table's statistics: no scan.
EXPLAIN (FORMAT JSON) SELECT 1 FROM {{.Table}} WHERE {{template "sent"}}

-- name: sampleSent @percent
-- A table never analyzed: count a sample of its pages.
SELECT count(*) FROM {{.Table}} TABLESAMPLE SYSTEM (@percent) WHERE {{template "sent"}}

-- name: countPurge @cutoff @scope @exclude
-- What a purge would delete, by type: on a small table, counted.
SELECT type, count(*) FROM {{.Table}} WHERE {{template "sent"}} AND sent_at < @cutoff AND {{template "scope"}}
GROUP BY type ORDER BY type

-- name: samplePurge @cutoff @percent @scope @exclude
-- countPurge on a table too large to count: a sample of its pages, with
-- the number of pages the sample read (each row once: ctid's page), so that
-- the count scales by the pages read rather than by @percent, whose page
-- count varies from one sample to the next. Not the planner: on a table
-- never analyzed it guesses from default selectivities.
WITH s AS (
  SELECT type, {{template "sent"}} AND sent_at < @cutoff AND {{template "scope"}} AS hit, (ctid::text::point)[0] AS page
  FROM {{.Table}} TABLESAMPLE SYSTEM (@percent)
)
SELECT type, count(*) FILTER (WHERE hit), (SELECT count(DISTINCT page) FROM s) FROM s
GROUP BY type HAVING count(*) FILTER (WHERE hit) > 0 ORDER BY type

-- name: history @window @step @steps @ceiling @chunk @gap @lookback @indexed @backoff @cap
-- Admin.History in one statement, one round trip (admin_history.go). Its
-- rows: kind 0, one, the clock (now) and FromID (n); kind 1, a group of rows
-- of a type that waited over the instants k1..k2 (each the end of a step,
-- k = 1..@steps; none when k1 > k2), c the oldest created_at (seconds since
-- the epoch) and n how many, delivered in step d (NULL: dead, not
-- delivered); kind 2, a type's live row that has waited longest for the
-- relays (waitHeads), c since when: a live row waits from then to now.
--
-- b and s: the clock, and by a binary search on the primary key the first
-- id written at or after now() - @window seconds, each step one index lookup
-- of one row. created_at follows the ids but for transactions that overlap:
-- near enough for a boundary, which the walk then moves back.
--
-- walk: the ids from the last one down, in ranges of @chunk ids, one
-- primary-key range each, to the window's first id and on below it over the
-- rows still waiting at the window's start (live, or delivered or dead after
-- it), until @gap ids in a row (or an eighth of the distance walked, if more)
-- where none was, the table's first id, or a range written more than
-- @lookback seconds before the start. Each range reads its rows once: the
-- SENT rows delivered in the window, grouped by (type, k1, k2, d), and the
-- range's lowest waiting id and oldest created_at in the grouping set ().
-- With the relay's partial indexes (@indexed), a range whose every id is in
-- the live index (PENDING or ERROR, counted by an index-only scan) holds no
-- SENT row and is not read: a backlog costs its index entries, not its rows;
-- its rows count as waiting. The dead rows are then read through the error
-- index (dead, below), each (type, attempts) from FromID by a row comparison
-- that only that index serves; without the indexes, each range counts its
-- dead rows itself. A row that waited at no instant and was delivered in no
-- step (what a range reads below the walk's end) adds nothing.
--
-- A row waits from when it was written or re-queued (waitingSince) until it
-- was delivered or died; a row that was retried after a failure (a SENT row
-- with attempts, a dead one that made more than one attempt) does not count:
-- the table keeps no time of its earlier attempts, and waits for a retry's
-- backoff are not the relays' lag. A live failed row counts from when its
-- retry came due.
--
-- pend and fail: each type's first pending row, and each (type, attempts)
-- of the failed rows with its first id, by a skip scan of the pending and
-- the error index (one index lookup per type or pair, never the whole
-- index); without the indexes, a GROUP BY reads the live rows instead.
-- fr and waitHeads: the failed rows below the ceiling, read, and each type's
-- candidates for the row that waited longest.
--
-- date_part is float8 arithmetic, where extract() would be numeric, several
-- times slower; CASE WHEN q keeps it, and the steps' arithmetic, off the rows
-- that are not counted. OFFSET 0 keeps a subquery's columns computed once, and
-- keeps the dead rows' lateral read per (type, attempts).
WITH RECURSIVE b AS (
  SELECT now() AS now, now() - make_interval(secs => @window::float8) AS at,
    coalesce((SELECT min(id) FROM {{.Table}}), 0) AS lo, coalesce((SELECT max(id) FROM {{.Table}}), 0) AS hi
), s(lo, hi) AS (
  SELECT lo, hi + 1 FROM b
  UNION ALL
  SELECT CASE WHEN p.created_at < b.at THEN least(p.id + 1, s.hi) ELSE s.lo END,
    CASE WHEN p.created_at < b.at THEN s.hi ELSE s.lo + (s.hi - s.lo) / 2 END
  FROM s CROSS JOIN b
  LEFT JOIN LATERAL (SELECT id, created_at FROM {{.Table}} WHERE id >= s.lo + (s.hi - s.lo) / 2 ORDER BY id LIMIT 1) p ON true
  WHERE s.lo < s.hi
), w AS MATERIALIZED (
  SELECT b.now, b.at, date_part('epoch', b.at) AS e0, b.lo AS min_id, b.hi AS max_id,
    (SELECT min(lo) FROM s WHERE lo >= hi) AS first FROM b
), walk(ctl, hi, f, done, type, k1, k2, d, c, n) AS (
  SELECT true, w.max_id + 1, w.first, w.max_id < w.min_id, NULL::text, NULL::int, NULL::int, NULL::int, NULL::float8, NULL::bigint FROM w
  UNION ALL
  SELECT g.ctl, l.lo, g.f,
    l.lo <= w.min_id OR l.lo < w.first AND (g.f - l.lo >= greatest(@gap::bigint, (w.first - g.f) / 8)
      OR coalesce(g.created < w.at - make_interval(secs => @lookback::float8), false)),
    g.type::text, g.k1, g.k2, g.d, g.c, g.n
  FROM walk CROSS JOIN w
  CROSS JOIN LATERAL (SELECT greatest(walk.hi - @chunk::bigint, w.min_id) AS lo) l
  CROSS JOIN LATERAL (SELECT count(*) AS live FROM {{.Table}}
    WHERE direction = 'OUT' AND status IN ('PENDING', 'ERROR') AND id >= l.lo AND id < walk.hi AND @indexed::bool) c
  CROSS JOIN LATERAL (
    SELECT grouping(r.type) = 1 AS ctl, least(walk.f, min(r.id) FILTER (WHERE r.waiting)) AS f, min(r.created_at) AS created,
      r.type, r.k1, r.k2, r.d, min(r.c) FILTER (WHERE r.q) AS c, count(*) FILTER (WHERE r.q) AS n
    FROM (
      SELECT type, id, created_at, waiting, q, c,
        CASE WHEN q AND c IS NOT NULL THEN greatest(ceil((c - w.e0) / @step::float8), 1)::int END AS k1,
        CASE WHEN q AND c IS NOT NULL THEN least(ceil((e - w.e0) / @step::float8) - 1, @steps::int)::int END AS k2,
        CASE WHEN q AND sent THEN least(floor((e - w.e0) / @step::float8), @steps::int - 1)::int END AS d
      FROM (
        SELECT type, id, created_at, sent, q, waiting,
          CASE WHEN q THEN date_part('epoch', since) END AS c,
          CASE WHEN q THEN date_part('epoch', CASE WHEN sent THEN sent_at ELSE updated_at END) END AS e
        FROM (
          SELECT type, id, created_at, sent_at, updated_at, status = 'SENT' AS sent,
            CASE WHEN status = 'SENT' AND coalesce(attempts, 0) = 0 OR status = 'ERROR' AND {{template "attemptsMade"}} <= 1
              THEN {{template "waitingSince" (.As "m")}} END AS since,
            status = 'SENT' AND sent_at >= w.at
              OR NOT @indexed::bool AND status = 'ERROR' AND attempts >= @ceiling AND updated_at > w.at AS q,
            status IS NULL OR status = 'PENDING' OR status = 'ERROR' AND (attempts < @ceiling OR updated_at > w.at)
              OR status = 'SENT' AND sent_at >= w.at AS waiting
          FROM {{.Table}} m WHERE id >= l.lo AND id < walk.hi AND direction = 'OUT' AND c.live < walk.hi - l.lo OFFSET 0
        ) r0
      ) r1
    ) r
    GROUP BY GROUPING SETS ((), (r.type, r.k1, r.k2, r.d))
    HAVING c.live < walk.hi - l.lo AND (grouping(r.type) = 1 OR count(*) FILTER (WHERE r.q AND (r.k1 <= r.k2 OR r.d IS NOT NULL)) > 0)
    UNION ALL
    SELECT true, least(walk.f, l.lo), (SELECT created_at FROM {{.Table}} WHERE id >= l.lo ORDER BY id LIMIT 1),
      NULL, NULL, NULL, NULL, NULL, 0
    WHERE c.live >= walk.hi - l.lo
  ) g
  WHERE walk.ctl AND NOT walk.done
), pend(type, id) AS (
  (SELECT type, id FROM {{.Table}} WHERE direction = 'OUT' AND (status = 'PENDING' OR status IS NULL) AND @indexed::bool
    ORDER BY type, id LIMIT 1)
  UNION ALL
  SELECT x.type, x.id FROM pend CROSS JOIN LATERAL (SELECT type, id FROM {{.Table}}
    WHERE direction = 'OUT' AND (status = 'PENDING' OR status IS NULL) AND type > pend.type ORDER BY type, id LIMIT 1) x
), fail(type, attempts, id) AS (
  (SELECT type, attempts, id FROM {{.Table}} WHERE direction = 'OUT' AND status = 'ERROR' AND @indexed::bool
    ORDER BY type, attempts, id LIMIT 1)
  UNION ALL
  SELECT x.type, x.attempts, x.id FROM fail CROSS JOIN LATERAL (SELECT type, attempts, id FROM {{.Table}}
    WHERE direction = 'OUT' AND status = 'ERROR' AND (type, attempts) > (fail.type, fail.attempts) ORDER BY type, attempts, id LIMIT 1) x
), fr AS MATERIALIZED ({{template "failing" .}}
), lt AS (
  SELECT type FROM pend
  UNION
  SELECT DISTINCT type FROM {{.Table}} WHERE direction = 'OUT' AND (status = 'PENDING' OR status IS NULL) AND NOT @indexed::bool
){{template "waitHeads" .}}, v AS MATERIALIZED (
  SELECT w.now, w.at, w.e0, (SELECT min(f) FROM walk WHERE ctl) AS from_id FROM w
)
SELECT 0 AS kind, NULL::text AS type, NULL::int AS k1, NULL::int AS k2, NULL::int AS d, NULL::float8 AS c, v.from_id AS n, v.now FROM v
UNION ALL
SELECT 1, type, k1, k2, d, c, n, NULL FROM walk WHERE type IS NOT NULL
UNION ALL
SELECT 1, type, k1, k2, NULL, min(c), count(*), NULL FROM (
  SELECT x.type, x.c, greatest(ceil((x.c - v.e0) / @step::float8), 1)::int AS k1,
    least(ceil((x.e - v.e0) / @step::float8) - 1, @steps::int)::int AS k2
  FROM v CROSS JOIN fail CROSS JOIN LATERAL (
    SELECT type, CASE WHEN {{template "attemptsMade"}} <= 1 THEN date_part('epoch', {{template "waitingSince" (.As "m")}}) END AS c,
      date_part('epoch', updated_at) AS e FROM {{.Table}} m
    WHERE direction = 'OUT' AND status = 'ERROR' AND type = fail.type AND attempts = fail.attempts
      AND (type, attempts, id) >= (fail.type, fail.attempts, v.from_id) AND updated_at > v.at
    OFFSET 0
  ) x
  WHERE fail.attempts >= @ceiling
) dead
WHERE k1 <= k2
GROUP BY type, k1, k2
UNION ALL
SELECT 2, h.type, NULL, NULL, NULL, date_part('epoch', coalesce({{template "retryAt" (.As "h")}}, {{template "waitingSince" (.As "h")}})), NULL, NULL
FROM wh JOIN {{.Table}} h ON h.id = wh.id

-- name: attemptsMade
-- The attempts a failed row really made: those its permanent failure's mark
-- says (outcomes.go, permanentPrefix), or else its attempts.
coalesce(substring(last_error FROM '^permanent after ([0-9]+) attempt')::int, attempts)

-- name: serverState @table
-- What Overview reads of the server and of the table's size.
SELECT now(), pg_is_in_recovery(), current_setting('default_transaction_read_only') = 'on',
  c.reltuples >= 0, pg_relation_size(c.oid) / current_setting('block_size')::bigint
FROM pg_class c WHERE c.oid = @table::regclass

-- name: lockHolders @keys
-- The sessions that hold or wait for the advisory locks of @keys, taken as
-- the relays take them: pg_try_advisory_lock(hashtext(key)) is a one-bigint
-- lock (objsubid 1) whose bigint splits into classid (high 32 bits) and objid
-- (low 32 bits). Locks of another database are not ours. With each, the
-- partitions its session holds (two-int locks, partitions.go).
SELECT k.key, l.mode, l.granted, coalesce(l.pid, 0), coalesce(a.usename::text, ''),
  coalesce(a.application_name, ''), coalesce(host(a.client_addr), ''),
  a.backend_start, coalesce(a.state, ''), a.state_change, a.backend_start IS NULL, now(),
  coalesce(a.query, ''), a.query_start,
  (SELECT array_agg((p.objid::bigint & 65535)::int ORDER BY p.objid) FROM pg_locks p
    WHERE p.locktype = 'advisory' AND p.objsubid = 2 AND p.granted AND p.pid = l.pid AND p.database = l.database
      AND p.classid = (hashtext(k.key)::bigint & 4294967295)::oid AND p.objid::bigint & 65535 <> 65535),
  (SELECT min((p.objid::bigint >> 16)::int) FROM pg_locks p
    WHERE p.locktype = 'advisory' AND p.objsubid = 2 AND p.granted AND p.pid = l.pid AND p.database = l.database
      AND p.classid = (hashtext(k.key)::bigint & 4294967295)::oid AND p.objid::bigint <> 4294967295)
FROM unnest(@keys::text[]) AS k(key)
JOIN pg_locks l ON l.locktype = 'advisory' AND l.objsubid = 1
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND l.classid = ((hashtext(k.key)::bigint >> 32) & 4294967295)::oid
  AND l.objid = (hashtext(k.key)::bigint & 4294967295)::oid
LEFT JOIN pg_stat_activity a ON a.pid = l.pid
ORDER BY k.key, l.granted DESC, l.mode, a.backend_start, l.pid

-- name: tableLocks @table
-- The sessions that hold, or wait for, an ACCESS EXCLUSIVE lock on @table (a migration's LOCK TABLE, an ALTER
-- TABLE): every read of the table waits behind them. relayctl status names them when it could not read.
SELECT l.pid, l.granted, coalesce(a.application_name, ''), coalesce(a.usename::text, ''), coalesce(a.state, ''),
  coalesce(left(a.query, 200), ''), a.xact_start, now()
FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'relation' AND l.mode = 'AccessExclusiveLock' AND l.relation = to_regclass(@table)
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) AND l.pid <> pg_backend_pid()
ORDER BY l.granted DESC, a.xact_start, l.pid
