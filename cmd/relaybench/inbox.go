package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/xadm/relay/inbox"
	"github.com/xadm/relay/internal/tools/benchkit"
)

// The inbox scenario (issue 35): the requests per second of one receiver, on
// this machine's loopback, with and without the inbox in front of its apply,
// which is one INSERT into a table of its own. 8 HTTP clients send PUTs as the
// relay's HTTPSender does (its headers, a small JSON body, a new message each,
// 500 natural keys), over kept-alive connections. The receiver without the
// inbox reads Relay-Message-Id and the body and runs apply in a transaction
// (Begin, the INSERT, Commit); with it, inbox.Handler runs apply, with the
// stale-drop (the default) and without it (KeepStale). All share one pool of
// 8 connections. Every round runs each receiver once, for -inbox-slice, in an
// order rotated from round to round, so that each round compares them under
// the same load; the table shows the medians of -inbox-rounds rounds.

var (
	inboxSlice  = flag.Duration("inbox-slice", 250*time.Millisecond, "how long each receiver runs in each round of the inbox scenario")
	inboxRounds = flag.Int("inbox-rounds", 40, "rounds of the inbox scenario")
)

const (
	// inboxClients is how many clients send at once.
	inboxClients = 8
	// inboxKeys is how many natural keys the messages spread over.
	inboxKeys = 500
)

func runInbox(ctx context.Context, url string, admin *pgxpool.Pool) error {
	const table, effects = "relaybench_inbox", "relaybench_inbox_effects"
	for _, ddl := range []string{
		"DROP TABLE IF EXISTS " + table + ", " + table + "_keys, " + effects,
		"CREATE TABLE " + effects + " (message_key text NOT NULL, message_id bigint NOT NULL, body jsonb NOT NULL)",
	} {
		if _, err := admin.Exec(ctx, ddl); err != nil {
			return err
		}
	}
	if err := inbox.CreateTable(ctx, admin, table); err != nil {
		return err
	}
	pool, err := benchkit.Pool(ctx, url, "relaybench", inboxClients)
	if err != nil {
		return err
	}
	defer pool.Close()

	insert := "INSERT INTO " + effects + " (message_key, message_id, body) VALUES ($1, $2, $3)"
	apply := func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		_, err := tx.Exec(ctx, insert, m.Key, m.ID, m.Body)
		return err
	}
	staleDrop, err := inbox.New(pool, inbox.Config{Table: table})
	if err != nil {
		return err
	}
	keepStale, err := inbox.New(pool, inbox.Config{Table: table, KeepStale: true})
	if err != nil {
		return err
	}
	receivers := []struct {
		name    string
		handler http.Handler
	}{
		{"without the inbox (Begin, INSERT, Commit)", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			id, err := inbox.ParseMessageID(r.Header.Get("Relay-Message-Id"))
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, inbox.MaxBodyDefault))
			if err != nil {
				http.Error(w, err.Error(), http.StatusRequestEntityTooLarge)
				return
			}
			m := inbox.Message{ID: id, Key: r.Header.Get("Relay-Message-Key"), Body: body}
			if err := pgx.BeginFunc(r.Context(), pool, func(tx pgx.Tx) error { return apply(r.Context(), tx, m) }); err != nil {
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
			w.WriteHeader(http.StatusNoContent)
		})},
		{"with the inbox (inbox.Handler)", staleDrop.Handler(apply)},
		{"with the inbox, KeepStale", keepStale.Handler(apply)},
	}
	urls := make([]string, len(receivers))
	for i, rc := range receivers {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		srv := &http.Server{Handler: rc.handler, ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		defer srv.Close()
		urls[i] = "http://" + ln.Addr().String()
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: inboxClients}}
	defer client.CloseIdleConnections()

	var next atomic.Int64
	rates := make([][]float64, len(receivers))
	ratios := make([][]float64, len(receivers))
	for round := range *inboxRounds {
		got := make([]float64, len(receivers))
		for k := range receivers {
			i := (k + round) % len(receivers)
			rate, err := requestsRate(ctx, client, urls[i], &next)
			if err != nil {
				return fmt.Errorf("%s: %w", receivers[i].name, err)
			}
			got[i] = rate
		}
		for i := range receivers {
			rates[i] = append(rates[i], got[i])
			ratios[i] = append(ratios[i], got[i]/got[0])
		}
	}
	var applied, recorded int64
	if err := admin.QueryRow(ctx, "SELECT (SELECT count(*) FROM "+effects+"), (SELECT count(*) FROM "+table+")").Scan(&applied, &recorded); err != nil {
		return err
	}

	fmt.Printf("\ninbox: requests/s of one receiver whose apply is one INSERT, %d concurrent HTTP clients, %d rounds of %s per receiver (interleaved, order rotated), medians\n",
		inboxClients, *inboxRounds, *inboxSlice)
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "receiver\trequests/s (median)\trange\t× without (median of the rounds' ratios)\t")
	for i, rc := range receivers {
		fmt.Fprintf(w, "%s\t%.0f\t%.0f–%.0f\t%.2f×\t\n", rc.name, benchkit.Median(rates[i]), slices.Min(rates[i]), slices.Max(rates[i]), benchkit.Median(ratios[i]))
	}
	w.Flush()
	verdict := "met"
	if benchkit.Median(ratios[1]) < 0.8 {
		verdict = "NOT met"
	}
	fmt.Printf("target (issue 35): with the inbox ≥ 0.8× without: %s\n", verdict)
	fmt.Printf("%d effects applied, %d messages recorded by the inbox\n", applied, recorded)
	return nil
}

// requestsRate runs inboxClients clients against url for -inbox-slice and
// returns the requests/s answered 204. Each request is a new message.
func requestsRate(ctx context.Context, client *http.Client, url string, next *atomic.Int64) (float64, error) {
	ctx, cancel := context.WithTimeout(ctx, *inboxSlice)
	defer cancel()
	var (
		done     atomic.Int64
		firstErr error
		errOnce  sync.Once
		wg       sync.WaitGroup
	)
	start := time.Now()
	for range inboxClients {
		wg.Go(func() {
			for ctx.Err() == nil {
				err := put(ctx, client, url, next.Add(1))
				switch {
				case err == nil:
					done.Add(1)
				case ctx.Err() == nil:
					errOnce.Do(func() { firstErr = err })
					cancel()
				}
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		return 0, firstErr
	}
	return float64(done.Load()) / time.Since(start).Seconds(), nil
}

// put sends message id as the relay's HTTPSender does.
func put(ctx context.Context, client *http.Client, base string, id int64) error {
	key := "order-" + strconv.FormatInt(id%inboxKeys, 10)
	body := fmt.Sprintf(`{"id": %q, "total_cents": %d}`, key, id)
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, base+"/orders/"+key, strings.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", "public.mensagem_m2m/"+strconv.FormatInt(id, 10))
	req.Header.Set("Relay-Message-Key", key)
	req.Header.Set("Relay-Message-Id", strconv.FormatInt(id, 10))
	req.Header.Set("Relay-Message-Type", "order")
	req.Header.Set("Relay-Attempt", "1")
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		return errors.New(resp.Status)
	}
	return nil
}
