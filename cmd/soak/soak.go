package main

import (
	"context"
	"encoding/hex"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/xadm/relay"
	"github.com/xadm/relay/internal/testkit/pgserver"
	"github.com/xadm/relay/internal/tools/benchkit"
)

// soak is one run: a table, a receiver, the replicas, the producer and the
// fault injector.
type soak struct {
	o       options
	srv     *pgserver.Server
	id      string // the run's id: names the table, the app and the sessions
	table   string
	app     string
	admin   *pgxpool.Pool // the producer's and the soak's own sessions, never killed
	rc      *receiver
	client  *http.Client
	sends   sendLog
	sink    *logSink
	logFile *os.File
	faults  eventLog[fault]
	outages eventLog[outage]

	mu       sync.Mutex
	replicas []*replica
	stopped  []replicaStats // the stats of replicas replaced by a roll
	lockLeft []string       // replicas whose sessions still held an advisory lock after Stop
	rolls    int
	written  []int64 // ids the producer committed
	writeErr int     // producer transactions that failed
}

// replica is one relay with its own pool, as one pod of the app would run it.
type replica struct {
	idx     int
	appName string // application_name of its sessions: how the injector finds them
	pool    *pgxpool.Pool
	relay   *relay.Relay
}

type replicaStats struct {
	idx int
	relay.Stats
}

func newSoak(ctx context.Context, o options, srv *pgserver.Server) (*soak, error) {
	b := make([]byte, 4)
	for i := range b {
		b[i] = byte(rand.N(256))
	}
	id := hex.EncodeToString(b)
	s := &soak{o: o, srv: srv, id: id, table: "soak_" + id, app: "soak_" + id}
	var next slog.Handler
	if o.logPath != "" {
		f, err := os.Create(o.logPath)
		if err != nil {
			return nil, err
		}
		s.logFile = f
		next = slog.NewJSONHandler(f, &slog.HandlerOptions{Level: slog.LevelDebug})
	}
	s.sink = newLogSink(next)
	pool, err := s.newPool(ctx, "soak-"+id+"-admin", 4)
	if err != nil {
		s.close()
		return nil, err
	}
	s.admin = pool
	if err := relay.CreateTable(ctx, s.admin, s.table); err != nil {
		s.close()
		return nil, err
	}
	if s.rc, err = startReceiver(o.sendDelay); err != nil {
		s.close()
		return nil, fmt.Errorf("start the receiver: %w", err)
	}
	// A client of its own: no proxy from the environment, room for every request in flight.
	s.client = &http.Client{
		Transport: &http.Transport{MaxIdleConnsPerHost: o.replicas * o.concurrency, IdleConnTimeout: 30 * time.Second},
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}
	return s, nil
}

// close drops the table and releases what newSoak took.
func (s *soak) close() {
	if s.admin != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, _ = s.admin.Exec(ctx, "DROP TABLE IF EXISTS "+pgx.Identifier{s.table}.Sanitize())
		cancel()
		s.admin.Close()
	}
	if s.rc != nil {
		s.rc.close()
	}
	if s.client != nil {
		s.client.CloseIdleConnections()
	}
	if s.logFile != nil {
		_ = s.logFile.Close()
	}
}

func (s *soak) newPool(ctx context.Context, appName string, maxConns int32) (*pgxpool.Pool, error) {
	return benchkit.Pool(ctx, s.srv.URL, appName, maxConns)
}

// replicaPrefix starts the application_name of every replica's sessions.
func (s *soak) replicaPrefix() string { return "soak-" + s.id + "-r" }

