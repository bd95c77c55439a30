package inbox

import "fmt"

// Every statement of the inbox, and only here.

// schemaLockSQL serialises the replicas that create the tables at once.
const schemaLockSQL = `SELECT pg_advisory_xact_lock(hashtext($1))`

// schemaSQL is the DDL of the inbox's tables.
//
// The messages table is written once per message and read only on a
// duplicate; its BRIN index, a few pages whatever the table's size, costs an
// insert almost nothing and lets retention find old rows without a full scan.
// The keys table is one row per (source table, natural key), updated in place.
// Keys compare as bytes (COLLATE "C"): they are opaque, and a byte comparison
// is the cheapest whatever the database's collation.
func schemaSQL(n names) string {
	return fmt.Sprintf(`-- The messages received: one row per idempotency key, with a hash of its body.
CREATE TABLE IF NOT EXISTS %[1]s (
    idempotency_key text COLLATE "C" PRIMARY KEY,
    body_sha256     bytea       NOT NULL,
    received_at     timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS %[3]s ON %[1]s USING brin (received_at);
-- The last message applied for each key of each outbox table (the stale-drop).
CREATE TABLE IF NOT EXISTS %[2]s (
    source      text COLLATE "C" NOT NULL,
    message_key text COLLATE "C" NOT NULL,
    message_id  bigint      NOT NULL,
    applied_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (source, message_key)
);
`, n.table, n.keys, n.received)
}

// statements are the inbox's statements on its tables.
type statements struct {
	// record records a message's key: one row affected when it is new.
	record string
	// recordNewest records a message's key and, when it is new, makes its id
	// its key's last applied one unless that is as high already. It returns
	// (new, newest). The conflict clause takes the key's row lock, so two
	// deliveries of one key serialise and the higher id wins.
	recordNewest string
	// bodyHash reads a recorded message's body hash.
	bodyHash string
	// purge deletes up to $2 messages received more than $1 microseconds ago.
	purge string
}

func newStatements(n names) statements {
	return statements{
		record: fmt.Sprintf(`INSERT INTO %s (idempotency_key, body_sha256) VALUES ($1, $2)
ON CONFLICT (idempotency_key) DO NOTHING`, n.table),
		recordNewest: fmt.Sprintf(`WITH seen AS (
    INSERT INTO %[1]s (idempotency_key, body_sha256) VALUES ($1, $2)
    ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING 1
), newest AS (
    INSERT INTO %[2]s AS k (source, message_key, message_id)
    SELECT $3::text, $4::text, $5::bigint FROM seen
    ON CONFLICT (source, message_key) DO UPDATE
    SET message_id = excluded.message_id, applied_at = now()
    WHERE k.message_id < excluded.message_id
    RETURNING 1
)
SELECT EXISTS (SELECT FROM seen), EXISTS (SELECT FROM newest)`, n.table, n.keys),
		bodyHash: fmt.Sprintf(`SELECT body_sha256 FROM %s WHERE idempotency_key = $1`, n.table),
		purge: fmt.Sprintf(`DELETE FROM %[1]s WHERE idempotency_key = ANY (ARRAY(
    SELECT idempotency_key FROM %[1]s
    WHERE received_at < now() - $1::bigint * interval '1 microsecond'
    LIMIT $2))`, n.table),
	}
}
