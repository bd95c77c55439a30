package relay_test

// The receiver contract of docs/receivers.md, end to end: the relay on the
// package's PostgreSQL, its HTTPSender, and receivers of the three common
// conventions, fed one order's messages with the re-deliveries that faults
// cause: the same message twice (an answer lost), and an older message after a
// newer one (a request sent by a replica that then lost its election).

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/xadm/relay"
	"github.com/xadm/relay/internal/testkit/harness"
	"github.com/xadm/relay/internal/testkit/pgserver"
)

// waitTimeout bounds every wait of these tests (harness.WaitTimeout).
const waitTimeout = harness.WaitTimeout

// insertOrder writes one message of type "order" for key per state, in order,
// with payload {"state": <state>}, and returns their ids.
func insertOrder(t *testing.T, b *bundle, key string, states ...string) []int64 {
	t.Helper()
	ids := make([]int64, 0, len(states))
	for _, s := range states {
		id, err := relay.Enqueue(context.Background(), b.pool, b.table, relay.Outgoing{
			Type: "order", Key: key, Payload: fmt.Appendf(nil, `{"state": %q}`, s),
		})
		require.NoError(t, err)
		ids = append(ids, id)
	}
	return ids
}

// stateOf returns the "state" field of a payload.
func stateOf(t *testing.T, payload []byte) string {
	t.Helper()
	var p struct{ State string }
	require.NoError(t, json.Unmarshal(payload, &p), "payload %q", payload)
	return p.State
}

// replicaSender is replica's HTTPSender of type "order" to base/orders/<key>;
// its requests carry a Test-Replica header naming it.
func replicaSender(t *testing.T, base, replica string, outcomes map[int]relay.HTTPOutcome) *relay.HTTPSender {
	t.Helper()
	return newHTTPSender(t, base, relay.HTTPSenderConfig{
		Header:         http.Header{"Test-Replica": {replica}},
		StatusOutcomes: outcomes,
	})
}

func fromReplica(replica string) func(*http.Request) bool {
	return func(r *http.Request) bool { return r.Header.Get("Test-Replica") == replica }
}

func isMessage(replica string, id int64) func(*http.Request) bool {
	return func(r *http.Request) bool {
		return r.Header.Get("Test-Replica") == replica && r.Header.Get("Relay-Message-Id") == strconv.FormatInt(id, 10)
	}
}

// runUntilDone runs r's direct passes until one finds nothing to send.
func runUntilDone(t *testing.T, r *relay.Relay) {
	t.Helper()
	for range 20 {
		n, err := r.Run(context.Background())
		require.NoError(t, err)
		if n == 0 {
			return
		}
	}
	t.Fatal("the relay still had rows to send after 20 passes")
}

func waitClosed(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(waitTimeout):
		t.Fatalf("timed out waiting for %s", what)
	}
}

// hold holds the first request that match picks, as a network or a frozen
// replica can hold a request already sent: arrived is closed once it is held,
// and it goes on after let.
type hold struct {
	match   func(*http.Request) bool
	picked  atomic.Bool
	arrived chan struct{}
	release chan struct{}
	letOnce sync.Once
	done    chan struct{} // closed once the receiver has answered it (front only)
}

func newHold(match func(*http.Request) bool) *hold {
	return &hold{match: match, arrived: make(chan struct{}), release: make(chan struct{}), done: make(chan struct{})}
}

// let lets the held request go on; also a cleanup, so that a failed test does
// not leave a server waiting for its handler.
func (h *hold) let() { h.letOnce.Do(func() { close(h.release) }) }

// block blocks r until let when r is the first request match picks, and
// reports whether it was.
func (h *hold) block(r *http.Request) bool {
	if !h.match(r) || !h.picked.CompareAndSwap(false, true) {
		return false
	}
	close(h.arrived)
	<-h.release
	return true
}

// front holds the picked request before next sees it. The request was whole
// on the wire and its sender never hung up, as a frozen replica does not: the
// body is read first and the client's going away does not cancel it.
func (h *hold) front(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !h.match(r) || h.picked.Load() {
			next.ServeHTTP(w, r)
			return
		}
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r = r.WithContext(context.WithoutCancel(r.Context()))
		r.Body = io.NopCloser(bytes.NewReader(body))
		if h.block(r) {
			defer close(h.done)
		}
		next.ServeHTTP(w, r)
	})
}

