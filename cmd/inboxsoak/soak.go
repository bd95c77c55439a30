package main

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/xadm/relay"
	"github.com/xadm/relay/inbox"
	"github.com/xadm/relay/internal/testkit/pgserver"
)

// The faults, injected in turn.
const (
	faultRelayKill    = "relay killed -9 mid-send"
	faultReceiverKill = "receiver killed -9 after its commit, before its answer"
	faultCut          = "connections to the receiver cut silently"
	faultDBRestart    = "receiver's database restarted"
	faultFailover     = "failover: the elected relay stopped, another takes over"
	faultPause        = "order paused (503s) while a burst of ledger drains"
	faultFailing      = "receiver failing (503s) for every type"
)

// faultKinds are the faults in the order injected; the two that fail the
// receiver on purpose lie apart.
var faultKinds = []string{faultRelayKill, faultPause, faultReceiverKill, faultCut, faultFailing, faultDBRestart, faultFailover}

// soak is one run: the two databases, the relay replicas and the receiver
// (child processes), the proxy between them, the producer and the faults.
type soak struct {
	o        options
	producer *pgserver.Server
	receiver *pgserver.Server
	out      io.Writer // progress lines; io.Discard when quiet

	id                      string
	table, app              string // the outbox and the election
	orderInbox, ledgerInbox string // the receiver's inboxes: order's (stale-drop) and ledger's (KeepStale)
	effects, keys           string // the receiver's tables, quoted: one row per effect, one per key
	ks                      keySpace
	admin                   *pgxpool.Pool
	rdb                     *pgxpool.Pool // the receiver's database, for the checks
	relayAdmin              *relay.Admin
	proxy                   *cutProxy
	receiverAddr            string
	logs                    *tail

	mu          sync.Mutex
	relays      map[string]*proc
	replicas    int // replicas started so far, for their names
	rc          *proc
	written     map[int64]message
	newest      map[string]int64 // per key, its newest order message
	sums        map[string]int64 // per key, the sum of its ledger amounts
	burst       int              // ledger messages the pause faults wrote
	writeErr    int
	faults      map[string]int
	pauses      map[string]int // per type, the pauses the relays logged
	pauseFaults []pauseFault
	cutConns    int
	released    int
	answers     map[string]map[string]int // outcome → Idempotency-Key → answers
	history     map[string][]string       // Idempotency-Key → its first answers, for a failure's report
}

// pauseFault is what one injection of faultPause did.
type pauseFault struct {
	paused  bool // the relays paused order meanwhile
	burst   int  // ledger messages written during it
	applied int  // of them, applied before order's 503s ended; -1 unknown
}

// proc is a child process.
type proc struct {
	name  string
	cmd   *exec.Cmd
	stdin io.WriteCloser
	done  chan struct{} // closed once it has exited
}

// newSoak creates the tables and starts the proxy, the receiver and the
// relay replicas.
func newSoak(ctx context.Context, o options, producer, receiver *pgserver.Server, out io.Writer) (*soak, error) {
	if !receiver.Local() {
		return nil, errors.New("the receiver's database must be a local cluster, which the soak restarts: install the PostgreSQL server binaries")
	}
	b := make([]byte, 4)
	for i := range b {
		b[i] = byte(rand.N(256))
	}
	id := hex.EncodeToString(b)
	s := &soak{
		o: o, producer: producer, receiver: receiver, out: out, id: id,
		table: "soak_" + id, app: "inboxsoak_" + id,
		orderInbox:  "inbox_order_" + id,
		ledgerInbox: "inbox_ledger_" + id,
		effects:     pgx.Identifier{"effects_" + id}.Sanitize(),
		keys:        pgx.Identifier{"keys_" + id}.Sanitize(),
		ks:          keySpace{n: o.keys},
		logs:        newTail(64 << 10),
		relays:      map[string]*proc{},
		written:     map[int64]message{},
		newest:      map[string]int64{},
		sums:        map[string]int64{},
		faults:      map[string]int{},
		pauses:      map[string]int{},
		answers:     map[string]map[string]int{},
		history:     map[string][]string{},
	}
	var err error
	if s.admin, err = pgxpool.New(ctx, producer.URL); err != nil {
		return nil, err
	}
	if s.rdb, err = pgxpool.New(ctx, receiver.URL); err != nil {
		s.close()
		return nil, err
	}
	if err := s.createTables(ctx); err != nil {
		s.close()
		return nil, err
	}
	if s.relayAdmin, err = relay.NewAdmin(s.admin, relayConfig(s.table, s.app), relay.AdminAllTypes()); err != nil {
		s.close()
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		s.close()
		return nil, err
	}
	s.receiverAddr = ln.Addr().String()
	ln.Close()
	if s.proxy, err = newCutProxy(s.receiverAddr); err != nil {
		s.close()
		return nil, err
	}
	if err := s.startReceiver(ctx); err != nil {
		s.close()
		return nil, err
	}
	for range o.replicas {
		if err := s.startRelay(); err != nil {
			s.close()
			return nil, err
		}
	}
	return s, nil
}

