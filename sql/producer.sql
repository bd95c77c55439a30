-- Enqueue's insert (store_producer.go).

-- name: enqueue @type @key @payload @table
-- One outbound PENDING row; its id comes back. The payload goes as text cast
-- to jsonb, which works in every pgx query mode. The key's order lock
-- (keyOrderLock) is taken in the same statement, before the id is drawn: two
-- transactions writing messages of one key get their ids in the order they
-- commit. With .Wake, the NOTIFY rides in the same statement (wakeToken): it
-- is sent when the producer's transaction commits, and never if it rolls back.
INSERT INTO {{.Table}} (direction, type, natural_key, payload, status, attempts)
SELECT 'OUT', @type, @key, @payload::jsonb, 'PENDING', 0
FROM (SELECT {{template "keyOrderLock"}}{{if .Wake}}, {{template "wakeToken"}}{{end}}) AS key_order
RETURNING id

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
-- when @due, the producer's own window, says a NOTIFY is due anyway (a token
-- held by a long transaction must not silence everyone else for its length).
-- WakeTriggerSQL's trigger takes the same token (sql/wake.sql).
--
-- The token is tried first, in a CASE of its own: "try OR @due" would let the
-- planner fold a true @due and never take the token.
CASE WHEN pg_try_advisory_xact_lock(hashtext('relay:wake'), hashtext(@channel)) THEN pg_notify(@channel, @type)
  WHEN @due::bool THEN pg_notify(@channel, @type) END
