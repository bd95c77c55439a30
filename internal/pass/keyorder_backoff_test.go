package pass_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/xadm/relay"
	"github.com/xadm/relay/internal/testkit/harness"
)

// TestKeyOrderBackoffEndsMidPass: a key's failed message A waits out its
// backoff, and the key's later messages B and C with it. A draining pass
// goes on past them, batch after batch of other keys, and A's backoff ends
// meanwhile. A message E of the key written then must not overtake A, B and
// C, which this pass left behind: the key's messages arrive in id order.
func TestKeyOrderBackoffEndsMidPass(t *testing.T) {
	t.Parallel()
	b := harness.Setup(t)
	ctx := context.Background()
	const backoff = 3 * time.Second // well past the start of the first pass, on a busy machine too
	a := b.Insert(t, "order", "k")[0]
	var (
		mu      sync.Mutex
		order   []int64 // key k's messages, as sent
		failed  bool
		sending = make(chan struct{})
		release = make(chan struct{})
	)
	send := func(ctx context.Context, m relay.Message) error {
		mu.Lock()
		first := m.ID == a && !failed
		failed = failed || first
		if m.Key == "k" && !first {
			order = append(order, m.ID)
		}
		mu.Unlock()
		switch {
		case first:
			return errors.New("the receiver is away")
		case m.Key == "other-1":
			close(sending)
			<-release
		}
		return nil
	}
	cfg := b.Config
	cfg.RetryBackoff = backoff
	cfg.Concurrency = 1
	cfg.BatchSize = 1 // each batch full: the pass drains past it at once
	r := b.NewRelay(t, cfg, relay.SenderFunc("order", send))

	_, err := r.Run(ctx) // A fails
	require.NoError(t, err)
	later := b.Insert(t, "order", "k", "k", "other-1", "other-2", "other-3")[:2]

	require.NoError(t, r.Start(ctx))
	defer func() { require.NoError(t, r.Stop(context.Background())) }()
	select {
	case <-sending: // the pass went past A, B and C
	case <-time.After(harness.WaitTimeout):
		t.Fatal("other-1 was never sent")
	}
	waitBackoffOver(t, b, a, backoff)
	e := b.Insert(t, "order", "k")[0]
	close(release)

	want := []int64{a, later[0], later[1], e}
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(order) >= len(want)
	}, harness.WaitTimeout, 10*time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, want, order, "key k's messages, in the order they were sent")
}

// waitBackoffOver waits until, on the database's clock, the backoff of the
// failed row id is over.
func waitBackoffOver(t *testing.T, b *harness.Bundle, id int64, backoff time.Duration) {
	t.Helper()
	require.Eventually(t, func() bool {
		var over bool
		err := b.Pool.QueryRow(context.Background(), "SELECT updated_at + $2 * interval '1 microsecond' < now() FROM "+
			pgx.Identifier{b.Table}.Sanitize()+" WHERE id = $1", id, backoff.Microseconds()).Scan(&over)
		return err == nil && over
	}, harness.WaitTimeout, 10*time.Millisecond)
}
