package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/xadm/relay"
	"github.com/xadm/relay/inbox"
)

// childEnv carries a child process's config, as JSON: a process started with
// it set runs as that child instead of as the soak (see maybeChild).
const childEnv = "INBOXSOAK_CHILD"

// childConfig is what a child process runs.
type childConfig struct {
	Role string // "relay" or "receiver"
	Name string // the replica's name: its sessions' application_name

	// A relay replica's.
	ProducerURL string
	Table       string // the outbox table
	App         string // the election's app name
	Destination string // the proxy's base URL
	Trace       bool   // log each send and each request on stderr

	// The receiver's.
	ReceiverURL string
	Addr        string        // host:port to listen on, the same after a restart
	OrderInbox  string        // the inbox's table for order (with the stale-drop)
	LedgerInbox string        // the inbox's table for ledger (KeepStale)
	Effects     string        // the receiver's tables, quoted: one row per effect,
	Keys        string        // and one per key: order's state and ledger's sum
	PurgeAge    time.Duration // 0: order's inbox records are never purged
	AnswerDelay time.Duration // between the commit and the answer
}

// maybeChild runs this process as a child if childEnv says so, and then
// exits; otherwise it returns at once.
func maybeChild() {
	raw := os.Getenv(childEnv)
	if raw == "" {
		return
	}
	var cfg childConfig
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "inboxsoak child:", err)
		os.Exit(2)
	}
	// The parent holds the other end of stdin: when it dies, however it
	// dies, the child follows.
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		os.Exit(3)
	}()
	var err error
	switch cfg.Role {
	case "relay":
		err = runRelayChild(cfg)
	case "receiver":
		err = runReceiverChild(cfg)
	default:
		err = fmt.Errorf("unknown role %q", cfg.Role)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "inboxsoak %s %s: %v\n", cfg.Role, cfg.Name, err)
		os.Exit(1)
	}
	os.Exit(0)
}

// childPool opens a pool whose sessions are named name.
func childPool(ctx context.Context, url, name string, maxConns int32) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	pc.MaxConns = maxConns
	pc.ConnConfig.RuntimeParams["application_name"] = name
	return pgxpool.NewWithConfig(ctx, pc)
}

// relayConfig is the config of every replica, and of the soak's Admin.
func relayConfig(table, app string) relay.Config {
	cfg := relay.DefaultConfig()
	cfg.AppName = app
	cfg.Table = table
	cfg.Interval = 50 * time.Millisecond
	cfg.BatchSize = 50
	cfg.Concurrency = 4
	cfg.RetryBackoff = 0        // a failed message is retried at the next pass
	cfg.MaxAttempts = 1_000_000 // outages are expected: no message may die
	// The default, said: a type whose Sends fail 5 times in a row pauses for
	// 5s, then a probe resumes it. With the retries at every pass, the
	// receiver's 503s pause a type within a pass or two.
	cfg.PauseAfter = 5
	cfg.SendTimeout = 3 * time.Second // above the sender's own Timeout
	return cfg
}

// runRelayChild runs one relay replica until SIGTERM (a graceful Stop: its
// election passes to another replica) or SIGKILL. It registers one sender
// per type, each to its own path of the receiver.
func runRelayChild(cfg childConfig) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	pool, err := childPool(ctx, cfg.ProducerURL, cfg.Name, 8)
	if err != nil {
		return err
	}
	defer pool.Close()
	var senders []relay.Sender
	for _, typ := range msgTypes {
		// Timeout 1s: a request whose connection was cut silently is given
		// up on and sent again, on a new connection, within a second.
		sender, err := relay.NewHTTPSender(relay.HTTPSenderConfig{
			Type:    typ,
			URL:     relay.URLWithKey(cfg.Destination + "/" + typ),
			Timeout: time.Second,
			Header:  http.Header{"Soak-Replica": {cfg.Name}},
		})
		if err != nil {
			return err
		}
		var s relay.Sender = sender
		if cfg.Trace {
			s = relay.SenderFunc(typ, func(ctx context.Context, m relay.Message) error {
				fmt.Fprintf(os.Stderr, "%s send %d %s key %s attempt %d\n", time.Now().Format("15:04:05.000000"), m.ID, m.Type, m.Key, m.Attempts+1)
				err := sender.Send(ctx, m)
				fmt.Fprintf(os.Stderr, "%s sent %d %s key %s attempt %d: %v\n", time.Now().Format("15:04:05.000000"), m.ID, m.Type, m.Key, m.Attempts+1, err)
				return err
			})
		}
		senders = append(senders, s)
	}
	rcfg := relayConfig(cfg.Table, cfg.App)
	rcfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	r, err := relay.New(pool, rcfg, senders...)
	if err != nil {
		return err
	}
	if err := r.Start(context.WithoutCancel(ctx)); err != nil {
		return err
	}
	<-ctx.Done()
	stopCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return r.Stop(stopCtx)
}

