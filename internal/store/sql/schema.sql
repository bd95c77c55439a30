-- The outbox table's DDL (schema.go: SchemaSQL, CreateTable).

-- name: schema
-- The table and its indexes, idempotent. {{.Table}} is the quoted table, the
-- index names are the table's (indexName).
CREATE TABLE IF NOT EXISTS {{.Table}} (
    id          bigserial   PRIMARY KEY,
    direction   text        NOT NULL DEFAULT 'OUT' CHECK (direction IN ('IN', 'OUT')),
    type        text        NOT NULL,
    natural_key text        NOT NULL,
    payload     jsonb       NOT NULL,
    status      text        NOT NULL DEFAULT 'PENDING' CHECK (status IN ('PENDING', 'ERROR', 'SENT')),
    attempts    integer     NOT NULL DEFAULT 0,
    last_error  text,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    sent_at     timestamptz,
    headers     jsonb,
    requeued_at timestamptz
);
-- a message's headers (one JSON object of strings), optional: a table made before them gets the column here.
-- The catalog is asked first: ALTER TABLE takes an ACCESS EXCLUSIVE lock even when the column exists, and
-- would queue every producer and relay behind the longest transaction on the table for nothing.
DO $relay$ BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = '{{.Table}}'::regclass
                   AND attname = 'headers' AND NOT attisdropped) THEN
        ALTER TABLE {{.Table}} ADD COLUMN IF NOT EXISTS headers jsonb;
    END IF;
END $relay$;
-- when an operator last re-queued the row (NULL: never), optional: a row waits since then, or since created_at.
-- Asked of the catalog first, as headers is.
DO $relay$ BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = '{{.Table}}'::regclass
                   AND attname = 'requeued_at' AND NOT attisdropped) THEN
        ALTER TABLE {{.Table}} ADD COLUMN IF NOT EXISTS requeued_at timestamptz;
    END IF;
END $relay$;
-- which app delivers each type of the table (decision 0043): one row per type, written by a relay when it
-- starts and when it takes a type over from an app whose relays have all stopped, never per pass. The tools
-- tell one app's rows from another's by it while an app's relays are down. A JVM relay never writes it.
CREATE TABLE IF NOT EXISTS {{.Registry}} (
    type         text        PRIMARY KEY,
    app          text        NOT NULL,
    since        timestamptz NOT NULL DEFAULT now(),
    started_at   timestamptz NOT NULL DEFAULT now(),
    max_attempts integer
);
-- the pass reads only the small live part of the table, however large the SENT history grows
CREATE INDEX IF NOT EXISTS {{.OutboxIndex}} ON {{.Table}} (id)
    WHERE direction = 'OUT' AND status IN ('PENDING', 'ERROR');
-- a pass reads its own types' waiting rows only: another app's backlog sharing the table is never
-- walked (a NULL status, as a table without the column's default leaves it, is read as PENDING)
CREATE INDEX IF NOT EXISTS {{.PendingIndex}} ON {{.Table}} (type, id)
    WHERE direction = 'OUT' AND (status = 'PENDING' OR status IS NULL);
-- failed rows by type and attempts: the range attempts < MaxAttempts stops before the dead rows,
-- however many accumulate
CREATE INDEX IF NOT EXISTS {{.ErrorIndex}} ON {{.Table}} (type, attempts, id)
    WHERE direction = 'OUT' AND status = 'ERROR';
-- per-key order under RetryBackoff: a row waits while an earlier ERROR row of its key waits out its
-- backoff; only ERROR rows can wait, so only they are indexed (a PENDING backlog stays out of it)
CREATE INDEX IF NOT EXISTS {{.RetryIndex}} ON {{.Table}} (natural_key, id)
    WHERE direction = 'OUT' AND status = 'ERROR';
-- per-key order across types: while a type is paused, a select that leaves it out holds a row back
-- behind an earlier live row of its key of that type (decision 0040). Built here on a new or small
-- table only: on a large one, holding producers back for the build is the operator's call (the relay
-- says which statement to run, CONCURRENTLY).
DO $relay$ BEGIN
    IF pg_relation_size('{{.Table}}'::regclass) < 64 * 1024 * 1024 THEN
        CREATE INDEX IF NOT EXISTS {{.KeyIndex}} ON {{.Table}} (natural_key, id)
            WHERE direction = 'OUT' AND (status IN ('PENDING', 'ERROR') OR status IS NULL);
    END IF;
END $relay$;

-- name: schemaLock @name
-- Serialises replicas that create the table (or its wake-up trigger) at the
-- same time: a transaction-scoped advisory lock on the table's name.
SELECT pg_advisory_xact_lock(hashtext(@name))
