package inbox_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/xadm/relay"
	"github.com/xadm/relay/inbox"
	"github.com/xadm/relay/internal/testkit/pgserver"
)

// TestReceiveOnce: a message delivered twice is applied once; the second
// delivery is a duplicate and apply does not run.
func TestReceiveOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ib := b.inbox(t)
	ctx := context.Background()
	calls := 0
	apply := func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		calls++
		return b.apply(ctx, tx, m)
	}

	got, err := ib.Receive(ctx, msg("order-1", 1), apply)
	require.NoError(t, err)
	require.Equal(t, inbox.Applied, got)
	got, err = ib.Receive(ctx, msg("order-1", 1), apply)
	require.NoError(t, err)
	require.Equal(t, inbox.Duplicate, got)

	require.Equal(t, 1, calls)
	require.Equal(t, 1, b.effectCount(t, "public.outbox/1"))
}

// TestReceiveStale: a message whose id is below its key's last applied one is
// stale; ids are compared per outbox table and key; KeepStale applies it.
func TestReceiveStale(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("Drop", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ib := b.inbox(t)
		for _, step := range []struct {
			m    inbox.Message
			want inbox.Outcome
		}{
			{msg("order-1", 1), inbox.Applied},
			{msg("order-1", 3), inbox.Applied},
			{msg("order-1", 2), inbox.Stale},     // a deposed leader's late request
			{msg("order-1", 3), inbox.Duplicate}, // a re-delivery
			{msg("order-2", 4), inbox.Applied},   // another key: its own order
			{msg("", 6), inbox.Applied},          // the empty key is a key
			{msg("", 5), inbox.Stale},
		} {
			got, err := ib.Receive(ctx, step.m, b.apply)
			require.NoError(t, err, "message %d of %q", step.m.ID, step.m.Key)
			require.Equal(t, step.want, got, "message %d of %q", step.m.ID, step.m.Key)
		}
		// Another outbox table's ids are not comparable: its message 2 applies.
		other := msg("order-1", 2)
		other.IdempotencyKey = "billing.outbox/2"
		got, err := ib.Receive(ctx, other, b.apply)
		require.NoError(t, err)
		require.Equal(t, inbox.Applied, got)

		require.Equal(t, 0, b.effectCount(t, "public.outbox/2"), "the stale message has no effect")
		require.Equal(t, 5, b.count(t, "fx"))
		// The stale message is recorded: a replay is a duplicate.
		got, err = ib.Receive(ctx, msg("order-1", 2), b.apply)
		require.NoError(t, err)
		require.Equal(t, inbox.Duplicate, got)
	})

	t.Run("Keep", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ib := b.inbox(t, func(c *inbox.Config) { c.KeepStale = true })
		for _, id := range []int64{1, 3, 2} {
			got, err := ib.Receive(ctx, msg("order-1", id), b.apply)
			require.NoError(t, err)
			require.Equal(t, inbox.Applied, got, "message %d", id)
		}
		got, err := ib.Receive(ctx, msg("order-1", 2), b.apply)
		require.NoError(t, err)
		require.Equal(t, inbox.Duplicate, got)
		require.Equal(t, 3, b.count(t, "fx"))
		require.Equal(t, 0, b.count(t, "keys"), "no per-key state is kept")
	})
}

// TestReceiveBodyMismatch: a replayed idempotency key with another body is
// refused, permanently, and nothing is applied (the IETF draft's 422 case).
func TestReceiveBodyMismatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ib := b.inbox(t)
	ctx := context.Background()
	_, err := ib.Receive(ctx, msg("order-1", 1), b.apply)
	require.NoError(t, err)

	edited := msg("order-1", 1)
	edited.Body = []byte(`{"id": 1, "edited": true}`)
	got, err := ib.Receive(ctx, edited, b.apply)
	require.ErrorIs(t, err, inbox.ErrBodyMismatch)
	require.True(t, relay.IsPermanent(err))
	require.Contains(t, err.Error(), "public.outbox/1")
	require.Zero(t, got)
	require.Equal(t, 1, b.count(t, "fx"))
}