// runReceiverChild runs the receiving service on Addr: PUT /order/{key} on
// an inbox with the stale-drop (it keeps each key's newest state) and PUT
// /ledger/{key} on one with KeepStale (it adds each message's amount to its
// key's sum). Every effect writes a row of Effects, and the answer is
// printed as one line per answered message ("<outcome> <Idempotency-Key>
// <replica> <type>") on stdout, which the soak counts; it answers
// AnswerDelay after its commit. POST /crash arms it: it then dies (SIGKILL)
// after the next commit of an applied message, before its answer. POST
// /fail?type=T&for=D makes it answer 503 to every message of type T (or of
// "all") for D, applying nothing.
func runReceiverChild(cfg childConfig) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	pool, err := childPool(ctx, cfg.ReceiverURL, cfg.Name, 8)
	if err != nil {
		return err
	}
	defer pool.Close()
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	orderInbox, err := inbox.New(pool, inbox.Config{Table: cfg.OrderInbox, Logger: logger})
	if err != nil {
		return err
	}
	ledgerInbox, err := inbox.New(pool, inbox.Config{Table: cfg.LedgerInbox, KeepStale: true, Logger: logger})
	if err != nil {
		return err
	}
	// Every effect takes its key's row of Keys first, whatever its type: a
	// key's effects commit one at a time, and the seq of Effects, drawn
	// after, is the order in which they were applied.
	setState := "INSERT INTO " + cfg.Keys + " AS k (message_key, order_id) VALUES ($1, $2) " +
		"ON CONFLICT (message_key) DO UPDATE SET order_id = excluded.order_id"
	addAmount := "INSERT INTO " + cfg.Keys + " AS k (message_key, ledger_sum, ledger_count) VALUES ($1, $2, 1) " +
		"ON CONFLICT (message_key) DO UPDATE SET ledger_sum = k.ledger_sum + excluded.ledger_sum, ledger_count = k.ledger_count + 1"
	insertEffect := "INSERT INTO " + cfg.Effects + " (message_id, message_key, type, amount) VALUES ($1, $2, $3, $4)"
	applyOrder := func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		// No comparison of ids: the inbox applies no message older than its
		// key's state. Were it to, the state would go back, and the soak
		// would see it.
		if _, err := tx.Exec(ctx, setState, m.Key, m.ID); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, insertEffect, m.ID, m.Key, typeOrder, 0)
		return err
	}
	applyLedger := func(ctx context.Context, tx pgx.Tx, m inbox.Message) error {
		amount, err := ledgerAmount(m.Body)
		if err != nil {
			return relay.Permanent(err)
		}
		if _, err := tx.Exec(ctx, addAmount, m.Key, amount); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, insertEffect, m.ID, m.Key, typeLedger, amount)
		return err
	}

	var crash atomic.Bool
	var fail failWindows
	var out sync.Mutex
	mux := http.NewServeMux()
	mux.HandleFunc("POST /crash", func(w http.ResponseWriter, _ *http.Request) {
		crash.Store(true)
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("POST /fail", func(w http.ResponseWriter, r *http.Request) {
		d, err := time.ParseDuration(r.URL.Query().Get("for"))
		if err != nil || d < 0 {
			http.Error(w, "for: want a duration", http.StatusBadRequest)
			return
		}
		if err := fail.set(r.URL.Query().Get("type"), d); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	serve := func(typ string, handler http.Handler) {
		mux.HandleFunc("PUT /"+typ+"/{key}", func(w http.ResponseWriter, r *http.Request) {
			if cfg.Trace {
				fmt.Fprintf(os.Stderr, "%s request %s %s key %s attempt %s from %s\n", time.Now().Format("15:04:05.000000"),
					r.Header.Get("Idempotency-Key"), typ, r.PathValue("key"), r.Header.Get("Relay-Attempt"), r.Header.Get("Soak-Replica"))
			}
			a := &answer{ResponseWriter: w, before: func(status int) {
				outcome := w.Header().Get(inbox.HeaderOutcome)
				if outcome == "" {
					outcome = fmt.Sprint(status)
				}
				out.Lock()
				fmt.Fprintf(os.Stdout, "%s %s %s %s\n", outcome, r.Header.Get("Idempotency-Key"), r.Header.Get("Soak-Replica"), typ)
				out.Unlock()
				if outcome == "applied" && crash.Load() {
					// Committed, not answered: the relay learns nothing and
					// delivers the message again.
					self, _ := os.FindProcess(os.Getpid())
					_ = self.Kill()
					select {}
				}
				// Work a service does after its commit (a log, a metric): a
				// relay killed meanwhile never hears the answer.
				time.Sleep(cfg.AnswerDelay)
			}}
			if fail.now(typ) {
				http.Error(a, "inboxsoak: the receiver fails "+typ+" on purpose", http.StatusServiceUnavailable)
				return
			}
			handler.ServeHTTP(a, r)
		})
	}
	serve(typeOrder, orderInbox.Handler(applyOrder))
	serve(typeLedger, ledgerInbox.Handler(applyLedger))

	if cfg.PurgeAge > 0 {
		sched, err := relay.NewScheduler(pool, relay.SchedulerConfig{Logger: logger, Tolerance: time.Second})
		if err != nil {
			return err
		}
		// Order's records only: its stale-drop keeps a re-delivery whose
		// record was purged from being applied again. Ledger's KeepStale
		// relies on its records alone, kept for as long as a message can
		// come back (docs/receivers.md).
		if err := sched.Add(cfg.OrderInbox+"_retention", "@every 1s", orderInbox.RetentionJob(cfg.PurgeAge)); err != nil {
			return err
		}
		if err := sched.Start(context.WithoutCancel(ctx)); err != nil {
			return err
		}
		defer func() {
			stopCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = sched.Stop(stopCtx)
		}()
	}

	ln, err := net.Listen("tcp", cfg.Addr)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 30 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	fmt.Fprintln(os.Stdout, "listening")
	select {
	case <-ctx.Done():
	case err := <-served:
		return err
	}
	stopCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(stopCtx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// failWindows are the receiver's failures on purpose: until when it answers
// 503 to each type.
type failWindows struct {
	mu    sync.Mutex
	until map[string]time.Time
}

// set makes the receiver fail typ ("all": every type) for d from now.
func (f *failWindows) set(typ string, d time.Duration) error {
	types := []string{typ}
	switch {
	case typ == "all":
		types = msgTypes
	case !slices.Contains(msgTypes, typ):
		return fmt.Errorf("type: want one of %v or all, got %q", msgTypes, typ)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.until == nil {
		f.until = map[string]time.Time{}
	}
	for _, t := range types {
		f.until[t] = time.Now().Add(d)
	}
	return nil
}

// now reports whether the receiver fails typ now.
func (f *failWindows) now(typ string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return time.Now().Before(f.until[typ])
}

// answer calls before with the status, once, before the status is written.
type answer struct {
	http.ResponseWriter
	before func(status int)
	done   bool
}

func (a *answer) WriteHeader(status int) {
	if !a.done {
		a.done = true
		a.before(status)
	}
	a.ResponseWriter.WriteHeader(status)
}

func (a *answer) Write(p []byte) (int, error) {
	if !a.done {
		a.WriteHeader(http.StatusOK)
	}
	return a.ResponseWriter.Write(p)
}

// startChild starts this program's binary as the child cfg describes; its
// stdin is a pipe the child watches, its stdout and stderr go to the given
// writers.
func startChild(cfg childConfig, stdout, stderr io.Writer) (*exec.Cmd, io.WriteCloser, error) {
	raw, err := json.Marshal(cfg)
	if err != nil {
		return nil, nil, err
	}
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), childEnv+"="+string(raw))
	cmd.Stdout, cmd.Stderr = stdout, stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, nil, err
	}
	return cmd, stdin, nil
}
