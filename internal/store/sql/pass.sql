-- The pass's reads (pass.go): the select of a batch, the idle poll,
-- a large payload, and what the relay learns of its table.
--
-- The select's parameters are named: @max the ceiling, @types, @limit, @after
-- the least id, @backoff and @cap in seconds, @n partitions and @parts this
-- replica's, @key the election, @others the types a select leaves out.

-- name: preflight
-- Sent with the first select of a pass, in the same round trip: a read-only
-- server (a hot standby after a failover, a cutover's
-- default_transaction_read_only) can never record an outcome, so nothing is
-- sent from it; and the database's clock measures the lag against the
-- producers' own now().
SELECT pg_is_in_recovery() OR current_setting('transaction_read_only')::bool, clock_timestamp()

-- name: genericPlans
-- Sent first in the select's round trip (the same implicit transaction):
-- the select then runs on its generic plan, made once per connection,
-- instead of a plan made anew at each Bind, which is most of the select's
-- work on the server (docs/performance.md, the loaded tail). is_local: the
-- setting ends with the batch's transaction, and the adopter's pooled
-- session keeps its own. plan_cache_mode is PostgreSQL 12's.
SELECT CASE WHEN current_setting('server_version_num')::int >= 120000
  THEN set_config('plan_cache_mode', 'force_generic_plan', true) END

-- name: fetch
-- One batch: the deliverable rows (candidates), in id order. A payload up to
-- InlinePayloadMax stored bytes (pg_column_size, perhaps compressed) comes
-- with its row; a larger one is loaded on its own (payload), after its size
-- was checked, so a batch never holds more than BatchBytes.
--
-- The columns are cast and read as nullable, and a NULL status or attempts is
-- read as PENDING or 0: a table made by another migration (nullable columns,
-- varchar instead of text) never makes the select fail, and a row that cannot
-- be delivered is marked dead by the pass, not skipped. The headers column
-- is optional (a JVM-made table has none): .Headers when the probe found it.
SELECT m.id, m.type::text, m.natural_key::text, m.status::text, m.attempts::bigint, m.created_at::timestamptz,
  {{template "behind" .}},
  pg_column_size(m.payload), CASE WHEN pg_column_size(m.payload) <= {{.InlinePayloadMax}} THEN m.payload::text END{{if .Headers}}, m.headers::text{{end}}
FROM {{.Table}} m
WHERE m.id = ANY(ARRAY(SELECT c.id FROM ({{template "candidates" .}}
  ) c ORDER BY c.id LIMIT @limit))
ORDER BY m.id

