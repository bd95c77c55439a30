-- The operator's statements (store_admin.go: Admin, Overview). A dead row is
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

-- name: requeue
-- Re-queue touches only rows dead at the moment of the statement; no pass
-- reads them, so it never races a delivery.
UPDATE {{.Table}} SET status = 'PENDING', attempts = 0, updated_at = now() WHERE {{template "dead"}}

-- name: scope
-- The Admin's scope (Admin.Scope): a NULL @scope is every type.
(@scope::text[] IS NULL OR type = ANY(@scope::text[]))

-- name: requeueAll @ceiling @scope
{{template "requeue" .}} AND {{template "scope"}}

-- name: requeueType @ceiling @type
{{template "requeue" .}} AND type = @type

-- name: requeueIDs @ceiling @ids @scope
{{template "requeue" .}} AND id = ANY(@ids::bigint[]) AND {{template "scope"}}

-- name: purgeCutoff @retention
-- The database's now() minus @retention seconds, fixed once for a whole purge.
SELECT now() - make_interval(secs => @retention::float8)

-- name: purgeChunk @cutoff @limit @scope
-- One bounded chunk, oldest first: short statements, few locks. SENT rows are
-- never written by a pass again. id = ANY(ARRAY(...)) deletes by primary key;
-- "id IN (subquery)" plans a hash join that reads the whole table for every
-- chunk.
DELETE FROM {{.Table}} WHERE id = ANY(ARRAY(SELECT id FROM {{.Table}}
WHERE direction = 'OUT' AND status = 'SENT' AND sent_at < @cutoff AND {{template "scope"}} ORDER BY id LIMIT @limit))

-- name: liveGroups @ceiling @error_width
-- The live rows by type and state, each group with its first row (the lowest
-- id). Each branch repeats a partial index's predicate word for word (the
-- pending and the error index of schema.sql), so it reads that index and
-- never the SENT history.
WITH g AS (
  SELECT type, 'PENDING' AS status, false AS dead, count(*) AS n, min(id) AS head FROM {{.Table}}
  WHERE direction = 'OUT' AND (status = 'PENDING' OR status IS NULL) GROUP BY type
  UNION ALL
  SELECT type, 'ERROR', attempts >= @ceiling, count(*), min(id) FROM {{.Table}}
  WHERE direction = 'OUT' AND status = 'ERROR' GROUP BY type, attempts >= @ceiling
)
SELECT g.type, g.status, g.dead, g.n, h.id, coalesce(h.status, 'PENDING'), h.attempts, h.created_at,
  left(coalesce(h.last_error, ''), @error_width)
FROM g JOIN {{.Table}} h ON h.id = g.head
ORDER BY g.type, g.status, g.dead

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

-- name: countPurge @cutoff @scope
-- What a purge would delete, by type: on a small table, counted.
SELECT type, count(*) FROM {{.Table}} WHERE {{template "sent"}} AND sent_at < @cutoff AND {{template "scope"}}
GROUP BY type ORDER BY type

-- name: samplePurge @cutoff @percent @scope
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

-- name: history @window @step @steps @ceiling @chunk @gap @lookback @indexed
-- Admin.History in one statement, one round trip (admin_history.go). Its
-- rows: kind 0, one, the clock (now) and FromID (n); kind 1, a group of rows
-- of a type that waited over the instants k1..k2 (each the end of a step,
-- k = 1..@steps; none when k1 > k2), c the oldest created_at (seconds since
-- the epoch) and n how many, delivered in step d (NULL: dead, not
-- delivered); kind 2, a type's first pending or failed row, c when it was
-- written: a live row waits from then to now.
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
-- pend and fail: each type's first pending row, and each (type, attempts)
-- of the failed rows with its first id, by a skip scan of the pending and
-- the error index (one index lookup per type or pair, never the whole
-- index); without the indexes, a GROUP BY reads the live rows instead.
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
        CASE WHEN q THEN greatest(ceil((c - w.e0) / @step::float8), 1)::int END AS k1,
        CASE WHEN q THEN least(ceil((e - w.e0) / @step::float8) - 1, @steps::int)::int END AS k2,
        CASE WHEN q AND sent THEN least(floor((e - w.e0) / @step::float8), @steps::int - 1)::int END AS d
      FROM (
        SELECT type, id, created_at, sent, q, waiting,
          CASE WHEN q THEN date_part('epoch', created_at) END AS c,
          CASE WHEN q THEN date_part('epoch', CASE WHEN sent THEN sent_at ELSE updated_at END) END AS e
        FROM (
          SELECT type, id, created_at, sent_at, updated_at, status = 'SENT' AS sent,
            status = 'SENT' AND sent_at >= w.at
              OR NOT @indexed::bool AND status = 'ERROR' AND attempts >= @ceiling AND updated_at > w.at AS q,
            status IS NULL OR status = 'PENDING' OR status = 'ERROR' AND (attempts < @ceiling OR updated_at > w.at)
              OR status = 'SENT' AND sent_at >= w.at AS waiting
          FROM {{.Table}} WHERE id >= l.lo AND id < walk.hi AND direction = 'OUT' AND c.live < walk.hi - l.lo OFFSET 0
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
), v AS MATERIALIZED (
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
    SELECT type, date_part('epoch', created_at) AS c, date_part('epoch', updated_at) AS e FROM {{.Table}}
    WHERE direction = 'OUT' AND status = 'ERROR' AND type = fail.type AND attempts = fail.attempts
      AND (type, attempts, id) >= (fail.type, fail.attempts, v.from_id) AND updated_at > v.at
    OFFSET 0
  ) x
  WHERE fail.attempts >= @ceiling
) dead
WHERE k1 <= k2
GROUP BY type, k1, k2
UNION ALL
SELECT 2, h.type, NULL, NULL, NULL, date_part('epoch', h.created_at), NULL, NULL FROM (
  SELECT id FROM pend
  UNION ALL
  SELECT min(id) FROM fail WHERE attempts < @ceiling GROUP BY type
  UNION ALL
  SELECT min(id) FROM {{.Table}} WHERE direction = 'OUT' AND (status = 'PENDING' OR status IS NULL) AND NOT @indexed::bool GROUP BY type
  UNION ALL
  SELECT min(id) FROM {{.Table}} WHERE direction = 'OUT' AND status = 'ERROR' AND attempts < @ceiling AND NOT @indexed::bool GROUP BY type
) g JOIN {{.Table}} h ON h.id = g.id

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