// startReplica starts replica idx on a fresh pool.
func (s *soak) startReplica(ctx context.Context, idx int) (*replica, error) {
	rp := &replica{idx: idx, appName: s.replicaPrefix() + strconv.Itoa(idx)}
	pool, err := s.newPool(ctx, rp.appName, int32(s.o.concurrency+4))
	if err != nil {
		return nil, err
	}
	rp.pool = pool
	var senders []relay.Sender
	for _, typ := range msgTypes {
		hs, err := relay.NewHTTPSender(relay.HTTPSenderConfig{
			Type:   typ,
			URL:    relay.URLWithKey(s.rc.URL + "/" + typ),
			Client: s.client,
			Header: http.Header{"Soak-Replica": {strconv.Itoa(idx)}},
		})
		if err != nil {
			pool.Close()
			return nil, err
		}
		senders = append(senders, &recordingSender{next: hs, replica: idx, log: &s.sends})
	}
	cfg := relay.DefaultConfig()
	cfg.AppName = s.app
	cfg.Table = s.table
	cfg.Interval = s.o.interval
	cfg.BatchSize = s.o.batch
	cfg.Concurrency = s.o.concurrency
	cfg.RetryBackoff = 100 * time.Millisecond
	cfg.MaxAttempts = maxAttempts
	// The default, said: a type whose Sends fail 5 times in a row pauses for
	// 5s, then a probe resumes it. The receiver's outages pause a type.
	cfg.PauseAfter = 5
	cfg.SendTimeout = 5 * time.Second
	cfg.ClusterLock = s.o.clusterLock
	cfg.Partitions = s.o.partitions
	cfg.Logger = slog.New(s.sink.handler(idx))
	r, err := relay.New(pool, cfg, senders...)
	if err == nil {
		err = r.Start(ctx)
	}
	if err != nil {
		pool.Close()
		return nil, err
	}
	rp.relay = r
	return rp, nil
}

// stopReplica stops rp gracefully within a bound, checks that its sessions
// hold no advisory lock any more, and closes its pool.
func (s *soak) stopReplica(rp *replica) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := rp.relay.Stop(ctx); err != nil {
		fmt.Fprintf(os.Stderr, "soak: replica %d: %v\n", rp.idx, err)
	}
	var held int
	err := s.admin.QueryRow(ctx, `SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
		WHERE l.locktype = 'advisory' AND a.application_name = $1`, rp.appName).Scan(&held)
	s.mu.Lock()
	if err != nil || held > 0 {
		s.lockLeft = append(s.lockLeft, fmt.Sprintf("replica %d: %d advisory lock(s) held after Stop (%v)", rp.idx, held, err))
	}
	s.stopped = append(s.stopped, replicaStats{idx: rp.idx, Stats: rp.relay.Stats()})
	s.mu.Unlock()
	rp.pool.Close()
}

// run writes and injects faults for the duration, drains, stops the replicas
// and returns the report.
func (s *soak) run(ctx context.Context) (*report, error) {
	for i := range s.o.replicas {
		rp, err := s.startReplica(ctx, i)
		if err != nil {
			for _, started := range s.replicas {
				s.stopReplica(started)
			}
			return nil, fmt.Errorf("start replica %d: %w", i, err)
		}
		s.replicas = append(s.replicas, rp)
	}

	start := time.Now()
	work, stopWork := context.WithTimeout(ctx, s.o.duration)
	defer stopWork()
	var wg sync.WaitGroup
	wg.Go(func() { s.produce(work) })
	if s.o.killEvery > 0 {
		wg.Go(func() { s.inject(work, rand.New(rand.NewPCG(s.o.seed, 1))) })
	}
	if s.o.rollEvery > 0 {
		wg.Go(func() { s.roll(work) })
	}
	if s.o.outageEvery > 0 {
		wg.Go(func() { s.failReceiver(work) })
	}
	s.progress(work, start, &wg)
	wg.Wait()
	writeEnd := time.Now()

	// Drain: every row written is SENT and every message received.
	drained := false
	deadline := time.Now().Add(s.o.drain)
	for !drained && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(100 * time.Millisecond)
		var open int
		qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := s.admin.QueryRow(qctx, "SELECT count(*) FROM "+pgx.Identifier{s.table}.Sanitize()+" WHERE status <> 'SENT'").Scan(&open)
		cancel()
		distinct, _ := s.rc.counts()
		drained = err == nil && open == 0 && distinct >= len(s.writtenIDs())
	}
	drainTook := time.Since(writeEnd)

	s.mu.Lock()
	replicas := s.replicas
	s.mu.Unlock()
	for _, rp := range replicas {
		s.stopReplica(rp)
	}
	free, err := s.electionFree(ctx)
	if err != nil {
		return nil, err
	}
	rep, err := s.report(ctx)
	if err != nil {
		return nil, err
	}
	rep.took, rep.drainTook, rep.drained, rep.electionFree = writeEnd.Sub(start), drainTook, drained, free
	return rep, nil
}

