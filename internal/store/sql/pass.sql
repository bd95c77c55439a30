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

-- name: epoch
-- Sent before the select that starts an epoch (a select of every lane from
-- the start), in the same round trip, so its snapshot is taken first: the
-- highest id of the table. A row whose id is above it was drawn after this
-- statement, so a later select probes it (held) for an older row of its key
-- committed late, below a lane's cursor; a row at or below it was drawn
-- before, and every older row of its key (written under the key's order
-- lock, committed before the row's id was drawn) is visible to the epoch's
-- selects. The primary key's last page answers it.
SELECT coalesce(max(id), (-9223372036854775807 - 1)) FROM {{.Table}}

-- name: fetch
-- One batch: each lane's window of deliverable rows (windows), chosen by
-- turns so that every lane with rows has its share (with the key index), or
-- the lowest ids of all (without it), then the chosen rows in id order. A
-- payload up to InlinePayloadMax stored bytes (pg_column_size, perhaps
-- compressed) comes with its row; a larger one is loaded on its own
-- (payload), after its size was checked, so a batch never holds more than
-- BatchBytes.
--
-- held says whether an older live row of the row's key is missing from the
-- batch: then the row is not sent (1: a select from the start finds both; 2:
-- its key waits past this pass, behind a row that waits out its backoff or is
-- of a type that cannot send now). It is the rule of decision 0041, the one
-- that keeps each key's order: never a message while an older live one of its
-- key is unsent. It is asked (a probe of the key index per row) only where
-- such a row can exist (mayHold); elsewhere it is false without a probe.
-- more says that the row's lane had more rows than the batch took. A select
-- of one lane (.OneLane) takes its window whole, as an array: no turns, and
-- no rows kept aside.
--
-- The columns are cast and read as nullable, and a NULL status or attempts is
-- read as PENDING or 0: a table made by another migration (nullable columns,
-- varchar instead of text) never makes the select fail, and a row that cannot
-- be delivered is marked dead by the pass, not skipped. The headers column
-- is optional (a JVM-made table has none): .Headers when the probe found it.
{{if .OneLane}}WITH g AS (SELECT a.ids[1:a.width] AS k, 9223372036854775807 AS cut,
  {{if .Keyed}}cardinality(@all::text[]) > 1 OR {{end}}{{template "failedBehind" .}} AS probe,
  CASE WHEN cardinality(a.ids) > a.width THEN @types::text[] ELSE '{}' END AS more
  FROM (SELECT ty.width, ARRAY({{template "window" .}}) AS ids
    FROM unnest(@types::text[], @after::bigint[], @width::int[]) AS ty(type, after, width) OFFSET 0) a
){{else}}WITH w AS MATERIALIZED ({{template "windows" .}}
), k AS MATERIALIZED (SELECT w.id, w.lane FROM w WHERE w.rn <= w.width ORDER BY {{if .Keyed}}w.rn, {{end}}w.id LIMIT @limit
), l AS MATERIALIZED (SELECT k.lane, max(k.id) AS last, EXISTS (SELECT 1 FROM w WHERE w.lane = k.lane AND w.id > max(k.id)) AS more
  FROM k GROUP BY k.lane
), g AS (SELECT ARRAY(SELECT k.id FROM k) AS k,
  {{if .Keyed}}(SELECT coalesce(min(l.last) FILTER (WHERE l.more), 9223372036854775807) FROM l){{else}}9223372036854775807{{end}} AS cut,
  {{if .Keyed}}cardinality(@types::text[]) < cardinality(@all::text[]) OR {{end}}{{template "failedBehind" .}} AS probe,
  ARRAY(SELECT (@types::text[])[l.lane] FROM l WHERE l.more) AS more
){{end}}
SELECT m.id, m.type::text, m.natural_key::text, m.status::text, m.attempts::bigint, m.created_at::timestamptz,
  {{template "held" .}}, m.type::text = ANY((SELECT g.more FROM g)::text[]),
  pg_column_size(m.payload), CASE WHEN pg_column_size(m.payload) <= {{.InlinePayloadMax}} THEN m.payload::text END{{if .Headers}}, m.headers::text{{end}}
FROM {{.Table}} m
WHERE m.id = ANY((SELECT g.k FROM g)::bigint[])
ORDER BY m.id

-- name: windows
-- The ids of each lane's deliverable rows past its cursor (@types, with
-- @after, one id per type), at most @width of each (a probing lane's is one)
-- and one more, which says that the lane has more, with the lane's number
-- and each row's turn in its lane (rn); partitioned, only of this replica's
-- partitions (partitions.go). A lane's window merges its waiting rows and its
-- failed rows that wait out no backoff, in id order.
--
-- Each part walks an index of its lane's type only (schema.sql): the waiting
-- rows by (type, id) and the failed rows by (type, attempts, id), whose range
-- attempts < ceiling stops before the dead rows. Another app's backlog and
-- the dead rows, however many, are never read. The waiting rows' type is
-- matched by a range, not "=", so that "ORDER BY type, id" is not reduced to
-- "ORDER BY id", which the primary key would offer at the price of walking
-- every row; OFFSET 0 keeps the planner from trading the failed rows' range
-- for a walk in id order, whose attempts are a range with a lower bound that
-- excludes nothing, so a generic plan (genericPlans), which does not know
-- @max, estimates it as a narrow range and keeps to the index.
{{/* starts on a line of its own */}}
  SELECT ty.lane, ty.width, p.id, p.rn
  FROM unnest(@types::text[], @after::bigint[], @width::int[]) WITH ORDINALITY AS ty(type, after, width, lane)
    CROSS JOIN LATERAL unnest(ARRAY({{template "window" .}})) WITH ORDINALITY AS p(id, rn)

-- name: window
-- One lane's window (windows), of lane ty: its ids in order, at most
-- ty.width and one more.
{{/* starts on a line of its own */}}
    SELECT u.id FROM ((SELECT m.id FROM {{.Table}} m
      WHERE m.type >= ty.type AND m.type <= ty.type AND m.direction = 'OUT' AND (m.status = 'PENDING' OR m.status IS NULL)
        AND coalesce(m.attempts, 0) < @max AND m.id > ty.after{{template "inPartitions" .}}
      ORDER BY m.type, m.id LIMIT ty.width + 1){{template "failedOf" (.Failing "m.attempts >= (-9223372036854775807 - 1) AND m.attempts < @max")}}{{template "failedOf" (.Failing "m.attempts IS NULL")}}) u
    ORDER BY u.id LIMIT ty.width + 1

-- name: failedOf
-- The failed rows of a lane's window whose attempts match .Attempts, that
-- wait out no backoff. "e.id + 0": sorted after they are read, so that no
-- plan reads them in id order through the live rows' index, the dead history
-- with them, hoping to stop early; "m.id + 0 > ty.after" for the same reason:
-- a bound on id would let a plan range over the live rows' index (id) and
-- filter out every dead row on the way, which some statistics price lower
-- than the failed rows' index (618 buffers against 32, TestPassCostIgnores-
-- DeadAndForeignRows).
{{/* starts on a line of its own */}}
      UNION ALL
      (SELECT e.id FROM (SELECT m.id FROM {{.Table}} m
        WHERE m.type = ty.type AND m.direction = 'OUT' AND m.status = 'ERROR' AND {{.Attempts}} AND m.id + 0 > ty.after{{template "inPartitions" .}}
          AND NOT {{template "waiting" (.As "m")}}
        OFFSET 0) e ORDER BY e.id + 0 LIMIT ty.width + 1)