// TestReceiveApplyFails: apply's error, permanent or not, and its panic roll
// the message's record back with its effects, so a later delivery applies it.
func TestReceiveApplyFails(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, tc := range []struct {
		name      string
		apply     func(context.Context, pgx.Tx, inbox.Message) error
		permanent bool
		logged    string
	}{
		{"Error", func(context.Context, pgx.Tx, inbox.Message) error { return errors.New("downstream busy") }, false, ""},
		{"Permanent", func(context.Context, pgx.Tx, inbox.Message) error {
			return relay.Permanent(errors.New("total is negative"))
		}, true, ""},
		{"Panic", func(context.Context, pgx.Tx, inbox.Message) error { panic("nil map") }, false, "inbox: apply panicked"},
		{"AbortedTx", func(ctx context.Context, tx pgx.Tx, _ inbox.Message) error {
			_, err := tx.Exec(ctx, "SELECT 1/0")
			return err
		}, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ib := b.inbox(t)
			// The effect is written before apply fails: it must roll back too.
			failing := func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
				if err := b.apply(ctx, tx, m); err != nil {
					return err
				}
				return tc.apply(ctx, tx, m)
			}
			_, err := ib.Receive(ctx, msg("order-1", 1), failing)
			require.Error(t, err)
			require.Equal(t, tc.permanent, relay.IsPermanent(err), "permanent: %v", err)
			require.Contains(t, err.Error(), "inbox: message public.outbox/1: apply: ")
			if tc.logged != "" {
				require.Contains(t, b.logs.String(), tc.logged)
			}
			require.Equal(t, 0, b.count(t, "fx"))
			require.Equal(t, 0, b.count(t, "inbox"))
			require.Equal(t, 0, b.count(t, "keys"))

			got, err := ib.Receive(ctx, msg("order-1", 1), b.apply)
			require.NoError(t, err)
			require.Equal(t, inbox.Applied, got, "the retry applies the message")
		})
	}
}

// TestReceiveConcurrent: deliveries racing each other serialise on the
// inbox's rows. Copies of one message: one applies, the others are
// duplicates. Messages of one key in any order: the key ends on the newest,
// and no message older than the key's state is applied after it.
func TestReceiveConcurrent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("OneMessage", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ib := b.inbox(t)
		outcomes := receiveAll(t, ib, b, []inbox.Message{msg("k", 7), msg("k", 7), msg("k", 7), msg("k", 7), msg("k", 7), msg("k", 7)})
		require.Equal(t, map[inbox.Outcome]int{inbox.Applied: 1, inbox.Duplicate: 5}, outcomes)
		require.Equal(t, 1, b.count(t, "fx"))
	})

	t.Run("OneKey", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		ib := b.inbox(t)
		var ms []inbox.Message
		for id := int64(1); id <= 8; id++ {
			ms = append(ms, msg("k", id))
		}
		outcomes := receiveAll(t, ib, b, ms)
		require.Equal(t, 8, outcomes[inbox.Applied]+outcomes[inbox.Stale])
		// The effects, in commit order (ctid order here: one insert each),
		// have strictly growing ids: none applied over a newer one.
		rows, err := b.pool.Query(ctx, "SELECT message_id FROM "+b.effects+" ORDER BY ctid")
		require.NoError(t, err)
		ids, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		require.NoError(t, err)
		require.IsIncreasing(t, ids)
		require.Equal(t, int64(8), ids[len(ids)-1], "the newest message is applied")
	})
}

// receiveAll receives ms at once, one goroutine each, and counts the outcomes.
func receiveAll(t *testing.T, ib *inbox.Inbox, b *bundle, ms []inbox.Message) map[inbox.Outcome]int {
	t.Helper()
	var (
		mu       sync.Mutex
		outcomes = map[inbox.Outcome]int{}
		wg       sync.WaitGroup
		start    = make(chan struct{})
	)
	for _, m := range ms {
		wg.Go(func() {
			<-start
			got, err := ib.Receive(context.Background(), m, b.apply)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				t.Errorf("message %d: %v", m.ID, err)
			}
			outcomes[got]++
		})
	}
	close(start)
	wg.Wait()
	return outcomes
}

