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

-- name: countPurge @cutoff
SELECT count(*) FROM {{.Table}} WHERE {{template "sent"}} AND sent_at < @cutoff

-- name: estimatePurge @cutoff
EXPLAIN (FORMAT JSON) SELECT 1 FROM {{.Table}} WHERE {{template "sent"}} AND sent_at < @cutoff

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
