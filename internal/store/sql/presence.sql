-- Presence (presence.go here, internal/election/presence.go): the shared advisory locks a
-- started relay holds on its listener's session for as long as it lives, and
-- Admin's reading of them (admin_presence.go). Every statement a relay runs
-- on that session is sent after the relay's own descriptor comment
-- ("/* relay presence {...} */ "), which pg_stat_activity.query shows.

-- name: presenceKeys @app @replica @max_attempts @partitions @types @table
-- A replica's presence keys, two ints each, in namespaces of their own. The
-- table's (its name without the schema) is in a namespace of every app's, so
-- that another app's Admin tells the relays of its table from the others'.
SELECT hashtext('relay_presence_app') AS a, hashtext(@app) AS b
  UNION ALL SELECT hashtext('relay_presence_table'), hashtext(@table)
  UNION ALL SELECT hashtext('relay_presence_replica:' || @app), @replica::int
  UNION ALL SELECT hashtext('relay_presence_max_attempts:' || @app), @max_attempts::int
  UNION ALL SELECT hashtext('relay_presence_partitions:' || @app), @partitions::int
  UNION ALL SELECT hashtext('relay_presence_type:' || @app), hashtext(t) FROM unnest(@types::text[]) t

-- name: presenceTake @app @replica @max_attempts @partitions @types @table @idle_timeout @keepalive_idle @keepalive_interval @keepalive_count @user_timeout
-- Takes the presence locks and sets the session's lease, in one round trip:
-- @idle_timeout idle_session_timeout (ms), and the same inside a transaction
-- (the claim of the relay's types opens one: a client cut off between its
-- BEGIN and its first statement would otherwise leave the session, and its
-- locks, idle in a transaction for good); on PostgreSQL 13 the TCP
-- keepalives (s) and @user_timeout tcp_user_timeout (ms).
SELECT s.pid, s.ok, set_config('idle_in_transaction_session_timeout', @idle_timeout, false),
  CASE WHEN s.version >= 140000 THEN set_config('idle_session_timeout', @idle_timeout, false) END,
  CASE WHEN s.version < 140000 THEN set_config('tcp_keepalives_idle', @keepalive_idle, false) || set_config('tcp_keepalives_interval', @keepalive_interval, false)
    || set_config('tcp_keepalives_count', @keepalive_count, false) || set_config('tcp_user_timeout', @user_timeout, false) END
FROM (SELECT pg_backend_pid() AS pid, coalesce(bool_and(pg_try_advisory_lock_shared(k.a, k.b)), false) AS ok,
    current_setting('server_version_num')::int AS version
  FROM ({{template "presenceKeys"}}) k OFFSET 0) s

-- name: presenceBeat
-- The keepalive of the presence session: within its idle_session_timeout, and
-- still the backend that took the locks.
SELECT pg_backend_pid()

-- name: presenceRelease @app @replica @max_attempts @partitions @types @table @pid
-- Lets go of the presence locks before the session is closed: these locks
-- only, and only on backend @pid, the one that took them. Through a pooler
-- that does not keep sessions (a missed check, pooling.go) the statement
-- may run on a server connection that holds another replica's election,
-- which an unlock of every lock would take from under its passes. The
-- first column is NULL on another backend, the second says where it ran.
SELECT bool_and(pg_advisory_unlock_shared(k.a, k.b)), pg_backend_pid()
FROM ({{template "presenceKeys"}}) k WHERE pg_backend_pid() = @pid::int

-- name: presenceStranded @app @replica @pid
-- Ends backend @pid while it holds this replica's presence lock: its session
-- was closed without the release answered (Stop cut its keepalive, or a
-- statement handed to it, short), and a backend busy in a statement notices
-- that its client has gone only when the statement ends. The replica's lock
-- is this relay's own: no other session takes it.
SELECT pg_terminate_backend(l.pid) FROM pg_locks l
WHERE l.locktype = 'advisory' AND l.pid = @pid::int AND l.objsubid = 2
  AND l.classid = (hashtext('relay_presence_replica:' || @app)::bigint & 4294967295)::oid
  AND l.objid = (@replica::int::bigint & 4294967295)::oid

