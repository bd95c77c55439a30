-- One type, one app (registry.go here, internal/election/ownership.go; decision 0043). A started relay
-- delivers a type only while its presence session holds the type's delivers key in shared mode,
-- (hashtext('relay_delivers:' || table), hashtext(type)): the relays of one app share it, and a relay takes
-- it only while no session of another app holds it, deciding under a transaction lock on the table's name
-- so that two apps never both take it. The table's registry ({{.Registry}}, which CreateTable makes) keeps
-- which app delivered each type last, for the tools, while that app's relays are down.

-- name: registryExists @registry
-- Whether the table's registry exists (a table made by another migration has none).
SELECT to_regclass(@registry) IS NOT NULL

-- name: claimLock @table @idle_ms @wait_ms
-- Serialises the claims of every relay of the table, whatever its app, until the transaction ends. A
-- session that stops answering in the claim's transaction holds its locks until the server ends it: the
-- transaction's own idle_in_transaction_session_timeout bounds that (idle_session_timeout does not apply
-- inside a transaction), and lock_timeout the wait of the claims behind it.
SELECT pg_advisory_xact_lock(hashtext('relay_delivers'), hashtext(@table))
FROM (SELECT set_config('idle_in_transaction_session_timeout', @idle_ms, true), set_config('lock_timeout', @wait_ms, true) OFFSET 0) s

-- name: claimLook @app @table @types
-- Per type of @types: a session of another app than @app that holds its delivers key (0: none), that
-- session's last statement (its presence descriptor names its app), and the app the registry names.
SELECT t.type, coalesce(h.pid, 0), coalesce(a.query, ''), {{if .Registry}}coalesce(r.app, ''){{else}}''{{end}}
FROM unnest(@types::text[]) AS t(type)
LEFT JOIN LATERAL (
  SELECT d.pid FROM pg_locks d
  WHERE d.locktype = 'advisory' AND d.objsubid = 2 AND d.granted AND d.mode = 'ShareLock'
    AND d.database = (SELECT oid FROM pg_database WHERE datname = current_database())
    AND d.classid = (hashtext('relay_delivers:' || @table)::bigint & 4294967295)::oid
    AND d.objid = (hashtext(t.type)::bigint & 4294967295)::oid
    AND NOT EXISTS (SELECT 1 FROM pg_locks o
      WHERE o.pid = d.pid AND o.locktype = 'advisory' AND o.objsubid = 2 AND o.granted AND o.database = d.database
        AND o.classid = (hashtext('relay_presence_app')::bigint & 4294967295)::oid
        AND o.objid = (hashtext(@app)::bigint & 4294967295)::oid)
  ORDER BY d.pid LIMIT 1
) h ON true
LEFT JOIN pg_stat_activity a ON a.pid = h.pid{{if .Registry}}
LEFT JOIN {{.Registry}} r ON r.type = t.type{{end}}
ORDER BY t.type

-- name: claimTake @table @types
-- Takes the delivers keys of @types on this session, shared: the relays of one app hold them together.
SELECT coalesce(bool_and(pg_try_advisory_lock_shared(hashtext('relay_delivers:' || @table), hashtext(t))), true)
FROM unnest(@types::text[]) AS t

-- name: claimRecord @types @app @max_attempts
-- Records that @app delivers @types: since when it does (kept while it is the same app), its last start.
INSERT INTO {{.Registry}} AS r (type, app, max_attempts)
SELECT t, @app, @max_attempts FROM unnest(@types::text[]) AS t
ON CONFLICT (type) DO UPDATE SET app = excluded.app, max_attempts = excluded.max_attempts, started_at = now(),
  since = CASE WHEN r.app = excluded.app THEN r.since ELSE now() END

-- name: deliversRelease @table @types @pid
-- Lets go of the delivers keys of @types, on backend @pid only (presenceRelease says why).
SELECT coalesce(bool_and(pg_advisory_unlock_shared(hashtext('relay_delivers:' || @table), hashtext(t))), true)
FROM unnest(@types::text[]) AS t WHERE pg_backend_pid() = @pid::int

-- name: registryRead
-- The registry, for Admin: which app delivered each type last, since when, its last start and ceiling.
SELECT type, app, since, started_at, coalesce(max_attempts, 0) FROM {{.Registry}} ORDER BY type
