package harness

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/xadm/relay"
)

// StartRelay starts r and stops it at the test's end; an error of Start fails
// the test.
func StartRelay(t *testing.T, r *relay.Relay) {
	t.Helper()
	require.NoError(t, r.Start(context.Background()))
	t.Cleanup(func() { _ = r.Stop(context.Background()) })
}

// Replicas reads the live replicas of admin's app (Admin.Replicas); an error
// fails the test.
func Replicas(t *testing.T, a *relay.Admin) []relay.Replica {
	t.Helper()
	reps, err := a.Replicas(context.Background())
	require.NoError(t, err)
	return reps
}

// PassCounter is an Observer that counts passes: N is how many have ended.
type PassCounter struct{ N atomic.Int64 }

// PassDone counts the pass.
func (c *PassCounter) PassDone(relay.PassReport) { c.N.Add(1) }

// MessageDone does nothing.
func (c *PassCounter) MessageDone(relay.MessageReport) {}

// Trickle writes n messages of type "t" (keys k<from> and up) one at a time
// through Enqueue (which notifies), each once rec has sent the one before,
// and returns their ids.
func (b *Bundle) Trickle(t *testing.T, rec *Recorder, from, n int) []int64 {
	t.Helper()
	var ids []int64
	for i := from; i < from+n; i++ {
		id, err := relay.Enqueue(context.Background(), b.Pool, b.Table, relay.Outgoing{Type: "t", Key: fmt.Sprint("k", i), Payload: []byte(`{}`)})
		require.NoError(t, err)
		ids = append(ids, id)
		require.Eventually(t, func() bool { return rec.Count() >= i+1 }, 30*time.Second, time.Millisecond, "message %d", i)
	}
	return ids
}
