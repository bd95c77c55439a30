-- The outcomes of a pass (outcomes.go).
--
-- Every outcome is fenced on the state the pass read (status, attempts, NULLs
-- included): a late writer never overwrites a newer outcome. The new values
-- are written explicitly, never computed from the row.
--
-- With Config.AsyncCommit (.Async), each statement also sets
-- synchronous_commit = off for its own implicit transaction (is_local), in a
-- FROM item: one statement, one round trip, and the commit that ends it does
-- not wait for its WAL flush. Nothing else on the session is touched.

-- name: outcomeSent @id @status @attempts
-- One message sent.
UPDATE {{.Table}} SET status = 'SENT', sent_at = now(), updated_at = now(){{template "asyncFrom" .}}
WHERE id = @id AND status IS NOT DISTINCT FROM @status AND attempts IS NOT DISTINCT FROM @attempts

-- name: outcomeError @id @status @attempts @new_attempts @error
-- One message failed (or dead, at the ceiling).
UPDATE {{.Table}} SET status = 'ERROR', attempts = @new_attempts, last_error = @error, updated_at = now(){{template "asyncFrom" .}}
WHERE id = @id AND status IS NOT DISTINCT FROM @status AND attempts IS NOT DISTINCT FROM @attempts

-- name: outcomeGroup @ids @statuses @attempts @new_statuses @new_attempts @errors
-- Grouped outcomes (Config.GroupOutcomes): one statement, each row still
-- fenced on its own read state; a failure still marks only its own row.
-- "m.id = ANY(@ids)" says again what the join says, in the form the planner
-- turns into a primary-key probe: without it, the first plans hashed the
-- whole table.
UPDATE {{.Table}} AS m SET status = o.new_status, attempts = o.new_attempts,
  last_error = CASE WHEN o.new_status = 'SENT' THEN m.last_error ELSE o.err END,
  sent_at = CASE WHEN o.new_status = 'SENT' THEN now() ELSE m.sent_at END,
  updated_at = now()
FROM unnest(@ids::bigint[], @statuses::text[], @attempts::bigint[], @new_statuses::text[], @new_attempts::bigint[], @errors::text[])
  AS o(id, status, attempts, new_status, new_attempts, err){{if .Async}},
  (SELECT set_config('synchronous_commit', 'off', true)) AS async_commit{{end}}
WHERE m.id = o.id AND m.id = ANY(@ids::bigint[])
  AND m.status IS NOT DISTINCT FROM o.status AND m.attempts IS NOT DISTINCT FROM o.attempts
RETURNING m.id

-- name: outcomeGroupSent @ids
-- The common group: every message sent, every row read as PENDING with no
-- attempt. One array, one fence for all, and the planner probes the primary
-- key: half the server's time of the general statement.
UPDATE {{.Table}} SET status = 'SENT', sent_at = now(), updated_at = now(){{template "asyncFrom" .}}
WHERE id = ANY(@ids::bigint[]) AND status = 'PENDING' AND attempts = 0
RETURNING id

-- name: asyncFrom
-- AsyncCommit's FROM item, on a line of its own.
{{if .Async}}
FROM (SELECT set_config('synchronous_commit', 'off', true)) AS async_commit{{end}}

-- name: rowStates @ids
-- The state of rows whose fenced outcome touched nothing: was it this
-- relay's own earlier write, whose answer was lost?
SELECT id, status::text, attempts::bigint FROM {{.Table}} WHERE id = ANY(@ids::bigint[])