-- name: failedBehind
-- Whether a live failed row of a selected lane lies behind its cursor (failed
-- in this epoch, or re-queued: relayctl re-queues a dead row as failed with 0
-- attempts) or waits out its backoff: those are rows no select of this epoch
-- returns, and they hold their keys' later rows. Asked once per select (an
-- InitPlan), of every failed row below the ceiling of each selected type, as
-- failedOf reads them: the failed rows' index, never the dead rows, however
-- many. An aggregate, not EXISTS: a planner that expects an early match
-- would rather read the table than the index.
(SELECT coalesce(bool_or(e.id <= e.after OR {{template "waiting" (.As "e")}}), false)
  FROM unnest(@types::text[], @after::bigint[]) AS ty(type, after) CROSS JOIN LATERAL (
    {{template "failedBehindOf" (.Failing "m.attempts >= (-9223372036854775807 - 1) AND m.attempts < @max")}}
    UNION ALL
    {{template "failedBehindOf" (.Failing "m.attempts IS NULL")}}) e)

-- name: failedBehindOf
-- The failedBehind rows whose attempts match .Attempts.
(SELECT m.id, ty.after, m.attempts, m.updated_at FROM {{.Table}} m
      WHERE m.type = ty.type AND m.direction = 'OUT' AND m.status = 'ERROR' AND {{.Attempts}} OFFSET 0)