// progress prints a line every 5s until ctx ends, then waits for wg.
func (s *soak) progress(ctx context.Context, start time.Time, wg *sync.WaitGroup) {
	t := time.NewTicker(5 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if s.o.quiet {
				continue
			}
			distinct, total := s.rc.counts()
			fmt.Fprintf(os.Stderr, "soak: %3.0fs written %d, delivered %d, requests %d, faults %d, outages %d, rolls %d\n",
				time.Since(start).Seconds(), len(s.writtenIDs()), distinct, total, s.faults.len(), s.outages.len(), s.rollCount())
		}
	}
}

func (s *soak) writtenIDs() []int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.written
}

func (s *soak) rollCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.rolls
}

// produce writes messages at the rate until ctx ends, as a service would: each
// batch of messages due in one transaction, with relay.Enqueue, each message
// of either type at random, for a random key of its type.
func (s *soak) produce(ctx context.Context) {
	rng := rand.New(rand.NewPCG(s.o.seed, 2))
	start := time.Now()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	n := 0
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		due := int(time.Since(start).Seconds()*float64(s.o.rate)) - n
		if due <= 0 {
			continue
		}
		due = min(due, 500)
		ids := make([]int64, 0, due)
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		err := pgx.BeginFunc(wctx, s.admin, func(tx pgx.Tx) error {
			for range due {
				typ := msgTypes[rng.IntN(len(msgTypes))]
				key := keyOf(rng, s.o.keys, typ)
				id, err := relay.Enqueue(wctx, tx, s.table, relay.Outgoing{
					Type: typ, Key: key, Payload: fmt.Appendf(nil, `{"key": %q, "n": %d}`, key, n+len(ids)),
				})
				if err != nil {
					return err
				}
				ids = append(ids, id)
			}
			return nil
		})
		cancel()
		n += due
		s.mu.Lock()
		if err != nil {
			s.writeErr++
		} else {
			s.written = append(s.written, ids...)
		}
		s.mu.Unlock()
	}
}

// fault is one killed session.
type fault struct {
	at         time.Time
	replica    int
	pid        int32
	lockHolder bool   // the session held the election
	state      string // pg_stat_activity.state when it was killed
}

// eventLog is a list of events the soak's goroutines add to while the
// report reads it: its faults, its outages.
type eventLog[T any] struct {
	mu     sync.Mutex
	events []T
}

func (l *eventLog[T]) add(e T) {
	l.mu.Lock()
	l.events = append(l.events, e)
	l.mu.Unlock()
}

func (l *eventLog[T]) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.events)
}

func (l *eventLog[T]) all() []T {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]T(nil), l.events...)
}

// inject kills a relay session every killEvery on average (uniformly between
// half and one and a half of it): half the time the election's holder, else
// any session of any replica.
func (s *soak) inject(ctx context.Context, rng *rand.Rand) {
	for {
		wait := time.Duration(float64(s.o.killEvery) * (0.5 + rng.Float64()))
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		f, ok, err := s.killOne(ctx, rng.IntN(2) == 0, rng.Uint64())
		if err != nil {
			if ctx.Err() == nil {
				fmt.Fprintln(os.Stderr, "soak: inject a fault:", err)
			}
			continue
		}
		if ok {
			s.faults.add(f)
		}
	}
}

