-- The wake-up on commit (wake.go here, internal/wake): the relay's listener, and
-- the trigger for producers that do not call Enqueue. Enqueue's own NOTIFY is
-- wakeToken (sql/producer.sql).

-- name: wakeTrigger
-- WakeTriggerSQL: a statement-level trigger on .Table whose function
-- (.Function, beside the table) notifies .Channel (a literal) once per type
-- a statement inserted, when it takes the wake-up token: of several
-- transactions inserting at once, only the one holding it carries the NOTIFY.
CREATE OR REPLACE FUNCTION {{.Function}}() RETURNS trigger LANGUAGE plpgsql AS $relay$
BEGIN
  IF pg_try_advisory_xact_lock(hashtext('relay:wake'), hashtext({{.Channel}})) THEN
    PERFORM pg_notify({{.Channel}}, t.type) FROM (SELECT DISTINCT type FROM relay_new_rows WHERE direction = 'OUT') t;
  END IF;
  RETURN NULL;
END
$relay$;
DROP TRIGGER IF EXISTS relay_wake ON {{.Table}};
CREATE TRIGGER relay_wake AFTER INSERT ON {{.Table}}
  REFERENCING NEW TABLE AS relay_new_rows FOR EACH STATEMENT EXECUTE FUNCTION {{.Function}}();

-- name: listen
-- The listener's subscription to .Channel (a quoted identifier), once per
-- connection.
LISTEN {{.Channel}}

-- name: wakeProbe @channel @payload
-- The listener's own test notification, sent on another connection: through
-- a transaction-pooling proxy it never comes back.
SELECT pg_notify(@channel, @payload)
