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
	"github.com/xadm/relay/internal/pgserver"
)

// msgType is the one message type the soak writes and its replicas deliver.
const msgType = "soak"

// The faults, injected in turn.
const (
	faultRelayKill    = "relay killed -9 mid-send"
	faultReceiverKill = "receiver killed -9 after its commit, before its answer"
	faultCut          = "connections to the receiver cut silently"
	faultDBRestart    = "receiver's database restarted"
	faultFailover     = "failover: the elected relay stopped, another takes over"
)

var faultKinds = []string{faultRelayKill, faultReceiverKill, faultCut, faultDBRestart, faultFailover}

// soak is one run: the two databases, the relay replicas and the receiver
// (child processes), the proxy between them, the producer and the faults.
type soak struct {
	o        options
	producer *pgserver.Server
	receiver *pgserver.Server
	out      io.Writer // progress lines; io.Discard when quiet

	id                         string
	table, app                 string // the outbox and the election
	inboxTable, effects, state string // the receiver's tables
	admin                      *pgxpool.Pool
	rdb                        *pgxpool.Pool // the receiver's database, for the checks
	relayAdmin                 *relay.Admin
	proxy                      *cutProxy
	receiverAddr               string
	logs                       *tail

	mu       sync.Mutex
	relays   map[string]*proc
	replicas int // replicas started so far, for their names
	rc       *proc
	written  map[int64]string
	newest   map[string]int64
	writeErr int
	faults   map[string]int
	cutConns int
	released int
	answers  map[string]map[string]int // outcome → Idempotency-Key → answers
	history  map[string][]string       // Idempotency-Key → its first answers, for a failure's report
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
		inboxTable: "inbox_" + id,
		effects:    pgx.Identifier{"effects_" + id}.Sanitize(),
		state:      pgx.Identifier{"state_" + id}.Sanitize(),
		logs:       newTail(64 << 10),
		relays:     map[string]*proc{},
		written:    map[int64]string{},
		newest:     map[string]int64{},
		faults:     map[string]int{},
		answers:    map[string]map[string]int{},
		history:    map[string][]string{},
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
	if err := inbox.CreateTable(ctx, s.rdb, s.inboxTable); err != nil {
		return err
	}
	_, err := s.rdb.Exec(ctx, "CREATE TABLE "+s.effects+" (message_id bigint NOT NULL, message_key text NOT NULL); "+
		"CREATE TABLE "+s.state+" (message_key text PRIMARY KEY, message_id bigint NOT NULL)")
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
func (s *soak) start(cfg childConfig, stdout io.Writer) (*proc, error) {
	cmd, stdin, err := startChild(cfg, stdout, s.logs.prefixed(cfg.Name))
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
		Table: s.table, App: s.app, Destination: s.proxy.URL(), Trace: s.o.trace}, io.Discard)
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
		Addr: s.receiverAddr, Inbox: s.inboxTable, Effects: s.effects, State: s.state, PurgeAge: s.o.purgeAge, AnswerDelay: s.o.answerDelay, Trace: s.o.trace}, lines)
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

// countAnswer counts a line of the receiver: "<outcome> <key> <replica>".
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

// produce writes messages at the rate, for random keys, until ctx ends.
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
			key := fmt.Sprintf("k%d", rng.IntN(s.o.keys))
			// Not ctx: an Enqueue cut short by the end of writing may have
			// committed, and its message would be one the soak does not know.
			wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			id, err := relay.Enqueue(wctx, s.admin, s.table, relay.Outgoing{Type: msgType, Key: key, Payload: fmt.Appendf(nil, `{"n": %d}`, n)})
			cancel()
			s.mu.Lock()
			if err != nil {
				s.writeErr++
			} else {
				s.written[id] = key
				s.newest[key] = max(s.newest[key], id)
			}
			s.mu.Unlock()
		}
	}
}

// injectFaults injects one fault every faultEvery, in turn, until ctx ends.
func (s *soak) injectFaults(ctx context.Context) error {
	t := time.NewTicker(s.o.faultEvery)
	defer t.Stop()
	next := int(s.o.seed % uint64(len(faultKinds)))
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
		if err := s.inject(ctx, kind); err != nil {
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

func (s *soak) inject(ctx context.Context, kind string) error {
	switch kind {
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
// effect, or the drain's limit passes.
func (s *soak) waitDrained(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.o.drain)
	defer cancel()
	s.mu.Lock()
	written := len(s.written)
	s.mu.Unlock()
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

func (t *tail) prefixed(name string) io.Writer {
	return &lineWriter{line: func(l string) {
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
