package inbox

import (
	"context"
	"fmt"
	"log/slog"
	"time"
)

// PurgeChunk is how many messages one statement of [Inbox.Purge] deletes at
// most, so that a purge of a long history never holds many locks for long.
const PurgeChunk = 1000

// Purge deletes the records of the messages received more than age ago (on
// the database's clock), in statements of at most [PurgeChunk] rows each, and
// returns how many it deleted. The keys' last applied ids are kept: they are
// the stale-drop's state, one row per key.
//
// A message delivered again after its record was purged is no longer known
// as a duplicate: with the stale-drop it is still dropped as [Stale] (its id
// is not above its key's last applied one), without it ([Config.KeepStale])
// it is applied again. So keep records longer than a message can come again:
// longer than the relay's retries of a row last (MaxAttempts with their
// backoff), and than an operator takes to re-queue a dead one. A week is
// ample for most.
//
// It stops at the first error, or when ctx ends between chunks, and returns
// how many it had deleted with the error; running it again resumes. age
// must not be negative.
func (ib *Inbox) Purge(ctx context.Context, age time.Duration) (int64, error) {
	if age < 0 {
		return 0, fmt.Errorf("inbox: Purge: age must not be negative, got %s", age)
	}
	var total int64
	for {
		if err := ctx.Err(); err != nil {
			return total, err
		}
		tag, err := ib.pool.Exec(ctx, ib.sql.purge, age.Microseconds(), PurgeChunk)
		if err != nil {
			return total, fmt.Errorf("inbox: purge %s: %w", ib.table, err)
		}
		total += tag.RowsAffected()
		if tag.RowsAffected() < PurgeChunk {
			return total, nil
		}
	}
}

// RetentionJob returns a job for [relay.Scheduler.Add] that runs [Inbox.Purge]
// with age and logs how many records it deleted. Purge is idempotent, so a
// rare second run of an occurrence is harmless. Give it a key of its own:
//
//	s.Add("relay_inbox_retention", "@hourly", ib.RetentionJob(7*24*time.Hour))
func (ib *Inbox) RetentionJob(age time.Duration) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		start := time.Now()
		n, err := ib.Purge(ctx, age)
		if n > 0 {
			ib.logger.LogAttrs(ctx, slog.LevelInfo, "inbox: retention: purged message records",
				slog.String("table", ib.table), slog.Int64("rows", n), slog.Duration("age", age),
				slog.Duration("duration", time.Since(start)))
		}
		return err
	}
}