// killOne terminates one relay session: the election's holder if holder is
// true (waiting up to a second for a pass to hold it), else one picked with
// pick among all the replicas' sessions. ok is false when there was none to kill.
func (s *soak) killOne(ctx context.Context, holder bool, pick uint64) (f fault, ok bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	// A holder holds the app's key (one-int advisory lock, objsubid 1) or,
	// partitioned, a partition of it (two-int lock whose first int is the
	// key's hash, objsubid 2).
	const sessionsSQL = `SELECT a.pid, a.application_name, coalesce(a.state, ''), EXISTS (
		  SELECT 1 FROM pg_locks l
		  WHERE l.pid = a.pid AND l.locktype = 'advisory' AND l.granted
		    AND (l.objsubid = 1
		         AND l.classid = ((hashtext($2)::bigint >> 32) & 4294967295)::oid
		         AND l.objid = (hashtext($2)::bigint & 4294967295)::oid
		      OR l.objsubid = 2
		         AND l.classid = (hashtext($2)::bigint & 4294967295)::oid))
		FROM pg_stat_activity a WHERE starts_with(a.application_name, $1) ORDER BY a.pid`
	type session struct {
		pid        int32
		app, state string
		held       bool
	}
	var candidates []session
	for try := 0; len(candidates) == 0; try++ {
		if try > 0 {
			if !holder || try == 100 {
				return f, false, nil
			}
			select {
			case <-ctx.Done():
				return f, false, ctx.Err()
			case <-time.After(10 * time.Millisecond):
			}
		}
		rows, err := s.admin.Query(ctx, sessionsSQL, s.replicaPrefix(), s.app+relay.LockKeySuffix)
		if err != nil {
			return f, false, err
		}
		sessions, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (session, error) {
			var ss session
			return ss, row.Scan(&ss.pid, &ss.app, &ss.state, &ss.held)
		})
		if err != nil {
			return f, false, err
		}
		for _, ss := range sessions {
			if ss.held || !holder {
				candidates = append(candidates, ss)
			}
		}
	}
	victim := candidates[pick%uint64(len(candidates))]
	replicaIdx, err := strconv.Atoi(strings.TrimPrefix(victim.app, s.replicaPrefix()))
	if err != nil {
		return f, false, fmt.Errorf("session %d of %q is not a replica's", victim.pid, victim.app)
	}
	f = fault{at: time.Now(), replica: replicaIdx, pid: victim.pid, lockHolder: victim.held, state: victim.state}
	var killed bool
	if err := s.admin.QueryRow(ctx, "SELECT pg_terminate_backend($1)", victim.pid).Scan(&killed); err != nil {
		return f, false, err
	}
	return f, killed, nil
}

// maxAttempts is every replica's MaxAttempts: the receiver's outages are
// expected, and no message may die of them.
const maxAttempts = 1_000_000

// outage is one time the receiver failed on purpose.
type outage struct {
	at    time.Time
	types []string
}

// failReceiver makes the receiver fail for outageFor every outageEvery, in
// turn order alone (ledger drains meanwhile), ledger alone, then both, so
// that types pause and resume.
func (s *soak) failReceiver(ctx context.Context) {
	t := time.NewTicker(s.o.outageEvery)
	defer t.Stop()
	turns := [][]string{{typeOrder}, {typeLedger}, msgTypes}
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		types := turns[i%len(turns)]
		s.rc.fail(types, s.o.outageFor)
		s.outages.add(outage{at: time.Now(), types: types})
	}
}

// roll restarts one replica at a time, every rollEvery, as a rolling deploy does.
func (s *soak) roll(ctx context.Context) {
	t := time.NewTicker(s.o.rollEvery)
	defer t.Stop()
	for i := 0; ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s.mu.Lock()
		idx := i % len(s.replicas)
		old := s.replicas[idx]
		s.mu.Unlock()
		s.stopReplica(old)
		rp, err := s.startReplica(context.WithoutCancel(ctx), idx)
		if err != nil {
			fmt.Fprintf(os.Stderr, "soak: restart replica %d: %v\n", idx, err)
			return
		}
		s.mu.Lock()
		s.replicas[idx] = rp
		s.rolls++
		s.mu.Unlock()
	}
}

// electionFree reports whether a fresh session can take the app's election
// once every replica stopped.
func (s *soak) electionFree(ctx context.Context) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.srv.URL)
	if err != nil {
		return false, err
	}
	defer conn.Close(ctx)
	var ok bool
	if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock(hashtext($1))", s.app+relay.LockKeySuffix).Scan(&ok); err != nil {
		return false, err
	}
	return ok, nil
}

// send is one call of a replica's sender, as the relay saw it.
type send struct {
	id         int64
	replica    int
	start, end time.Time
	err        error
}