-- name: replicas @app @names
-- The sessions holding the app's presence key, with their other presence
-- locks, and the hashes of @names (type names to recognise), in order.
WITH l AS (SELECT pid, classid::bigint AS c, objid::bigint AS o FROM pg_locks
    WHERE locktype = 'advisory' AND objsubid = 2 AND granted AND mode = 'ShareLock'
      AND database = (SELECT oid FROM pg_database WHERE datname = current_database())),
  ns AS (SELECT hashtext('relay_presence_app')::bigint & 4294967295 AS app_ns, hashtext(@app)::bigint & 4294967295 AS app_id,
    hashtext('relay_presence_replica:' || @app)::bigint & 4294967295 AS replica_ns,
    hashtext('relay_presence_max_attempts:' || @app)::bigint & 4294967295 AS max_ns,
    hashtext('relay_presence_partitions:' || @app)::bigint & 4294967295 AS parts_ns,
    hashtext('relay_presence_type:' || @app)::bigint & 4294967295 AS type_ns),
  m AS (SELECT DISTINCT l.pid FROM l, ns WHERE l.c = ns.app_ns AND l.o = ns.app_id)
SELECT m.pid, coalesce(a.application_name, ''), coalesce(host(a.client_addr), ''), a.backend_start,
  a.backend_start IS NULL, coalesce(a.query, ''), now(),
  coalesce((SELECT min(o) FROM l WHERE l.pid = m.pid AND l.c = ns.replica_ns), 0),
  coalesce((SELECT min(o) FROM l WHERE l.pid = m.pid AND l.c = ns.max_ns), 0),
  coalesce((SELECT min(o) FROM l WHERE l.pid = m.pid AND l.c = ns.parts_ns), 0),
  coalesce((SELECT array_agg(o ORDER BY o) FROM l WHERE l.pid = m.pid AND l.c = ns.type_ns), '{}'),
  coalesce((SELECT array_agg(hashtext(t)::bigint & 4294967295 ORDER BY n) FROM unnest(@names::text[]) WITH ORDINALITY u(t, n)), '{}')
FROM m CROSS JOIN ns LEFT JOIN pg_stat_activity a ON a.pid = m.pid
ORDER BY a.backend_start, m.pid

-- name: otherReplicas @app @names @table
-- The sessions holding the presence key of another app than @app, with
-- every shared two-int advisory lock they hold (their types' among them),
-- and the hashes of @names, in order: a type is served by a session that
-- holds its hash. Then whether it holds the table key of @table (the
-- Admin's table without its schema), and any table key (an older relay
-- holds none). Their descriptors (the query) say the rest.
WITH l AS (SELECT pid, classid::bigint AS c, objid::bigint AS o FROM pg_locks
    WHERE locktype = 'advisory' AND objsubid = 2 AND granted AND mode = 'ShareLock'
      AND database = (SELECT oid FROM pg_database WHERE datname = current_database())),
  ns AS (SELECT hashtext('relay_presence_app')::bigint & 4294967295 AS app_ns, hashtext(@app)::bigint & 4294967295 AS app_id),
  m AS (SELECT DISTINCT l.pid FROM l, ns WHERE l.c = ns.app_ns AND l.o <> ns.app_id)
SELECT m.pid, coalesce(a.application_name, ''), coalesce(host(a.client_addr), ''), a.backend_start,
  a.backend_start IS NULL, coalesce(a.query, ''), now(),
  coalesce((SELECT array_agg(DISTINCT o) FROM l WHERE l.pid = m.pid), '{}'),
  coalesce((SELECT array_agg(hashtext(t)::bigint & 4294967295 ORDER BY n) FROM unnest(@names::text[]) WITH ORDINALITY u(t, n)), '{}'),
  EXISTS (SELECT 1 FROM l WHERE l.pid = m.pid AND l.c = hashtext('relay_presence_table')::bigint & 4294967295
    AND l.o = hashtext(@table)::bigint & 4294967295),
  EXISTS (SELECT 1 FROM l WHERE l.pid = m.pid AND l.c = hashtext('relay_presence_table')::bigint & 4294967295)
FROM m LEFT JOIN pg_stat_activity a ON a.pid = m.pid
ORDER BY a.backend_start, m.pid

-- name: hasColumn @table @column
-- Whether @table has the column @column (an optional one: requeued_at).
SELECT EXISTS (SELECT 1 FROM pg_attribute
  WHERE attrelid = to_regclass(@table) AND attname = @column AND attnum > 0 AND NOT attisdropped)

-- name: tableIndexes @table
-- The indexes of @table (indexes.go): name, key columns, predicate, validity.
SELECT coalesce(json_agg(json_build_object('name', ic.relname::text,
    'cols', (SELECT coalesce(array_agg(a.attname::text ORDER BY k.ord), '{}') FROM unnest(ix.indkey::int2[]) WITH ORDINALITY k(attnum, ord)
      JOIN pg_attribute a ON a.attrelid = ix.indrelid AND a.attnum = k.attnum),
    'pred', coalesce(pg_get_expr(ix.indpred, ix.indrelid), ''),
    'valid', ix.indisvalid)), '[]')
FROM pg_index ix JOIN pg_class ic ON ic.oid = ix.indexrelid
WHERE ix.indrelid = to_regclass(@table)