// loseAnswer lets next handle the first request that match picks and then
// drops the connection instead of answering: the receiver applied the message
// and the relay does not know it.
func loseAnswer(match func(*http.Request) bool, next http.Handler) http.Handler {
	var picked atomic.Bool
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !match(r) || !picked.CompareAndSwap(false, true) {
			next.ServeHTTP(w, r)
			return
		}
		next.ServeHTTP(httptest.NewRecorder(), r)
		panic(http.ErrAbortHandler)
	})
}

// answer is one request a receiver answered; status 0 is an answer lost.
type answer struct {
	replica string
	id      int64
	status  int
}

// answerLog records what a receiver answered to each request.
type answerLog struct {
	mu   sync.Mutex
	list []answer
}

func (l *answerLog) record(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, _ := strconv.ParseInt(r.Header.Get("Relay-Message-Id"), 10, 64)
		sw := &statusWriter{ResponseWriter: w}
		defer func() { // also when the handler aborts: status 0
			l.mu.Lock()
			l.list = append(l.list, answer{replica: r.Header.Get("Test-Replica"), id: id, status: sw.status})
			l.mu.Unlock()
		}()
		next.ServeHTTP(sw, r)
	})
}

func (l *answerLog) all() []answer {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.list)
}

// to returns the answers to message id.
func (l *answerLog) to(id int64) []answer {
	var out []answer
	for _, a := range l.all() {
		if a.id == id {
			out = append(out, a)
		}
	}
	return out
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(p)
}

// serveOrders serves handler at PUT /orders/{id} until t ends.
func serveOrders(t *testing.T, handler http.Handler) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	mux.Handle("PUT /orders/{id}", handler)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

// conventionReceiver is a receiver of one of the common conventions.
type conventionReceiver interface {
	http.Handler
	// current returns key's state as the receiver stores it, and the id of
	// the message it came from.
	current(t *testing.T, key string) (state string, fromID int64)
}

// appliedLog is what an in-memory receiver applied: the latest payload of
// each key, and the ids of the messages it applied, in order.
type appliedLog struct {
	mu      sync.Mutex
	payload map[string][]byte
	ids     map[string][]int64
}

func (l *appliedLog) apply(key string, id int64, payload []byte) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.payload == nil {
		l.payload, l.ids = map[string][]byte{}, map[string][]int64{}
	}
	l.payload[key] = payload
	l.ids[key] = append(l.ids[key], id)
}

func (l *appliedLog) applied(key string) []int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.ids[key])
}

func (l *appliedLog) current(t *testing.T, key string) (string, int64) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	ids := l.ids[key]
	require.NotEmpty(t, ids, "nothing applied for %s", key)
	return stateOf(t, l.payload[key]), ids[len(ids)-1]
}

// messageOf reads what every in-memory receiver needs of a request.
func messageOf(w http.ResponseWriter, r *http.Request) (idemKey string, id int64, body []byte, ok bool) {
	idemKey = r.Header.Get("Idempotency-Key")
	id, err := strconv.ParseInt(r.Header.Get("Relay-Message-Id"), 10, 64)
	if idemKey == "" || err != nil {
		http.Error(w, "missing Idempotency-Key or Relay-Message-Id", http.StatusBadRequest)
		return "", 0, nil, false
	}
	if body, err = io.ReadAll(r.Body); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return "", 0, nil, false
	}
	return idemKey, id, body, true
}

// replayingReceiver stores its answer under the Idempotency-Key and replays it
// for a repeated key without applying the request again, as Stripe does. It
// applies what it does not replay, in arrival order.
type replayingReceiver struct {
	appliedLog
	mu      sync.Mutex
	answers map[string]int
}

func newReplayingReceiver() *replayingReceiver {
	return &replayingReceiver{answers: map[string]int{}}
}

