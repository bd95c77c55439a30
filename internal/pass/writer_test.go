package pass

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

// holdCounter is a strategy that counts the connections it is asked to hold.
type holdCounter struct {
	memOutcomes
	holds int
}

func (h *holdCounter) hold(context.Context, *heldConn) error { h.holds++; return nil }

// TestNewWriterAfterAFailureHoldsNothing: a worker that starts after another
// worker's outcome could not be recorded (a read-only cutover) gets no writer,
// and holds no connection for it: a connection taken then was never given
// back, and the pool's Close waited for it for ever (internal/tests/faultstest's
// TestReadOnlyCutover).
func TestNewWriterAfterAFailureHoldsNothing(t *testing.T) {
	r := memRelay(t, 2, 10, nil)
	rc := &recorder{r: r, ctx: context.Background(), res: &Result{}, pipeline: outcomePipeline}
	h := &holdCounter{memOutcomes: memOutcomes{rc: rc}}
	rc.outcomeStrategy = h
	failed := errors.New("cannot execute UPDATE in a read-only transaction")
	rc.keep(failed) // another worker's outcome could not be written
	w, err := rc.newWriter(context.Background())
	require.ErrorIs(t, err, failed)
	require.Nil(t, w)
	require.Zero(t, h.holds, "the writer that was not started holds no connection")
}
