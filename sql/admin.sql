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

-- name: historyStart @window
-- The clock, and by a binary search on the primary key the first id whose
-- row was written at or after now() - @window seconds: each step one index
-- lookup of one row, all in one statement. created_at follows the ids but
-- for transactions that overlap: near enough for a boundary, which
-- historyBack then moves back over the rows still waiting.
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
)
SELECT b.now, b.lo, (SELECT min(lo) FROM s WHERE lo >= hi) FROM b

-- name: historyBack @lo @hi @from @ceiling
-- The lowest id of the rows of [@lo, @hi) that were waiting at @from
-- (seconds since the epoch): live, or delivered or dead after it; and the
-- range's oldest created_at. One primary-key range per step of the search back.
SELECT min(id) FILTER (WHERE status IS NULL OR status = 'PENDING' OR status = 'ERROR' AND attempts < @ceiling
    OR date_part('epoch', CASE WHEN status = 'SENT' THEN sent_at WHEN status = 'ERROR' THEN updated_at END) > @from::float8),
  min(created_at)
FROM {{.Table}} WHERE id >= @lo AND id < @hi AND direction = 'OUT'

-- name: historyRead @first @from_epoch @step @steps @ceiling @from
-- The rows from id @first delivered or dead since @from, grouped in one read
-- of the primary key's range. @from_epoch is @from in seconds since the
-- epoch: date_part is float8 arithmetic, where extract() would be numeric,
-- several times slower. A row waits over [created_at, ended): ended is
-- sent_at for a SENT row, updated_at (when it died) for a dead one. Instant
-- k is @from + k·@step (k = 1..@steps, the end of step k-1); a row covers
-- the instants k1..k2 with created_at <= instant < ended. Grouping by (type,
-- k1, k2) keeps each group's oldest created_at; grouping by (type, b) counts
-- the deliveries of step b: hash aggregates, no sort. The live rows of the
-- range are filtered out before any arithmetic: historyLive reads the one of
-- them that matters per type.
SELECT type, k1, k2, b, min(c), count(*) FROM (
  SELECT type, c, greatest(ceil((c - @from_epoch::float8) / @step::float8), 1)::int AS k1,
    least(ceil((e - @from_epoch::float8) / @step::float8) - 1, @steps::int)::int AS k2,
    CASE WHEN sent AND e >= @from_epoch::float8
      THEN least(floor((e - @from_epoch::float8) / @step::float8), @steps::int - 1)::int END AS b
  FROM (
    SELECT type, date_part('epoch', created_at) AS c, status = 'SENT' AS sent,
      date_part('epoch', CASE WHEN status = 'SENT' THEN sent_at ELSE updated_at END) AS e
    FROM {{.Table}}
    WHERE id >= @first AND direction = 'OUT'
      AND (status = 'SENT' AND sent_at >= @from OR status = 'ERROR' AND attempts >= @ceiling AND updated_at > @from)
  ) r
) k
WHERE k1 <= k2 OR b IS NOT NULL
GROUP BY GROUPING SETS ((type, k1, k2), (type, b))

-- name: historyLive @ceiling
-- Per type, the first live row (the lowest id, the one the relays deliver
-- first) of the pending and of the failed rows, through their partial
-- indexes (their predicates repeated word for word): the oldest row
-- waiting, which alone sets a type's lag while its rows wait.
SELECT g.type, date_part('epoch', h.created_at) FROM (
  SELECT type, min(id) AS head FROM {{.Table}} WHERE direction = 'OUT' AND (status = 'PENDING' OR status IS NULL) GROUP BY type
  UNION ALL
  SELECT type, min(id) FROM {{.Table}} WHERE direction = 'OUT' AND status = 'ERROR' AND attempts < @ceiling GROUP BY type
) g JOIN {{.Table}} h ON h.id = g.head

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