func (rc *replayingReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	idemKey, id, body, ok := messageOf(w, r)
	if !ok {
		return
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if status, seen := rc.answers[idemKey]; seen {
		w.WriteHeader(status) // the stored answer, nothing applied
		return
	}
	rc.apply(r.PathValue("id"), id, body)
	rc.answers[idemKey] = http.StatusNoContent
	w.WriteHeader(http.StatusNoContent)
}

// draftReceiver follows the IETF Idempotency-Key draft strictly: 400 without
// the header, 422 for a repeated key with a different body, 409 while a
// request with the key is in progress, the stored answer for a repeat of a
// finished one. inProgress, when set, is called while a request is in
// progress, before it is applied.
type draftReceiver struct {
	appliedLog
	inProgress func(*http.Request) bool

	mu   sync.Mutex
	seen map[string]*draftEntry
}

type draftEntry struct {
	body   []byte
	status int // 0 while in progress
}

func newDraftReceiver(inProgress func(*http.Request) bool) *draftReceiver {
	return &draftReceiver{inProgress: inProgress, seen: map[string]*draftEntry{}}
}

func (rc *draftReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	idemKey, id, body, ok := messageOf(w, r)
	if !ok {
		return
	}
	rc.mu.Lock()
	if e, seen := rc.seen[idemKey]; seen {
		rc.mu.Unlock()
		switch {
		case !bytes.Equal(e.body, body):
			http.Error(w, "Idempotency-Key reused with a different body", http.StatusUnprocessableEntity)
		case e.status == 0:
			http.Error(w, "a request with this Idempotency-Key is in progress", http.StatusConflict)
		default:
			w.WriteHeader(e.status)
		}
		return
	}
	e := &draftEntry{body: body}
	rc.seen[idemKey] = e
	rc.mu.Unlock()

	if rc.inProgress != nil {
		rc.inProgress(r)
	}
	rc.mu.Lock()
	rc.apply(r.PathValue("id"), id, body)
	e.status = http.StatusNoContent
	rc.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

// pgOrdersReceiver is the PUT-by-key receiver of Example_receiver on a schema
// of the test's own.
type pgOrdersReceiver struct {
	ordersReceiver
}

func newPgOrdersReceiver(t *testing.T) conventionReceiver {
	t.Helper()
	schema := pgserver.Name(t)
	ctx := context.Background()
	admin := newPool(t, 1)
	_, err := admin.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize())
	require.NoError(t, err)
	t.Cleanup(func() {
		_, _ = admin.Exec(context.Background(), "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE")
	})
	db := pgserver.Pool(t, server().URL, schema, 4, func(c *pgxpool.Config) {
		c.ConnConfig.RuntimeParams["search_path"] = schema
	})
	_, err = db.Exec(ctx, ordersTable)
	require.NoError(t, err)
	return pgOrdersReceiver{ordersReceiver{db: db}}
}

func (rc pgOrdersReceiver) current(t *testing.T, key string) (string, int64) {
	t.Helper()
	var payload []byte
	var id int64
	require.NoError(t, rc.db.QueryRow(context.Background(),
		"SELECT state, message_id FROM orders WHERE id = $1", key).Scan(&payload, &id))
	return stateOf(t, payload), id
}

// TestHTTPSenderReceiverConventions feeds a receiver of each convention one
// order's three messages (created, updated, cancelled) and another order's
// one, through two replicas of the relay. Replica a sends the first message
// and loses its election before the receiver has it: its request is held on
// the way. Replica b then delivers everything, the answer to its first try of
// "updated" lost, so the receiver gets that message twice. Then a's request
// arrives: "created", older than the "cancelled" the receiver holds. Each
// receiver must end on "cancelled", every row SENT, none dead.
func TestHTTPSenderReceiverConventions(t *testing.T) {
	t.Parallel()

	for _, tt := range []struct {
		name     string
		receiver func(t *testing.T) conventionReceiver
	}{
		{"ReplayingByIdempotencyKey", func(*testing.T) conventionReceiver { return newReplayingReceiver() }},
		{"IETFDraft", func(*testing.T) conventionReceiver { return newDraftReceiver(nil) }},
		{"PutByKeyDroppingStale", newPgOrdersReceiver},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			order1 := insertOrder(t, b, "order-1", "created", "updated", "cancelled")
			order2 := insertOrder(t, b, "order-2", "created")

			rc := tt.receiver(t)
			late := newHold(fromReplica("a"))
			var answers answerLog
			// late.front outermost: its done comes after answers recorded the late answer.
			srv := serveOrders(t, late.front(answers.record(loseAnswer(isMessage("b", order1[1]), rc))))
			t.Cleanup(late.let) // before srv.Close, which waits for the held handler

			replicaA := b.newRelay(t, b.cfg, replicaSender(t, srv.URL, "a", nil))
			replicaB := b.newRelay(t, b.cfg, replicaSender(t, srv.URL, "b", nil))

			// Replica a sends "created" and loses its election: its pass is
			// cancelled, the request is already out.
			ctxA, cancelA := context.WithCancel(context.Background())
			doneA := make(chan error, 1)
			go func() {
				_, err := replicaA.Run(ctxA)
				doneA <- err
			}()
			waitClosed(t, late.arrived, "replica a's request")
			cancelA()
			select {
			case err := <-doneA:
				require.ErrorIs(t, err, context.Canceled)
			case <-time.After(waitTimeout):
				t.Fatal("replica a's pass did not end")
			}

			// Replica b delivers everything; its first "updated" is applied, then the answer is lost.
			runUntilDone(t, replicaB)
			state, from := rc.current(t, "order-1")
			require.Equal(t, "cancelled", state)
			require.Equal(t, order1[2], from)

			// Replica a's "created" arrives, after "cancelled".
			late.let()
			waitClosed(t, late.done, "the receiver's answer to replica a's late request")

			state, from = rc.current(t, "order-1")
			require.Equal(t, "cancelled", state, "the late, older message must not overwrite a newer state")
			require.Equal(t, order1[2], from)
			state, from = rc.current(t, "order-2")
			require.Equal(t, "created", state)
			require.Equal(t, order2[0], from)
			if l, ok := rc.(interface{ applied(string) []int64 }); ok {
				require.Equal(t, order1, l.applied("order-1"), "each message applied once, in order")
				require.Equal(t, order2, l.applied("order-2"))
			}

			require.Equal(t, 4, b.countStatus(t, "SENT"), "nothing lost, nothing dead")
			require.Len(t, answers.to(order1[0]), 2, "created: from b, then late from a")
			require.GreaterOrEqual(t, len(answers.to(order1[1])), 2, "updated: its answer lost, then again")
			lost := 0
			for _, a := range answers.all() {
				if a.status == 0 {
					lost++
					continue
				}
				require.True(t, a.status >= 200 && a.status <= 299, "every answer is a 2xx: %+v", a)
			}
			require.Equal(t, 1, lost)
		})
	}
}