func (s *soak) createTables(ctx context.Context) error {
	if err := relay.CreateTable(ctx, s.admin, s.table); err != nil {
		return err
	}
	for _, t := range []string{s.orderInbox, s.ledgerInbox} {
		if err := inbox.CreateTable(ctx, s.rdb, t); err != nil {
			return err
		}
	}
	// seq is the order in which a key's effects were applied (the receiver
	// takes the key's row before it draws one); applied_at the time.
	_, err := s.rdb.Exec(ctx, "CREATE TABLE "+s.effects+" (seq bigserial PRIMARY KEY, message_id bigint NOT NULL, "+
		"message_key text NOT NULL, type text NOT NULL, amount bigint NOT NULL, applied_at timestamptz NOT NULL DEFAULT clock_timestamp()); "+
		"CREATE TABLE "+s.keys+" (message_key text PRIMARY KEY, order_id bigint, "+
		"ledger_sum bigint NOT NULL DEFAULT 0, ledger_count bigint NOT NULL DEFAULT 0)")
	return err
}

// close stops every child process still running and releases the rest.
func (s *soak) close() {
	s.mu.Lock()
	var all []*proc
	for _, p := range s.relays {
		all = append(all, p)
	}
	if s.rc != nil {
		all = append(all, s.rc)
	}
	s.mu.Unlock()
	for _, p := range all {
		p.kill()
	}
	if s.proxy != nil {
		s.proxy.Close()
	}
	if s.admin != nil {
		s.admin.Close()
	}
	if s.rdb != nil {
		s.rdb.Close()
	}
}

// start starts a child and a goroutine that closes its done when it exits.
// Its stderr goes to the logs' tail, each line to observe too if not nil.
func (s *soak) start(cfg childConfig, stdout io.Writer, observe func(line string)) (*proc, error) {
	cmd, stdin, err := startChild(cfg, stdout, s.logs.prefixed(cfg.Name, observe))
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", cfg.Name, err)
	}
	p := &proc{name: cfg.Name, cmd: cmd, stdin: stdin, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// kill kills p (SIGKILL) and waits until it has exited.
func (p *proc) kill() {
	_ = p.cmd.Process.Kill()
	<-p.done
	_ = p.stdin.Close()
}

// stop asks p to stop gracefully (SIGTERM), and kills it if it has not
// within limit, or if the platform has no such signal.
func (p *proc) stop(limit time.Duration) {
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		p.kill()
		return
	}
	t := time.NewTimer(limit)
	defer t.Stop()
	select {
	case <-p.done:
		_ = p.stdin.Close()
	case <-t.C:
		p.kill()
	}
}

// startRelay starts a new relay replica.
func (s *soak) startRelay() error {
	s.mu.Lock()
	s.replicas++
	name := fmt.Sprintf("inboxsoak-%s-r%d", s.id, s.replicas)
	s.mu.Unlock()
	p, err := s.start(childConfig{Role: "relay", Name: name, ProducerURL: s.producer.URL,
		Table: s.table, App: s.app, Destination: s.proxy.URL(), Trace: s.o.trace}, io.Discard, s.observeRelay)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.relays[name] = p
	s.mu.Unlock()
	return nil
}