type sendLog struct {
	mu    sync.Mutex
	sends map[int64][]send
}

func (l *sendLog) add(s send) {
	l.mu.Lock()
	if l.sends == nil {
		l.sends = map[int64][]send{}
	}
	l.sends[s.id] = append(l.sends[s.id], s)
	l.mu.Unlock()
}

func (l *sendLog) of(id int64) []send {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]send(nil), l.sends[id]...)
}

// recordingSender records each send of a replica around the real sender.
type recordingSender struct {
	next    relay.Sender
	replica int
	log     *sendLog
}

func (s *recordingSender) Type() string { return s.next.Type() }

func (s *recordingSender) Send(ctx context.Context, m relay.Message) error {
	start := time.Now()
	err := s.next.Send(ctx, m)
	s.log.add(send{id: m.ID, replica: s.replica, start: start, end: time.Now(), err: err})
	return err
}

// evidence is what a replica's log said about one message.
type evidence struct {
	at  time.Time
	msg string
}

type evKey struct {
	replica int
	id      int64
}

// logSink counts the replicas' log records and keeps those that explain a
// duplicate: the relay says when an outcome was not recorded and when a send
// was cut short. It counts each type's pauses and resumes too.
type logSink struct {
	next slog.Handler // the -log file, or nil

	mu       sync.Mutex
	levels   map[slog.Level]int
	messages map[string]int
	evidence map[evKey][]evidence
	paused   map[string]int // per type
	resumed  map[string]int // per type
}

// Messages of the relay's log that explain a duplicate.
const (
	msgNotRecorded = "relay: outcome not recorded; the message will be delivered again"
	msgInterrupted = "relay: send interrupted"
	msgStale       = "relay: outcome not recorded: the row changed while it was sent"
	msgPassFailed  = "relay: pass failed"
	msgPaused      = "relay: type paused"  // the start of the message
	msgResumed     = "relay: type resumed" // the start of the message
)

func newLogSink(next slog.Handler) *logSink {
	return &logSink{next: next, levels: map[slog.Level]int{}, messages: map[string]int{}, evidence: map[evKey][]evidence{},
		paused: map[string]int{}, resumed: map[string]int{}}
}

func (l *logSink) handler(replica int) slog.Handler {
	h := &sinkHandler{sink: l, replica: replica}
	if l.next != nil {
		h.next = l.next.WithAttrs([]slog.Attr{slog.Int("replica", replica)})
	}
	return h
}

func (l *logSink) observe(replica int, r slog.Record) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.levels[r.Level]++
	l.messages[r.Message]++
	if count := l.paused; strings.HasPrefix(r.Message, msgPaused) || strings.HasPrefix(r.Message, msgResumed) {
		if strings.HasPrefix(r.Message, msgResumed) {
			count = l.resumed
		}
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "type" {
				count[a.Value.String()]++
				return false
			}
			return true
		})
	}
	switch r.Message {
	case msgNotRecorded, msgInterrupted, msgStale:
		r.Attrs(func(a slog.Attr) bool {
			if a.Key == "id" {
				k := evKey{replica: replica, id: a.Value.Int64()}
				l.evidence[k] = append(l.evidence[k], evidence{at: r.Time, msg: r.Message})
				return false
			}
			return true
		})
	}
}

func (l *logSink) about(replica int, id int64) []evidence {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]evidence(nil), l.evidence[evKey{replica, id}]...)
}

type sinkHandler struct {
	sink    *logSink
	replica int
	next    slog.Handler
}

func (h *sinkHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h *sinkHandler) Handle(ctx context.Context, r slog.Record) error {
	h.sink.observe(h.replica, r)
	if h.next != nil && h.next.Enabled(ctx, r.Level) {
		return h.next.Handle(ctx, r)
	}
	return nil
}

func (h *sinkHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	c := *h
	if c.next != nil {
		c.next = c.next.WithAttrs(attrs)
	}
	return &c
}

func (h *sinkHandler) WithGroup(name string) slog.Handler {
	c := *h
	if c.next != nil {
		c.next = c.next.WithGroup(name)
	}
	return &c
}