// TestHTTPSenderIETFDraftInProgress: replica a's request for "created" is in
// progress at a receiver of the IETF draft when replica b sends the same
// message, which the receiver answers 409. With {409: HTTPRetry} the row is
// retried and delivered once a's request has finished; with the default, 409
// is permanent and the row dies although the receiver applied the message.
func TestHTTPSenderIETFDraftInProgress(t *testing.T) {
	t.Parallel()

	for _, tt := range []struct {
		name     string
		outcomes map[int]relay.HTTPOutcome
		wantDead bool
	}{
		{"ConflictRetried", map[int]relay.HTTPOutcome{http.StatusConflict: relay.HTTPRetry}, false},
		{"ConflictPermanentByDefault", nil, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ids := insertOrder(t, b, "order-1", "created", "updated")

			inProgress := newHold(fromReplica("a"))
			rc := newDraftReceiver(inProgress.block)
			var answers answerLog
			srv := serveOrders(t, answers.record(rc))
			t.Cleanup(inProgress.let)

			replicaA := b.newRelay(t, b.cfg, replicaSender(t, srv.URL, "a", tt.outcomes))
			replicaB := b.newRelay(t, b.cfg, replicaSender(t, srv.URL, "b", tt.outcomes))

			ctxA, cancelA := context.WithCancel(context.Background())
			doneA := make(chan error, 1)
			go func() {
				_, err := replicaA.Run(ctxA)
				doneA <- err
			}()
			waitClosed(t, inProgress.arrived, "replica a's request in progress")
			cancelA()
			select {
			case err := <-doneA:
				require.ErrorIs(t, err, context.Canceled)
			case <-time.After(waitTimeout):
				t.Fatal("replica a's pass did not end")
			}

			n, err := replicaB.Run(context.Background())
			require.NoError(t, err)
			require.Equal(t, 1, n, "created fails; updated waits behind it")
			st := b.state(t, ids[0])
			require.Equal(t, "ERROR", st.Status)
			require.NotNil(t, st.LastError)
			require.Contains(t, *st.LastError, "409 Conflict: a request with this Idempotency-Key is in progress")
			if tt.wantDead {
				require.Equal(t, b.cfg.MaxAttempts, st.Attempts)
			} else {
				require.Equal(t, 1, st.Attempts)
			}

			// a's request finishes: the receiver applies "created".
			inProgress.let()
			require.Eventually(t, func() bool { return len(rc.applied("order-1")) == 1 }, waitTimeout, 5*time.Millisecond)

			runUntilDone(t, replicaB)
			state, from := rc.current(t, "order-1")
			require.Equal(t, "updated", state)
			require.Equal(t, ids[1], from)
			require.Equal(t, ids, rc.applied("order-1"), "each message applied once, in order")
			if tt.wantDead {
				require.Equal(t, "ERROR", b.state(t, ids[0]).Status, "dead, though the receiver has it")
				require.Equal(t, 1, b.countStatus(t, "SENT"))
				return
			}
			require.Equal(t, 2, b.countStatus(t, "SENT"))
			var statuses []int
			for _, a := range answers.to(ids[0]) {
				statuses = append(statuses, a.status)
			}
			require.Contains(t, statuses, http.StatusConflict)
			require.Equal(t, http.StatusNoContent, statuses[len(statuses)-1], "the retry gets the stored answer")
		})
	}
}