// startReceiver starts the receiver and waits until it listens.
func (s *soak) startReceiver(ctx context.Context) error {
	listened := make(chan struct{})
	var once sync.Once
	lines := &lineWriter{line: func(l string) {
		if l == "listening" {
			once.Do(func() { close(listened) })
			return
		}
		s.countAnswer(l)
	}}
	p, err := s.start(childConfig{Role: "receiver", Name: "inboxsoak-" + s.id + "-receiver", ReceiverURL: s.receiver.URL,
		Addr: s.receiverAddr, OrderInbox: s.orderInbox, LedgerInbox: s.ledgerInbox, Effects: s.effects, Keys: s.keys,
		PurgeAge: s.o.purgeAge, AnswerDelay: s.o.answerDelay, Trace: s.o.trace}, lines, nil)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.rc = p
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	select {
	case <-listened:
		return nil
	case <-p.done:
		return fmt.Errorf("the receiver exited at its start:\n%s", s.logs)
	case <-ctx.Done():
		return fmt.Errorf("the receiver did not listen within a minute: %w", ctx.Err())
	}
}

// observeRelay counts the pauses a relay logs: its lines at Warn and above
// reach the soak, and a pause is one ("relay: type paused: …" type=order).
func (s *soak) observeRelay(l string) {
	if !strings.Contains(l, `msg="relay: type paused`) {
		return
	}
	_, typ, ok := strings.Cut(l, " type=")
	if !ok {
		return
	}
	typ, _, _ = strings.Cut(typ, " ")
	s.mu.Lock()
	s.pauses[typ]++
	s.mu.Unlock()
}

// pausesOf returns how many pauses of typ the relays logged so far.
func (s *soak) pausesOf(typ string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pauses[typ]
}

// countAnswer counts a line of the receiver: "<outcome> <Idempotency-Key>
// <replica> <type>".
func (s *soak) countAnswer(l string) {
	f := strings.Fields(l)
	if len(f) < 2 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.answers[f[0]] == nil {
		s.answers[f[0]] = map[string]int{}
	}
	s.answers[f[0]][f[1]]++
	if h := s.history[f[1]]; len(h) < 8 {
		s.history[f[1]] = append(h, time.Now().Format("15:04:05.000")+" "+l)
	}
}

// run writes messages and injects faults for the duration, then drains and
// checks. It returns the report; an error says the soak could not finish.
func (s *soak) run(ctx context.Context) (*report, error) {
	begin := time.Now()
	writeCtx, stopWriting := context.WithTimeout(ctx, s.o.duration)
	defer stopWriting()
	var wg sync.WaitGroup
	wg.Go(func() { s.produce(writeCtx) })
	faultErr := s.injectFaults(writeCtx)
	stopWriting()
	wg.Wait()
	s.progress("writing stopped after %s: %d messages; draining", time.Since(begin).Round(time.Second), len(s.written))
	if faultErr != nil {
		return nil, faultErr
	}

	// Heal: the last cut's requests arrive, the receiver is up.
	s.released += s.proxy.Release()
	drainErr := s.waitDrained(ctx)

	// Stop the replicas gracefully and the receiver, so that every answer
	// it printed is counted.
	s.mu.Lock()
	var relays []*proc
	for _, p := range s.relays {
		relays = append(relays, p)
	}
	rc := s.rc
	s.mu.Unlock()
	for _, p := range relays {
		p.stop(15 * time.Second)
	}
	rc.stop(10 * time.Second)
	rep, err := s.check(ctx)
	if err != nil {
		return nil, err
	}
	rep.duration = time.Since(begin)
	rep.drainErr = drainErr
	return rep, nil
}

// produce writes messages at the rate, each of either type at random, for
// random keys of its type, until ctx ends.
func (s *soak) produce(ctx context.Context) {
	rng := rand.New(rand.NewPCG(s.o.seed, 1))
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	start, n := time.Now(), 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		due := int(time.Since(start).Seconds() * float64(s.o.rate))
		for ; n < due && ctx.Err() == nil; n++ {
			m, payload := newMessage(rng, s.ks, msgTypes[rng.IntN(len(msgTypes))], n)
			// Not ctx: an Enqueue cut short by the end of writing may have
			// committed, and its message would be one the soak does not know.
			wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			id, err := relay.Enqueue(wctx, s.admin, s.table, relay.Outgoing{Type: m.typ, Key: m.key, Payload: payload})
			cancel()
			s.mu.Lock()
			if err != nil {
				s.writeErr++
			} else {
				s.wroteLocked(id, m)
			}
			s.mu.Unlock()
		}
	}
}