-- name: candidates
-- The ids of deliverable rows, at most @limit of each part; partitioned,
-- only of this replica's partitions (partitions.go).
--
-- Each part walks an index of its own types only (schema.sql): the waiting
-- rows by (type, id), one type at a time, and the failed rows by (type,
-- attempts, id), whose range attempts < ceiling stops before the dead rows,
-- then sorted. Another app's backlog and the dead rows, however many, are
-- never read. Two shapes keep the planner on those indexes: the type is
-- matched by a range, not "=", so that "ORDER BY type, id" is not reduced to
-- "ORDER BY id", which the primary key would offer at the price of walking
-- every row (the planner cannot see that few rows of a busy table are this
-- type's waiting ones); and OFFSET 0 keeps it from trading the failed rows'
-- range for a walk in id order. The failed rows' attempts are a range with
-- a lower bound that excludes nothing: a generic plan (genericPlans), which
-- does not know @max, then estimates it as a narrow range (PostgreSQL's
-- default for a range of unknown bounds) instead of a third of the rows,
-- and keeps to the (type, attempts, id) index rather than walk every id.
{{/* starts on a line of its own */}}
  SELECT p.id FROM unnest(@types::text[]) AS ty(type) CROSS JOIN LATERAL (
    SELECT m.id FROM {{.Table}} m
    WHERE m.type >= ty.type AND m.type <= ty.type AND m.direction = 'OUT' AND (m.status = 'PENDING' OR m.status IS NULL)
      AND coalesce(m.attempts, 0) < @max AND m.id > @after{{template "inPartitions" .}}{{template "heldBack" .}}{{template "heldByOthers" .}}
    ORDER BY m.type, m.id LIMIT @limit) p{{template "failed" (.Failing "m.attempts >= (-9223372036854775807 - 1) AND m.attempts < @max")}}{{template "failed" (.Failing "m.attempts IS NULL")}}

-- name: failed
-- The failed rows of candidates whose attempts match .Attempts, that wait out
-- no backoff.
{{/* starts on a line of its own */}}
  UNION ALL
  (SELECT e.id FROM (SELECT m.id FROM {{.Table}} m
    WHERE m.type = ANY(@types::text[]) AND m.direction = 'OUT' AND m.status = 'ERROR' AND {{.Attempts}} AND m.id > @after{{template "inPartitions" .}}
      AND NOT {{template "waiting" (.As "m")}}{{template "heldBack" .}}{{template "heldByOthers" .}}
    OFFSET 0) e ORDER BY e.id LIMIT @limit)

-- name: inPartitions
-- Partitioned, a candidate is of this replica's partitions.
{{if .Partitioned}} AND {{template "partitionOf" "m.natural_key"}} = ANY(@parts::int[]){{end}}

-- name: partitionOf
-- The partition of a natural key, for Config.Partitions @n: its hashtext,
-- without sign, modulo @n. A NULL key is in the partition of the empty key,
-- so that some replica marks its row dead.
((hashtext(coalesce({{.}}::text, '')) & 2147483647) % @n::int)

-- name: waiting
-- Whether row .Alias, a failed one, still waits out its backoff. The
-- exponent is clamped (2^40 s is far past the cap), so no number of attempts
-- overflows; a NULL updated_at does not wait. Without a backoff nothing waits.
{{if .Backoff}}coalesce({{.Alias}}.updated_at > now() - make_interval(secs => least(@backoff::float8 * power(2::float8, least(greatest(coalesce({{.Alias}}.attempts, 0), 1) - 1, 40)), @cap::float8)), false){{else}}false{{end}}

-- name: heldBack
-- A row waits while an earlier failed row of its key waits out its backoff:
-- a retry never lets a later message of its key overtake it.
{{if .Backoff}}
      AND NOT EXISTS (SELECT 1 FROM {{.Table}} e
        WHERE e.natural_key = m.natural_key AND e.id < m.id AND e.direction = 'OUT' AND e.status = 'ERROR'
          AND e.type = ANY(@types::text[]) AND (e.attempts < @max OR e.attempts IS NULL) AND {{template "waiting" (.As "e")}}){{end}}

-- name: behind
-- Whether an earlier failed row of the row's key lies behind the select's
-- start (@after), where a drain's select does not look: a row left there
-- waiting out its backoff, whose backoff may end while the drain goes on,
-- its key's later rows held back with it. The pass sends nothing more of the
-- key (the engine's plan) until a select from the start finds them all, in
-- id order. A select from the start has nothing behind it, nor one with no
-- live failed row behind its start at all: that question is asked once per
-- select (an uncorrelated subquery, the plan's InitPlan), one probe of the
-- failed rows' index per type, and only then each row's key is probed, so a
-- drain with no failures pays nothing per row (docs/performance.md).
CASE WHEN @after::bigint = (-9223372036854775807 - 1) THEN false
  WHEN NOT EXISTS (SELECT 1 FROM unnest(@types::text[]) AS ty(type) CROSS JOIN LATERAL (
    SELECT 1 FROM {{.Table}} e
    WHERE e.type >= ty.type AND e.type <= ty.type AND e.direction = 'OUT' AND e.status = 'ERROR'
      AND (e.attempts < @max OR e.attempts IS NULL) AND e.id <= @after LIMIT 1) f) THEN false
  ELSE EXISTS (SELECT 1 FROM {{.Table}} e
    WHERE e.natural_key = m.natural_key AND e.id < m.id AND e.id <= @after AND e.direction = 'OUT' AND e.status = 'ERROR'
      AND e.type = ANY(@types::text[]) AND (e.attempts < @max OR e.attempts IS NULL)) END

-- name: heldByOthers
-- A select that leaves some of the relay's types out, @others (paused, or
-- with rows already queued: lanes.go), holds a row back while its key has an
-- earlier live row of one of them: a key's messages keep their order across
-- types. Each candidate is one probe of the key index, (natural_key, id) of
-- the live rows (schema.sql); the engine leaves no type out on a table
-- without it.
{{if .Others}}
      AND NOT EXISTS (SELECT 1 FROM {{.Table}} o
        WHERE o.natural_key = m.natural_key AND o.id < m.id AND o.direction = 'OUT'
          AND (o.status IN ('PENDING', 'ERROR') OR o.status IS NULL) AND coalesce(o.attempts, 0) < @max
          AND o.type = ANY(@others::text[])){{end}}

-- name: poll
-- The idle poll, one statement: is the server writable, does this session
-- win the election for the statement's own length (a transaction-scoped
-- lock, gone when the statement ends: nobody waits on it, a JVM replica
-- trying at that instant coalesces), and is there anything to deliver? Only a
-- poll that finds work takes the election for real. @limit is 1. The backend's
-- pid says, on the relay's own session, that it still is the one it holds.
SELECT l.read_only, l.won, l.won AND EXISTS ({{template "candidates" .}}), pg_backend_pid()
FROM (SELECT r.read_only, NOT r.read_only AND pg_try_advisory_xact_lock(hashtext(@key)) AS won
  FROM (SELECT pg_is_in_recovery() OR current_setting('transaction_read_only')::bool AS read_only OFFSET 0) r
  OFFSET 0) l

-- name: partitionWork
-- Sent in a partitioned member's rebalance round trip, after it (partitions.go):
-- is anything deliverable in the partitions @parts of @n, those the member
-- held before? An idle member then makes no select. @limit is 1. The
-- session's last statement, it carries the election's mark, which
-- pg_stat_activity.query shows (Admin.Election).
{{template "electionMark"}} SELECT EXISTS ({{template "candidates" .}})

-- name: payload @id @room @chunk
-- A large payload, measured before it is sent, and read in chunks of @chunk
-- bytes: pgx reads each row into a buffer of its size, so a payload that came
-- as one value would be held twice (pgx's buffer and the copy kept). Above
-- @room bytes (what is left of the batch's budget) only its size comes back,
-- in one row, and nothing of it is read. Each chunk says where it starts
-- (1-based), so their order does not matter.
SELECT s.n, g.i, CASE WHEN s.n <= @room THEN substring(s.b FROM g.i FOR @chunk) END
FROM (SELECT p.b, octet_length(p.b) AS n
  FROM (SELECT convert_to(payload::text, 'UTF8') AS b FROM {{.Table}} WHERE id = @id OFFSET 0) p OFFSET 0) s
CROSS JOIN LATERAL generate_series(1, CASE WHEN s.n <= @room THEN greatest(s.n, 1) ELSE 1 END, @chunk) AS g(i)

-- name: headersAdded @table
-- Sent with the preflight when the table had no headers column at the
-- probe: has it one now? Then the select must read it, or messages written
-- with headers since would lose them.
SELECT EXISTS (SELECT 1 FROM pg_attribute
  WHERE attrelid = to_regclass(@table) AND attname = 'headers' AND attnum > 0 AND NOT attisdropped)

-- name: probe @table
-- What the relay learns of the table before its first pass: its
-- schema-qualified name, the columns it has, the width of last_error when it
-- is declared narrower than text (varchar(255)), and whether a valid index
-- leads with (natural_key, id) over the waiting rows too (the key index of
-- schema.sql, or one like it): heldByOthers probes it once per candidate.
SELECT n.nspname::text, c.relname::text,
  coalesce((SELECT array_agg(a.attname::text) FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped), '{}'),
  coalesce((SELECT CASE WHEN a.atttypid IN ('varchar'::regtype, 'bpchar'::regtype) AND a.atttypmod > 4 THEN a.atttypmod - 4 END
    FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attname = 'last_error' AND NOT a.attisdropped), 0),
  EXISTS (SELECT 1 FROM pg_index ix
    WHERE ix.indrelid = c.oid AND ix.indisvalid AND ix.indnatts >= 2
      AND ix.indkey[0] = (SELECT attnum FROM pg_attribute WHERE attrelid = c.oid AND attname = 'natural_key' AND NOT attisdropped)
      AND ix.indkey[1] = (SELECT attnum FROM pg_attribute WHERE attrelid = c.oid AND attname = 'id' AND NOT attisdropped)
      AND (ix.indpred IS NULL OR pg_get_expr(ix.indpred, ix.indrelid) LIKE '%PENDING%'))
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.oid = to_regclass(@table)
