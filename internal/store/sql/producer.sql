-- Enqueue's and EnqueueMany's inserts (producer.go; the root's store_producer.go
-- runs them).

-- name: enqueue @type @key @payload @table
-- One outbound PENDING row; its id comes back. The payload goes as text cast
-- to jsonb, which works in every pgx query mode. The key's order lock
-- (keyOrderLock) is taken in the same statement, before the id is drawn: two
-- transactions writing messages of one key get their ids in the order they
-- commit. With .Wake, the statement also tries the wake-up (wakeToken), whose
-- NOTIFY is sent when the producer's transaction commits, and never if it
-- rolls back; the CTE is evaluated once, before the row (the insert reads
-- it), and the second column says whether it notified. With .Headers, the
-- message's headers go into the optional column (a table without it takes
-- every message without headers as before); @headers is the last parameter.
{{if .Wake}}WITH key_order AS MATERIALIZED (SELECT {{template "keyOrderLock"}}, {{template "wakeToken"}} AS notified)
INSERT INTO {{.Table}} (direction, type, natural_key, payload, status, attempts{{if .Headers}}, headers{{end}})
SELECT 'OUT', @type, @key, @payload::jsonb, 'PENDING', 0{{if .Headers}}, @headers::jsonb{{end}} FROM key_order
RETURNING id, (SELECT notified FROM key_order){{else}}INSERT INTO {{.Table}} (direction, type, natural_key, payload, status, attempts{{if .Headers}}, headers{{end}})
SELECT 'OUT', @type, @key, @payload::jsonb, 'PENDING', 0{{if .Headers}}, @headers::jsonb{{end}}
FROM (SELECT {{template "keyOrderLock"}}) AS key_order
RETURNING id{{end}}

-- name: enqueueMany @types @keys @payloads @table
-- EnqueueMany's insert: one outbound PENDING row per element of the arrays
-- @types, @keys and @payloads (one message each, in the caller's order), in
-- one statement; the ids come back as one text of comma-separated ids,
-- which every driver reads (database/sql scans no arrays), in no set order:
-- the caller sorts them, which gives the messages' order (below). Every
-- key's order lock (keyOrderLock) is taken first, once per distinct key, in
-- the order of the locks' own numbers (hashtext(key)), not of the batch:
-- two statements writing overlapping keys take their common locks in one
-- order, so neither can hold a lock the other waits for while it waits for
-- one the other holds. The locks are a MATERIALIZED CTE joined
-- to every row, so no row, and no id, exists before all of them are held.
-- The ids are drawn in the messages' order: the INSERT's defaults (nextval
-- among them) are computed above its SELECT's ORDER BY, so a key's messages
-- of one batch are delivered in the batch's order. With .Wake, the
-- statement also tries the wake-up token once (wakeTypes) and, with it,
-- notifies each type of @wake_types. With .Headers, @headers are the
-- messages' headers as JSON text, '' for none; @headers is the last parameter.
WITH key_order AS MATERIALIZED (
  SELECT count(pg_advisory_xact_lock(hashtext('relay:' || @table), k.lock)) AS locks{{if .Wake}}, {{template "wakeTypes"}} AS notified{{end}}
  FROM (SELECT DISTINCT hashtext(key) AS lock FROM unnest(@keys::text[]) AS key ORDER BY 1) AS k
), inserted AS (
  INSERT INTO {{.Table}} (direction, type, natural_key, payload, status, attempts{{if .Headers}}, headers{{end}})
  SELECT 'OUT', m.type, m.key, m.payload::jsonb, 'PENDING', 0{{if .Headers}}, NULLIF(m.headers, '')::jsonb{{end}}
  FROM key_order, unnest(@types::text[], @keys::text[], @payloads::text[]{{if .Headers}}, @headers::text[]{{end}})
    WITH ORDINALITY AS m(type, key, payload, {{if .Headers}}headers, {{end}}ord)
  ORDER BY m.ord
  RETURNING id
)
SELECT string_agg(id::text, ','){{if .Wake}}, (SELECT notified FROM key_order){{end}} FROM inserted

-- name: keyOrderLock
-- The lock a producer takes, in its transaction, before it writes a message
-- of key @key into table @table (its name without schema), so that ids of one
-- key are drawn in commit order. It is transaction-scoped and two-int, apart
-- from the elections' one-bigint session locks. A producer that writes by
-- plain SQL takes the same lock:
--
--   SELECT pg_advisory_xact_lock(hashtext('relay:' || 'mensagem_m2m'), hashtext(<key>));
pg_advisory_xact_lock(hashtext('relay:' || @table), hashtext(@key))

-- name: wakeToken
-- Notifies channel @channel of type @type when this transaction takes the
-- wake-up token (a transaction-scoped try-lock: one notifying transaction in
-- flight at a time, so notifying commits never queue behind each other), or
-- when @force says a NOTIFY is due anyway (the producer process has not
-- notified for wakeForceAfter: a token held by a long transaction must not
-- silence everyone else for its length); true when it notified.
-- WakeTriggerSQL's trigger takes the same token (sql/wake.sql).
--
-- The token is tried first, in a CASE of its own: "try OR @force" would let
-- the planner fold a true @force and never take the token.
CASE WHEN pg_try_advisory_xact_lock(hashtext('relay:wake'), hashtext(@channel)) THEN (SELECT true FROM pg_notify(@channel, @type))
  WHEN @force::bool THEN (SELECT true FROM pg_notify(@channel, @type)) ELSE false END

-- name: wakeTypes
-- wakeToken for a statement of several types (EnqueueMany): tries the token
-- once and, when it gets it or @force says a NOTIFY is due anyway, notifies
-- channel @channel once per type of @wake_types (the relays wake only for
-- the types they deliver); true when it notified.
CASE WHEN pg_try_advisory_xact_lock(hashtext('relay:wake'), hashtext(@channel)) THEN (SELECT count(pg_notify(@channel, t)) > 0 FROM unnest(@wake_types::text[]) AS t)
  WHEN @force::bool THEN (SELECT count(pg_notify(@channel, t)) > 0 FROM unnest(@wake_types::text[]) AS t) ELSE false END
