package inbox_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/xadm/relay"
	"github.com/xadm/relay/inbox"
	"github.com/xadm/relay/internal/testkit/pgserver"
)

// A receiving service keeps the latest state of each order, fed by the
// relay's HTTPSender. Its apply only writes the state: the inbox applies each
// message once and a key's messages in id order. Here the messages come in
// the order a failover can produce: 1, 3, a late 2, and 3 again.
func Example() {
	ctx := context.Background()
	pool := connect(ctx) // the receiving service's own database
	defer pool.Close()
	if err := inbox.CreateTable(ctx, pool, inbox.TableDefault); err != nil {
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE orders (id text PRIMARY KEY, state jsonb NOT NULL)`); err != nil {
		log.Fatal(err)
	}
	ib, err := inbox.New(pool, inbox.Config{})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("PUT /orders/{key}", ib.Handler(func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		_, err := tx.Exec(ctx, `INSERT INTO orders (id, state) VALUES ($1, $2)
			ON CONFLICT (id) DO UPDATE SET state = excluded.state`, m.Key, m.Body)
		return err
	}))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	transport := &http.Transport{}
	defer transport.CloseIdleConnections()
	sender, err := relay.NewHTTPSender(relay.HTTPSenderConfig{
		Type:   "order",
		URL:    relay.URLWithKey(srv.URL + "/orders"),
		Client: &http.Client{Transport: printOutcome{transport}},
	})
	if err != nil {
		log.Fatal(err)
	}
	for _, m := range []struct {
		id    int64
		state string
	}{{1, "created"}, {3, "cancelled"}, {2, "updated"}, {3, "cancelled"}} {
		err := sender.Send(ctx, relay.Message{ID: m.id, Type: "order", Key: "order-1", Payload: []byte(`{"state": "` + m.state + `"}`)})
		if err != nil {
			log.Fatal(err)
		}
	}
	var state string
	if err := pool.QueryRow(ctx, `SELECT state->>'state' FROM orders WHERE id = 'order-1'`).Scan(&state); err != nil {
		log.Fatal(err)
	}
	fmt.Println("order-1 is", state)
	// Output:
	// message 1: 204 applied
	// message 3: 204 applied
	// message 2: 204 stale
	// message 3: 204 duplicate
	// order-1 is cancelled
}

// printOutcome prints the inbox's answer to each request.
type printOutcome struct{ http.RoundTripper }

func (p printOutcome) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := p.RoundTripper.RoundTrip(r)
	if err == nil {
		fmt.Printf("message %s: %d %s\n", r.Header.Get("Relay-Message-Id"), resp.StatusCode, resp.Header.Get(inbox.HeaderOutcome))
	}
	return resp, err
}

// connect stands for the service's own pool: a pool on the test server whose
// search_path is a fresh, empty schema, so that the example starts as a new
// service would, with the default table names.
func connect(ctx context.Context) *pgxpool.Pool {
	const schema = "inbox_examples"
	admin, err := pgx.Connect(ctx, pgserver.Shared().URL)
	if err != nil {
		log.Fatal(err)
	}
	defer admin.Close(ctx)
	if _, err := admin.Exec(ctx, "DROP SCHEMA IF EXISTS "+schema+" CASCADE; CREATE SCHEMA "+schema); err != nil {
		log.Fatal(err)
	}
	pc, err := pgxpool.ParseConfig(pgserver.Shared().URL)
	if err != nil {
		log.Fatal(err)
	}
	pc.ConnConfig.RuntimeParams["search_path"] = schema
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		log.Fatal(err)
	}
	return pool
}