// TestHTTPSenderStatusOutcomesWithRelay: the answers that kill a row by
// default, and what StatusOutcomes makes of them.
func TestHTTPSenderStatusOutcomesWithRelay(t *testing.T) {
	t.Parallel()

	// A receiver that answers 409 to a message it has already applied; the
	// answer to its first request is lost, so the relay sends it again.
	conflictOnDuplicate := func(applied *atomic.Int32) http.Handler {
		var mu sync.Mutex
		seen := map[string]bool{}
		return loseAnswer(func(*http.Request) bool { return true }, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			defer mu.Unlock()
			k := r.Header.Get("Idempotency-Key")
			if seen[k] {
				http.Error(w, "already applied", http.StatusConflict)
				return
			}
			seen[k] = true
			applied.Add(1)
			w.WriteHeader(http.StatusNoContent)
		}))
	}
	// A receiver that refuses every request with 401 while its credentials rotate.
	unauthorizedWhileRotating := func(rotating *atomic.Bool, applied *atomic.Int32) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if rotating.Load() {
				http.Error(w, "unknown token", http.StatusUnauthorized)
				return
			}
			applied.Add(1)
			w.WriteHeader(http.StatusNoContent)
		})
	}

	for _, tt := range []struct {
		name     string
		status   int
		outcomes map[int]relay.HTTPOutcome
		wantDead bool
	}{
		{"ConflictForADuplicateAsSuccess", http.StatusConflict, map[int]relay.HTTPOutcome{http.StatusConflict: relay.HTTPSuccess}, false},
		{"ConflictForADuplicateByDefault", http.StatusConflict, nil, true},
		{"UnauthorizedRetried", http.StatusUnauthorized, map[int]relay.HTTPOutcome{http.StatusUnauthorized: relay.HTTPRetry}, false},
		{"UnauthorizedByDefault", http.StatusUnauthorized, nil, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ids := insertOrder(t, b, "order-1", "created")

			var applied atomic.Int32
			var rotating atomic.Bool
			var answers answerLog
			var handler http.Handler
			if tt.status == http.StatusConflict {
				handler = conflictOnDuplicate(&applied)
			} else {
				rotating.Store(true)
				handler = unauthorizedWhileRotating(&rotating, &applied)
			}
			srv := serveOrders(t, answers.record(handler))
			r := b.newRelay(t, b.cfg, replicaSender(t, srv.URL, "b", tt.outcomes))

			if tt.status == http.StatusUnauthorized {
				n, err := r.Run(context.Background())
				require.NoError(t, err)
				require.Equal(t, 1, n)
				st := b.state(t, ids[0])
				require.Equal(t, "ERROR", st.Status)
				require.Contains(t, *st.LastError, "401 Unauthorized")
				if !tt.wantDead {
					require.Equal(t, 1, st.Attempts, "retried, not dead")
				}
				rotating.Store(false) // the new credentials are live
			}
			runUntilDone(t, r)

			var statuses []int
			for _, a := range answers.to(ids[0]) {
				statuses = append(statuses, a.status)
			}
			require.Contains(t, statuses, tt.status)
			st := b.state(t, ids[0])
			if tt.wantDead {
				require.Equal(t, "ERROR", st.Status)
				require.Equal(t, b.cfg.MaxAttempts, st.Attempts)
				return
			}
			require.Equal(t, "SENT", st.Status)
			require.Equal(t, int32(1), applied.Load())
		})
	}
}