// wroteLocked notes message id, committed (s.mu held).
func (s *soak) wroteLocked(id int64, m message) {
	s.written[id] = m
	switch m.typ {
	case typeOrder:
		s.newest[m.key] = max(s.newest[m.key], id)
	case typeLedger:
		s.sums[m.key] += m.amount
	}
}

// writeBurst writes the pause fault's burst of ledger messages, in one
// transaction (EnqueueMany), and returns their ids.
func (s *soak) writeBurst(ctx context.Context, rng *rand.Rand) []int64 {
	if s.o.burst == 0 {
		return nil
	}
	ms := make([]message, s.o.burst)
	out := make([]relay.Outgoing, s.o.burst)
	for i := range ms {
		var payload []byte
		ms[i], payload = newMessage(rng, s.ks, typeLedger, -1-i)
		out[i] = relay.Outgoing{Type: typeLedger, Key: ms[i].key, Payload: payload}
	}
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	ids, err := relay.EnqueueMany(wctx, s.admin, s.table, out)
	cancel()
	s.mu.Lock()
	defer s.mu.Unlock()
	if err != nil {
		s.writeErr++
		return nil
	}
	for i, id := range ids {
		s.wroteLocked(id, ms[i])
	}
	s.burst += len(ids)
	return ids
}

// injectFaults injects one fault every faultEvery, in turn, until ctx ends.
func (s *soak) injectFaults(ctx context.Context) error {
	t := time.NewTicker(s.o.faultEvery)
	defer t.Stop()
	next := int(s.o.seed % uint64(len(faultKinds)))
	rng := rand.New(rand.NewPCG(s.o.seed, 2)) // the bursts' keys and amounts
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		// What the last cut held arrives now, late.
		s.released += s.proxy.Release()
		kind := faultKinds[next%len(faultKinds)]
		next++
		if err := s.inject(ctx, kind, rng); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("%s: %w", kind, err)
		}
		s.mu.Lock()
		s.faults[kind]++
		s.mu.Unlock()
		s.progress("%s", kind)
	}
}

func (s *soak) inject(ctx context.Context, kind string, rng *rand.Rand) error {
	switch kind {
	case faultPause:
		return s.pauseOrder(ctx, rng)
	case faultFailing:
		if err := s.fail(ctx, "all"); err != nil {
			return err
		}
		sleep(ctx, s.o.failFor)
		return nil
	case faultRelayKill, faultFailover:
		p := s.elected(ctx)
		if p == nil {
			return errors.New("no relay replica runs")
		}
		s.mu.Lock()
		delete(s.relays, p.name)
		s.mu.Unlock()
		if kind == faultRelayKill {
			p.kill()
		} else {
			p.stop(15 * time.Second)
		}
		return s.startRelay()
	case faultReceiverKill:
		s.mu.Lock()
		rc := s.rc
		s.mu.Unlock()
		resp, err := http.Post("http://"+s.receiverAddr+"/crash", "", nil)
		if err != nil {
			return err
		}
		resp.Body.Close()
		t := time.NewTimer(time.Minute)
		defer t.Stop()
		select {
		case <-rc.done: // it committed a message and died before answering
		case <-ctx.Done():
			rc.kill()
		case <-t.C:
			rc.kill()
			return errors.New("the armed receiver applied no message within a minute")
		}
		_ = rc.stdin.Close()
		return s.startReceiver(context.WithoutCancel(ctx))
	case faultCut:
		n := s.proxy.Cut()
		s.mu.Lock()
		s.cutConns += n
		s.mu.Unlock()
		return nil
	case faultDBRestart:
		if err := s.receiver.Halt(); err != nil {
			return err
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		return s.receiver.Resume(rctx)
	}
	return fmt.Errorf("unknown fault %q", kind)
}

// pauseOrder injects faultPause: the receiver answers 503 to order for
// failFor. Once the relays paused order and order's messages piled up for
// half of failFor, a burst of ledger messages is written, which drains
// meanwhile, but for its keys whose older order messages wait.
func (s *soak) pauseOrder(ctx context.Context, rng *rand.Rand) error {
	before := s.pausesOf(typeOrder)
	begin := time.Now()
	end := begin.Add(s.o.failFor)
	if err := s.fail(ctx, typeOrder); err != nil {
		return err
	}
	for s.pausesOf(typeOrder) == before && time.Now().Before(end) && ctx.Err() == nil {
		sleep(ctx, 20*time.Millisecond)
	}
	sleep(ctx, time.Until(begin.Add(s.o.failFor/2)))
	ids := s.writeBurst(ctx, rng)
	sleep(ctx, time.Until(end))
	pf := pauseFault{paused: s.pausesOf(typeOrder) > before, burst: len(ids), applied: -1}
	qctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_ = s.rdb.QueryRow(qctx, "SELECT count(DISTINCT message_id) FROM "+s.effects+" WHERE message_id = ANY($1)", ids).Scan(&pf.applied)
	s.mu.Lock()
	s.pauseFaults = append(s.pauseFaults, pf)
	s.mu.Unlock()
	return nil
}

// fail makes the receiver answer 503 to typ ("all": every type) for failFor.
func (s *soak) fail(ctx context.Context, typ string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost,
		"http://"+s.receiverAddr+"/fail?type="+typ+"&for="+s.o.failFor.String(), nil)
	if err != nil {
		return err
	}
	req.Close = true // no idle connection left behind
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("the receiver refused to fail: %s %s", resp.Status, b)
	}
	return nil
}