// TestReceiveRefuses: a message the inbox cannot record is refused,
// permanently, with the field named, and nothing is written.
func TestReceiveRefuses(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ib := b.inbox(t)
	keep := b.inbox(t, func(c *inbox.Config) { c.KeepStale = true })
	ctx := context.Background()
	with := func(change func(*inbox.Message)) inbox.Message {
		m := msg("order-1", 1)
		change(&m)
		return m
	}
	for _, tc := range []struct {
		name string
		m    inbox.Message
		want string
	}{
		{"NoKey", with(func(m *inbox.Message) { m.IdempotencyKey = "" }), "Message.IdempotencyKey is empty"},
		{"LongKey", with(func(m *inbox.Message) { m.IdempotencyKey = strings.Repeat("k", 256) }), "Message.IdempotencyKey is 256 bytes long, over the limit of 255"},
		{"ControlKey", with(func(m *inbox.Message) { m.IdempotencyKey = "a\nb" }), `Message.IdempotencyKey "a\nb" is not UTF-8 without control characters`},
		{"NotUTF8Key", with(func(m *inbox.Message) { m.IdempotencyKey = "\xff" }), "is not UTF-8"},
		{"ZeroID", with(func(m *inbox.Message) { m.ID = 0 }), "Message.ID must be positive, got 0"},
		{"NegativeID", with(func(m *inbox.Message) { m.ID = -4 }), "Message.ID must be positive, got -4"},
		{"LongNaturalKey", with(func(m *inbox.Message) { m.Key = strings.Repeat("k", 1025) }), "Message.Key is 1025 bytes long, over the limit of 1024"},
		{"NULNaturalKey", with(func(m *inbox.Message) { m.Key = "a\x00b" }), "Message.Key"},
	} {
		_, err := ib.Receive(ctx, tc.m, b.apply)
		require.ErrorContains(t, err, tc.want, tc.name)
		require.True(t, relay.IsPermanent(err), tc.name)
	}
	_, err := ib.Receive(ctx, msg("order-1", 1), nil)
	require.ErrorContains(t, err, "apply is nil")
	require.Equal(t, 0, b.count(t, "inbox"))

	// Without the stale-drop the natural key is not stored: any key will do.
	got, err := keep.Receive(ctx, with(func(m *inbox.Message) { m.Key = strings.Repeat("k", 5000) }), b.apply)
	require.NoError(t, err)
	require.Equal(t, inbox.Applied, got)
}

// TestReceiveDatabaseAway: with the database unreachable, or the caller gone,
// the message is not received, with an error worth retrying that says what
// failed.
func TestReceiveDatabaseAway(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close()) // nothing listens there now
	away := pgserver.Pool(t, "postgres://postgres@"+addr+"/postgres?sslmode=disable&connect_timeout=5", "", 2)
	ib, err := inbox.New(away, inbox.Config{})
	require.NoError(t, err)
	_, err = ib.Receive(context.Background(), msg("order-1", 1), func(context.Context, pgx.Tx, inbox.Message) error {
		t.Error("apply ran without a database")
		return nil
	})
	require.ErrorContains(t, err, "inbox: message public.outbox/1: acquire a connection: ")
	require.ErrorContains(t, err, "connection refused")
	require.False(t, relay.IsPermanent(err))

	b := setup(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = b.inbox(t).Receive(ctx, msg("order-1", 1), b.apply)
	require.ErrorIs(t, err, context.Canceled)
	require.False(t, relay.IsPermanent(err))
	require.Equal(t, 0, b.count(t, "inbox"))
}

