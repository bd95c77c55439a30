package benchkit

import (
	"context"
	"errors"
	"flag"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/xadm/relay"
)

func TestMedianAndQuantile(t *testing.T) {
	t.Parallel()
	require.Zero(t, Median(nil))
	require.Equal(t, 2.0, Median([]float64{3, 1, 2}))
	require.Equal(t, 2.5, Median([]float64{4, 1, 3, 2}))
	ds := []time.Duration{5, 1, 4, 2, 3, 6, 7, 8, 9, 10}
	require.Equal(t, time.Duration(6), Quantile(ds, 0.5))
	require.Equal(t, time.Duration(10), Quantile(ds, 0.9))
	require.Equal(t, time.Duration(10), Quantile(ds, 1))
	require.Equal(t, time.Duration(5), ds[0], "the input is left as it was")
	require.Zero(t, Quantile([]time.Duration(nil), 0.5))
}

func TestTracerCounts(t *testing.T) {
	t.Parallel()
	var seen []string
	batches := 0
	tr := &Tracer{OnQuery: func(d pgx.TraceQueryStartData) { seen = append(seen, d.SQL) }, OnBatch: func() { batches++ }}
	var _ pgx.QueryTracer = tr
	var _ pgx.BatchTracer = tr
	var _ pgx.PrepareTracer = tr
	ctx := context.Background()
	tr.TraceQueryStart(ctx, nil, pgx.TraceQueryStartData{SQL: "SELECT 1"})
	tr.TraceBatchStart(ctx, nil, pgx.TraceBatchStartData{})
	tr.TracePrepareStart(ctx, nil, pgx.TracePrepareStartData{})
	require.Equal(t, int64(2), tr.Statements(), "a query and a batch; a prepare is not a statement")
	require.Equal(t, int64(1), tr.Prepares.Load())
	require.Equal(t, []string{"SELECT 1"}, seen)
	require.Equal(t, 1, batches)
}

func TestDrainObserver(t *testing.T) {
	t.Parallel()
	o := NewDrainObserver(2)
	o.MessageDone(relay.MessageReport{Outcome: relay.OutcomeError})
	o.MessageDone(relay.MessageReport{Outcome: relay.OutcomeSent})
	select {
	case <-o.Done():
		t.Fatal("done after one of two")
	default:
	}
	require.True(t, o.Last().IsZero())
	o.MessageDone(relay.MessageReport{Outcome: relay.OutcomeSent})
	<-o.Done()
	require.False(t, o.Last().IsZero())
	require.Equal(t, int64(1), o.Failed.Load())
	o.PassDone(relay.PassReport{Err: errors.New("boom")})
	require.EqualError(t, o.Err(), "boom")
}

type batchSender struct{ relay.Sender }

func (batchSender) SendBatch(_ context.Context, ms []relay.Message) []error {
	return make([]error, len(ms))
}

func TestCountedAndPerMessage(t *testing.T) {
	t.Parallel()
	var c Calls
	s := Counted(batchSender{Noop("t")}, &c)
	ctx := context.Background()
	ms := make([]relay.Message, 5)
	rate, err := SenderAlone(ctx, s, ms, 2, true)
	require.NoError(t, err)
	require.Positive(t, rate)
	require.Equal(t, "Send 0, SendBatch 3 (2 msgs each)", c.String())
	_, err = SenderAlone(ctx, s, ms, 2, false)
	require.NoError(t, err)
	require.Equal(t, int64(5), c.Sends.Load())
	_, isBatch := PerMessage(s).(relay.BatchSender)
	require.False(t, isBatch, "PerMessage hides SendBatch")
	c.Reset()
	require.Equal(t, "Send 0", c.String())
}

func TestDrainFlags(t *testing.T) {
	t.Parallel()
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	f := RegisterDrainFlags(fs, 100, 10, 3)
	require.NoError(t, fs.Parse([]string{"-rows", "50"}))
	require.Equal(t, 50, *f.Rows)
	require.NoError(t, f.Check())
	require.NoError(t, fs.Parse([]string{"-batch", "0"}))
	require.EqualError(t, f.Check(), "-batch must be at least 1, got 0")
}
