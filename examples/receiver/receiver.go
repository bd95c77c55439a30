package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/xadm/relay"
	"github.com/xadm/relay/inbox"
)

// stateTable is the receiver's own table: the latest state of each (type,
// key) and the message it came from. The inbox applies a key's messages in
// id order, so apply overwrites without comparing ids.
const stateTable = `CREATE TABLE IF NOT EXISTS relay_receiver_state (
    type       text        NOT NULL,
    key        text        NOT NULL,
    state      jsonb       NOT NULL,
    message_id bigint      NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (type, key)
)`

const applyState = `INSERT INTO relay_receiver_state (type, key, state, message_id) VALUES ($1, $2, $3, $4)
ON CONFLICT (type, key) DO UPDATE
SET state = excluded.state, message_id = excluded.message_id, applied_at = now()`

// receiver applies the messages of PUT /relay/{type}/{key} through its inbox.
type receiver struct {
	inbox *inbox.Inbox
	out   io.Writer
	mu    sync.Mutex // one line at a time on out
}

// newReceiver creates the receiver's tables, if they are missing, and its inbox.
func newReceiver(ctx context.Context, pool *pgxpool.Pool, logger *slog.Logger, out io.Writer) (*receiver, error) {
	if err := inbox.CreateTable(ctx, pool, inbox.TableDefault); err != nil {
		return nil, err
	}
	if _, err := pool.Exec(ctx, stateTable); err != nil {
		return nil, fmt.Errorf("create relay_receiver_state: %w", err)
	}
	ib, err := inbox.New(pool, inbox.Config{Logger: logger})
	if err != nil {
		return nil, err
	}
	return &receiver{inbox: ib, out: out}, nil
}

// routes mounts the inbox's handler where examples/service sends.
func (rc *receiver) routes() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("PUT /relay/{type}/{key}", rc.printed(rc.inbox.Handler(apply)))
	return mux
}

// apply makes the message its key's state. It runs in the inbox's
// transaction: the state and the message's record commit together.
func apply(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
	if !json.Valid(m.Body) {
		return relay.Permanent(errors.New("the body is not a JSON document"))
	}
	_, err := tx.Exec(ctx, applyState, m.Type, m.Key, m.Body, m.ID)
	return err
}

// printed prints one line per request: what came, and what was answered.
func (rc *receiver) printed(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw := &statusWriter{ResponseWriter: w, status: http.StatusOK}
		next.ServeHTTP(sw, r)
		outcome := w.Header().Get(inbox.HeaderOutcome)
		if outcome == "" {
			outcome = http.StatusText(sw.status)
		}
		rc.mu.Lock()
		defer rc.mu.Unlock()
		fmt.Fprintf(rc.out, "%s %s  %s  attempt %s  -> %d %s\n", r.Method, r.URL.EscapedPath(),
			r.Header.Get("Idempotency-Key"), r.Header.Get("Relay-Attempt"), sw.status, outcome)
	})
}

// statusWriter remembers the status written through it.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(status int) {
	w.status = status
	w.ResponseWriter.WriteHeader(status)
}