// sleep waits for d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// elected returns the replica that holds the election, or any replica when
// none does at this moment (between two passes).
func (s *soak) elected(ctx context.Context) *proc {
	holders, _ := s.relayAdmin.Election(ctx)
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, h := range holders {
		if p, ok := s.relays[h.Replica]; ok && h.Granted {
			return p
		}
	}
	for _, p := range s.relays {
		return p
	}
	return nil
}

// waitDrained waits until every row is SENT and every message has an
// effect, or the drain's limit passes, or every row is SENT and no message
// took effect for 5s: the rest never will (every held request of the cuts
// was released before the drain).
func (s *soak) waitDrained(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.o.drain)
	defer cancel()
	s.mu.Lock()
	written := len(s.written)
	s.mu.Unlock()
	const still = 5 * time.Second
	last, since := -1, time.Now()
	for {
		var pending, applied int
		err := s.admin.QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{s.table}.Sanitize()+" WHERE status <> 'SENT'").Scan(&pending)
		if err == nil {
			err = s.rdb.QueryRow(ctx, "SELECT count(DISTINCT message_id) FROM "+s.effects).Scan(&applied)
		}
		if err == nil && pending == 0 && applied >= written {
			s.progress("drained: every row SENT, %d messages applied", applied)
			return nil
		}
		if err != nil || pending > 0 || applied != last {
			last, since = applied, time.Now()
		} else if time.Since(since) >= still {
			return fmt.Errorf("every row SENT, but only %d of %d messages applied, none in the last %s", applied, written, still)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not drained within %s: %d rows not SENT, %d of %d messages applied", s.o.drain, pending, applied, written)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (s *soak) progress(format string, args ...any) {
	fmt.Fprintf(s.out, "%s  %s\n", time.Now().Format("15:04:05.000"), fmt.Sprintf(format, args...))
}

// lineWriter calls line for each line written to it.
type lineWriter struct {
	mu   sync.Mutex
	buf  []byte
	line func(string)
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			return len(p), nil
		}
		w.line(string(w.buf[:i]))
		w.buf = w.buf[i+1:]
	}
}

// tail keeps the last bytes the children logged, for a failure's report.
type tail struct {
	mu   sync.Mutex
	max  int
	buf  []byte
	file *os.File // every line, when -log is set
}

func newTail(n int) *tail { return &tail{max: n} }

// prefixed returns a writer whose lines the tail keeps, each prefixed with
// name, and gives to observe too if not nil.
func (t *tail) prefixed(name string, observe func(line string)) io.Writer {
	return &lineWriter{line: func(l string) {
		if observe != nil {
			observe(l)
		}
		t.mu.Lock()
		defer t.mu.Unlock()
		line := name + ": " + l + "\n"
		if t.file != nil {
			_, _ = io.WriteString(t.file, line)
		}
		t.buf = append(t.buf, line...)
		if len(t.buf) > t.max {
			t.buf = t.buf[len(t.buf)-t.max:]
		}
	}}
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}