-- name: held
-- The held column (fetch). With the key index, a row is probed when the
-- select leaves some of the relay's types out, a failed row lies behind a
-- cursor or waits (failedBehind), another lane's window was cut below it, or
-- it was drawn after the epoch began (@epoch): then any older live row of
-- its key, of the relay's types (@all), that the batch lacks holds it; one of
-- a type that cannot send in this pass (@later) or that waits out its backoff
-- holds it past the pass. Without the key index the engine leaves no type
-- out and takes the lowest ids of all lanes: a row drawn after the epoch
-- began is held (the next epoch takes it), and only an older failed row of
-- its key (the failed rows' index) is probed for.
{{if .Keyed}}CASE WHEN (SELECT g.probe FROM g) OR m.id > (SELECT g.cut FROM g) OR m.id > @epoch THEN
    CASE WHEN NOT EXISTS ({{template "older" .}}) THEN 0
      WHEN EXISTS ({{template "older" .}} AND (o.type = ANY(@later::text[]) OR o.status = 'ERROR' AND {{template "waiting" (.As "o")}})) THEN 2
      ELSE 1 END
  ELSE 0 END{{else}}CASE WHEN m.id > @epoch THEN 1
  WHEN NOT (SELECT g.probe FROM g) OR NOT EXISTS ({{template "older" .}} AND o.status = 'ERROR') THEN 0
  WHEN EXISTS ({{template "older" .}} AND o.status = 'ERROR' AND {{template "waiting" (.As "o")}}) THEN 2
  ELSE 1 END{{end}}

-- name: older
-- The older live rows of row m's key, of the relay's types, that the batch
-- lacks (held). g's values are read as scalar subqueries, computed once per
-- select (InitPlans), never per row. Each is one probe of the key index, (natural_key, id) of the
-- live rows, or, without it, of the failed rows' (schema.sql).
SELECT 1 FROM {{.Table}} o
    WHERE o.natural_key = m.natural_key AND o.id < m.id AND o.direction = 'OUT'
      AND (o.status IN ('PENDING', 'ERROR') OR o.status IS NULL) AND coalesce(o.attempts, 0) < @max
      AND o.type = ANY(@all::text[]) AND o.id <> ALL((SELECT g.k FROM g)::bigint[])

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
      AND coalesce(m.attempts, 0) < @max AND m.id > @after{{template "inPartitions" .}}{{template "heldBack" .}}
    ORDER BY m.type, m.id LIMIT @limit) p{{template "failed" (.Failing "m.attempts >= (-9223372036854775807 - 1) AND m.attempts < @max")}}{{template "failed" (.Failing "m.attempts IS NULL")}}

-- name: failed
-- The failed rows of candidates whose attempts match .Attempts, that wait out
-- no backoff.
{{/* starts on a line of its own */}}
  UNION ALL
  (SELECT e.id FROM (SELECT m.id FROM {{.Table}} m
    WHERE m.type = ANY(@types::text[]) AND m.direction = 'OUT' AND m.status = 'ERROR' AND {{.Attempts}} AND m.id > @after{{template "inPartitions" .}}
      AND NOT {{template "waiting" (.As "m")}}{{template "heldBack" .}}
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
-- overflows; a NULL updated_at does not wait, nor does a failed row with 0
-- attempts, which only a re-queue makes (it is due at once). Without a backoff
-- nothing waits.
{{if .Backoff}}coalesce(coalesce({{.Alias}}.attempts, 1) <> 0 AND {{.Alias}}.updated_at > now() - make_interval(secs => least(@backoff::float8 * power(2::float8, least(greatest(coalesce({{.Alias}}.attempts, 0), 1) - 1, 40)), @cap::float8)), false){{else}}false{{end}}

-- name: heldBack
-- A row waits while an earlier failed row of its key waits out its backoff:
-- a retry never lets a later message of its key overtake it.
{{if .Backoff}}
      AND NOT EXISTS (SELECT 1 FROM {{.Table}} e
        WHERE e.natural_key = m.natural_key AND e.id < m.id AND e.direction = 'OUT' AND e.status = 'ERROR'
          AND e.type = ANY(@types::text[]) AND (e.attempts < @max OR e.attempts IS NULL) AND {{template "waiting" (.As "e")}}){{end}}

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
-- is declared narrower than text (varchar(255)), whether a valid index
-- leads with (natural_key, id) over the waiting rows too (the key index of
-- schema.sql, or one like it: held probes it), and how many ids the id's
-- sequence hands each session at once (its CACHE: above 1, ids are not drawn
-- in commit order across sessions, which per-key order relies on).
SELECT n.nspname::text, c.relname::text,
  coalesce((SELECT array_agg(a.attname::text) FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped), '{}'),
  coalesce((SELECT CASE WHEN a.atttypid IN ('varchar'::regtype, 'bpchar'::regtype) AND a.atttypmod > 4 THEN a.atttypmod - 4 END
    FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attname = 'last_error' AND NOT a.attisdropped), 0),
  EXISTS (SELECT 1 FROM pg_index ix
    WHERE ix.indrelid = c.oid AND ix.indisvalid AND ix.indnatts >= 2
      AND ix.indkey[0] = (SELECT attnum FROM pg_attribute WHERE attrelid = c.oid AND attname = 'natural_key' AND NOT attisdropped)
      AND ix.indkey[1] = (SELECT attnum FROM pg_attribute WHERE attrelid = c.oid AND attname = 'id' AND NOT attisdropped)
      AND (ix.indpred IS NULL OR pg_get_expr(ix.indpred, ix.indrelid) LIKE '%PENDING%')),
  coalesce((SELECT max(s.seqcache) FROM pg_depend d JOIN pg_sequence s ON s.seqrelid = d.objid
    WHERE d.classid = 'pg_class'::regclass AND d.refclassid = 'pg_class'::regclass AND d.refobjid = c.oid AND d.deptype IN ('a', 'i')
      AND d.refobjsubid = (SELECT attnum FROM pg_attribute WHERE attrelid = c.oid AND attname = 'id' AND NOT attisdropped)), 1)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE c.oid = to_regclass(@table)