// TestApplyTx: the transaction apply gets takes savepoints and large objects
// as pgx's does, refuses to be committed or rolled back by apply, and a
// failed statement that apply ignores still fails the message.
func TestApplyTx(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ib := b.inbox(t)
	ctx := context.Background()

	got, err := ib.Receive(ctx, msg("order-1", 1), func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		require.ErrorContains(t, tx.Commit(ctx), "inbox: the inbox commits or rolls back the transaction, not apply")
		require.ErrorContains(t, tx.Rollback(ctx), "inbox: the inbox commits or rolls back the transaction, not apply")
		// A savepoint rolled back takes its writes with it.
		err := pgx.BeginFunc(ctx, tx, func(nested pgx.Tx) error {
			_, err := nested.Exec(ctx, "INSERT INTO "+b.effects+" VALUES ('rolled back', '', 0, '')")
			require.NoError(t, err)
			return errors.New("undo the savepoint")
		})
		require.EqualError(t, err, "undo the savepoint")
		lo := tx.LargeObjects()
		oid, err := lo.Create(ctx, 0)
		require.NoError(t, err)
		require.NoError(t, lo.Unlink(ctx, oid))
		require.Same(t, tx.Conn(), tx.Conn())
		return b.apply(ctx, tx, m)
	})
	require.NoError(t, err)
	require.Equal(t, inbox.Applied, got)
	require.Equal(t, 1, b.count(t, "fx"), "the message's effect, not the savepoint's")

	_, err = ib.Receive(ctx, msg("order-1", 2), func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		_, _ = tx.Exec(ctx, "SELECT 1/0") // an error apply ignores
		return nil
	})
	require.ErrorIs(t, err, pgx.ErrTxCommitRollback)
	require.False(t, relay.IsPermanent(err))
	require.Equal(t, 1, b.count(t, "inbox"), "message 2 is not recorded")
}

// TestNew: New refuses a bad Config, naming the field.
func TestNew(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, err := inbox.New(nil, inbox.Config{})
	require.ErrorContains(t, err, "inbox: New: pool is nil")
	for _, tc := range []struct {
		cfg  inbox.Config
		want string
	}{
		{inbox.Config{Table: "a.b.c"}, `inbox: Config.Table: table "a.b.c": want name or schema.name`},
		{inbox.Config{Table: "inbox; DROP TABLE x"}, `inbox: Config.Table: table "inbox; DROP TABLE x": "inbox; DROP TABLE x" is not an identifier`},
		{inbox.Config{Table: "public."}, `"" is not an identifier`},
		{inbox.Config{MaxBody: -1}, "inbox: Config.MaxBody must not be negative (0 means 1048576), got -1"},
	} {
		_, err := inbox.New(b.pool, tc.cfg)
		require.ErrorContains(t, err, tc.want)
	}
}

// TestOutcomeString names each outcome as the Handler's header does.
func TestOutcomeString(t *testing.T) {
	t.Parallel()
	require.Equal(t, "applied", inbox.Applied.String())
	require.Equal(t, "duplicate", inbox.Duplicate.String())
	require.Equal(t, "stale", inbox.Stale.String())
	require.Equal(t, "Outcome(0)", inbox.Outcome(0).String())
}

// TestReceiveRoundTrips: the inbox costs its receiver no round trip: a new
// message takes one for BEGIN and the claim, apply's own, and one for the
// commit, as a transaction of apply alone would (BEGIN, apply, COMMIT).
func TestReceiveRoundTrips(t *testing.T) {
	t.Parallel()
	b := setup(t)
	proxy, url, err := pgserver.ProxyURL(pgserver.Shared().URL)
	require.NoError(t, err)
	t.Cleanup(func() { _ = proxy.Close() })
	pool := pgserver.Pool(t, url, pgserver.Name(t), 1)
	ctx := context.Background()
	for _, keepStale := range []bool{false, true} {
		ib, err := inbox.New(pool, inbox.Config{Table: b.table, KeepStale: keepStale})
		require.NoError(t, err)
		for id := int64(1); id <= 3; id++ { // the first prepares the statements
			m := msg("order-1", id)
			if keepStale {
				m.IdempotencyKey = "keep/" + m.IdempotencyKey
			}
			before := proxy.RoundTrips()
			got, err := ib.Receive(ctx, m, b.apply)
			require.NoError(t, err)
			require.Equal(t, inbox.Applied, got)
			if id > 1 {
				require.Equal(t, int64(3), proxy.RoundTrips()-before, "round trips of message %d, KeepStale %v", id, keepStale)
			}
		}
	}
}