// keySpy is a Sender that records the IdempotencyKey of each message the relay
// hands it before passing it on.
type keySpy struct {
	relay.Sender
	mu   sync.Mutex
	keys map[int64]string
}

func (s *keySpy) Send(ctx context.Context, m relay.Message) error {
	s.mu.Lock()
	s.keys[m.ID] = m.IdempotencyKey()
	s.mu.Unlock()
	return s.Sender.Send(ctx, m)
}

// TestHTTPSenderHeadersFromRelay checks the headers of messages the relay read
// from two apps' tables in one database, whose ids are the same: each
// message's Idempotency-Key is its own, the same on every delivery, distinct
// from every other message's, those of its key and of the other table included.
func TestHTTPSenderHeadersFromRelay(t *testing.T) {
	t.Parallel()

	var first atomic.Bool
	srv := setupHTTPServer(t, func(w http.ResponseWriter, r *http.Request) {
		if first.CompareAndSwap(false, true) {
			panic(http.ErrAbortHandler) // the first answer is lost: that message is delivered again
		}
		w.WriteHeader(http.StatusNoContent)
	})

	spies := map[string]*keySpy{}
	var ids [][]int64
	for _, app := range []string{"app1", "app2"} {
		b := setup(t)
		ids = append(ids, insertOrder(t, b, "order-1", "created", "updated"))
		spies[app] = &keySpy{Sender: replicaSender(t, srv.srv.URL, app, nil), keys: map[int64]string{}}
		runUntilDone(t, b.newRelay(t, b.cfg, spies[app]))
	}
	require.Equal(t, ids[0], ids[1], "the two tables hold the same ids")

	reqs := srv.received(t)
	require.Len(t, reqs, 5, "4 messages, one of them twice")
	keyOf := map[string]string{} // app/id → Idempotency-Key
	distinct := map[string]bool{}
	for _, r := range reqs {
		app, id := r.Header.Get("Test-Replica"), r.Header.Get("Relay-Message-Id")
		idemKey := r.Header.Get("Idempotency-Key")
		require.Equal(t, "/orders/order-1", r.Path)
		require.Equal(t, "order-1", r.Header.Get("Relay-Message-Key"))
		require.Equal(t, "order", r.Header.Get("Relay-Message-Type"))
		require.NotEqual(t, "order-1", idemKey, "the idempotency key names a message, not a key")
		n, err := strconv.ParseInt(id, 10, 64)
		require.NoError(t, err)
		require.Equal(t, spies[app].keys[n], idemKey, "Message.IdempotencyKey of %s's message %d", app, n)
		if prev, ok := keyOf[app+"/"+id]; ok {
			require.Equal(t, prev, idemKey, "the same on every delivery of a message")
		}
		keyOf[app+"/"+id] = idemKey
		distinct[idemKey] = true
	}
	require.Len(t, keyOf, 4)
	require.Len(t, distinct, 4, "one idempotency key per message: %v", keyOf)
}

// TestReceiversDocShowsTheTestedReceiver keeps the receiver that
// docs/receivers.md shows identical to the one Example_receiver and the tests
// run.
func TestReceiversDocShowsTheTestedReceiver(t *testing.T) {
	t.Parallel()

	doc, err := os.ReadFile(filepath.Join("docs", "receivers.md"))
	require.NoError(t, err)
	example, err := os.ReadFile("example_receiver_test.go")
	require.NoError(t, err)

	var shown string
	for _, block := range strings.Split(string(doc), "```go\n")[1:] {
		if code, _, _ := strings.Cut(block, "```"); strings.Contains(code, "type ordersReceiver") {
			shown = code
		}
	}
	require.NotEmpty(t, shown, "docs/receivers.md shows no ordersReceiver")
	require.True(t, strings.Contains(string(example), shown),
		"docs/receivers.md must show example_receiver_test.go's receiver verbatim, from ordersTable to the end of ServeHTTP")
}
