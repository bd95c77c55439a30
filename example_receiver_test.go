package relay_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/xadm/relay"
)

// ordersTable is the receiver's own table: the latest state of each order and
// the Relay-Message-Id of the message that state came from.
const ordersTable = `CREATE TABLE IF NOT EXISTS orders (
    id         text   PRIMARY KEY,
    state      jsonb  NOT NULL,
    message_id bigint NOT NULL
)`

// applyOrder stores an order's state unless a message of that order with the
// same or a higher id was applied already: the stale-drop rule in one
// statement, so the state and the id it came from change together or not at all.
const applyOrder = `INSERT INTO orders (id, state, message_id) VALUES ($1, $2, $3)
ON CONFLICT (id) DO UPDATE SET state = excluded.state, message_id = excluded.message_id
WHERE orders.message_id < excluded.message_id`

// ordersReceiver serves PUT /orders/{id}, where relay.URLWithKey sends the
// messages of type "order": each carries the whole state of one order.
type ordersReceiver struct{ db *pgxpool.Pool }

func (o ordersReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id") // the natural key
	msgID, err := strconv.ParseInt(r.Header.Get("Relay-Message-Id"), 10, 64)
	if err != nil {
		// 4xx: the relay marks the row dead at once and an operator looks at it.
		http.Error(w, "missing or malformed Relay-Message-Id", http.StatusBadRequest)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20))
	if err != nil || !json.Valid(body) {
		http.Error(w, "the body must be a JSON document of at most 1 MiB", http.StatusBadRequest)
		return
	}

	err = pgx.BeginFunc(r.Context(), o.db, func(tx pgx.Tx) error {
		tag, err := tx.Exec(r.Context(), applyOrder, id, body, msgID)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return nil // a duplicate or a stale message: nothing to apply
		}
		// Whatever else applying the message does (a history row, a side
		// table) goes here, in the same transaction.
		return nil
	})
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && strings.HasPrefix(pgErr.Code, "22"): // data exception
		http.Error(w, "the body cannot be stored: "+pgErr.Message, http.StatusBadRequest)
		return
	case err != nil:
		// 5xx: the relay retries the message later.
		http.Error(w, "try again later", http.StatusServiceUnavailable)
		return
	}
	// Applied, a duplicate or stale: the receiver has this message or a newer
	// one, so the relay may record it as delivered.
	w.WriteHeader(http.StatusNoContent)
}

// A receiver that stores each key's state keeps, with it, the Relay-Message-Id
// it came from, and ignores a message whose Relay-Message-Id is lower than the
// last one applied for its key (equal: a duplicate). It answers 2xx to both, so
// that a failover's late, older message neither overwrites a newer state nor
// fails. Here the messages come straight from an HTTPSender, in the order a
// failover can produce; docs/receivers.md explains each answer.
func Example_receiver() {
	ctx := context.Background()
	db := connect(ctx) // the receiving service's own database
	defer db.Close()
	if _, err := db.Exec(ctx, ordersTable); err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("PUT /orders/{id}", ordersReceiver{db})
	srv := httptest.NewServer(mux)
	defer srv.Close()

	sender, err := relay.NewHTTPSender(relay.HTTPSenderConfig{
		Type: "order",
		URL:  relay.URLWithKey(srv.URL + "/orders"),
	})
	if err != nil {
		log.Fatal(err)
	}
	send := func(id int64, state string) {
		err := sender.Send(ctx, relay.Message{ID: id, Type: "order", Key: "order-1", Payload: []byte(`{"state": "` + state + `"}`)})
		var stored string
		var applied int64
		if err := db.QueryRow(ctx, "SELECT state->>'state', message_id FROM orders WHERE id = 'order-1'").Scan(&stored, &applied); err != nil {
			log.Fatal(err)
		}
		fmt.Printf("message %d (%s): %v; order-1 is %s, from message %d\n", id, state, err, stored, applied)
	}
	send(1, "created")
	send(3, "cancelled") // message 2 is late: the old leader sent it just before a failover
	send(2, "updated")   // stale: ignored
	send(3, "cancelled") // a duplicate: ignored
	// Output:
	// message 1 (created): <nil>; order-1 is created, from message 1
	// message 3 (cancelled): <nil>; order-1 is cancelled, from message 3
	// message 2 (updated): <nil>; order-1 is cancelled, from message 3
	// message 3 (cancelled): <nil>; order-1 is cancelled, from message 3
}
