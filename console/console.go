// Package console is an operator's web console for relay: an [http.Handler]
// that a service mounts on its own mux to see, per app and table, the rows by
// type and status, the lag, the dead rows, who holds the election, this
// process's relay statistics, and why nothing is delivered when nothing is;
// and, when the service opts in, to re-queue dead rows and purge the
// delivered history.
//
// Pages are rendered on the server with html/template: no JavaScript, no
// build step. Every page reads only the live rows, through their partial
// indexes, and estimates the SENT history on a large table, so that a table of
// millions of rows renders as fast as a small one.
//
//	admin, err := relay.NewAdmin(pool, cfg) // the relays' own Config
//	c, err := console.New(console.Options{
//		Sources:   []console.Source{{Admin: admin, Relay: r}},
//		Actions:   true,
//		Authorize: func(r *http.Request) (who string, canSee, canAct bool) { ... },
//	})
//	mux.Handle("/relay/", http.StripPrefix("/relay", c))
//
// # Security
//
// The console is read-only unless [Options.Actions] is set, and then
// [Options.Authorize] must say who may act. Actions are POSTs refused when
// they come from another origin (the browser's Sec-Fetch-Site and Origin
// headers, through [http.CrossOriginProtection]) or without the session's
// token, a random value kept in a SameSite=Strict cookie and repeated in every
// form. Every action, and every refused one, is logged with who asked and
// what it changed.
package console

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"html/template"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/xadm/relay"
	"github.com/xadm/relay/internal/tools/diagnose"
)

// Source is one app and table the console shows.
type Source struct {
	// Admin reads and operates the table; build it from the relays' own
	// Config, so that it agrees with them on the ceiling. Required.
	Admin *relay.Admin
	// Relay, if set, is this process's relay of that app and table: the
	// console shows its Stats. nil shows none.
	Relay *relay.Relay
}

// Options configure a [Console].
type Options struct {
	// Sources are the apps and tables to show, at least one; the first is
	// the front page's.
	Sources []Source

	// Actions lets operators re-queue dead rows and purge SENT rows from the
	// console. Defaults to false: the console only shows.
	Actions bool

	// Authorize decides, for each request, who is asking (for the log) and
	// whether they may see the console and act on it. canAct matters only
	// with Actions. Required with Actions. nil (without Actions) lets every
	// request that reaches the handler see, as "anonymous": mount it behind
	// the service's own authentication.
	Authorize func(r *http.Request) (who string, canSee, canAct bool)

	// Prefix is the path the console is mounted at, such as "/relay", when
	// the mux hands it requests with that prefix (mux.Handle("/relay/", c));
	// the console strips it. Defaults to "": mounted at the root, or behind
	// http.StripPrefix. Links are relative either way.
	Prefix string

	// TrustedOrigins are origins ("https://ops.example.com") allowed to post
	// actions although they differ from the console's own, as when a proxy
	// rewrites Host. Defaults to none.
	TrustedOrigins []string

	// PageSize is how many dead rows a page shows. Defaults to 50, at most
	// [relay.ListDeadMax].
	PageSize int

	// StallAfter is how long a row may wait, without moving, before the
	// console says delivery is stalled. Defaults to 1m.
	StallAfter time.Duration

	// Logger receives a record of every action and every refused one.
	// Defaults to [slog.Default].
	Logger *slog.Logger
}

// Console is the operator's console: an [http.Handler]. Build it with [New].
type Console struct {
	opts    Options
	logger  *slog.Logger
	cop     *http.CrossOriginProtection
	pages   map[string]*template.Template
	mux     *http.ServeMux
	sources []*source
}

// source is a Source with the console's memory of its last look.
type source struct {
	Source
	mu      sync.Mutex
	last    *diagnose.Look
	samples []statSample // this process's relay's Stats at the views of the last hour, oldest first

	history   relay.History // the charts' last read, reused for historyFresh
	historyAt time.Time
}

// historyFresh is how long the charts page reuses its last read of the
// table: the pictures are by the minute, and a busy table's hour is tens of
// thousands of rows to read again.
const historyFresh = 10 * time.Second

// cachedHistory returns the source's history of the last hour, read again
// when the last read is older than historyFresh.
func (s *source) cachedHistory(ctx context.Context, now time.Time) (relay.History, bool, error) {
	s.mu.Lock()
	h, at := s.history, s.historyAt
	s.mu.Unlock()
	if !at.IsZero() && now.Sub(at) < historyFresh {
		return h, true, nil
	}
	h, err := s.Admin.History(ctx, chartWindow, chartStep)
	if err != nil {
		return h, false, err
	}
	s.mu.Lock()
	s.history, s.historyAt = h, now
	s.mu.Unlock()
	return h, false, nil
}

// statSample is this process's relay's Stats.Sent at a view of the console.
type statSample struct {
	at   time.Time
	sent int64
}

// sampleEvery is how often, at most, the console keeps a sample of Stats.
const sampleEvery = 10 * time.Second

// sample keeps st.Sent at now (at most one sample every sampleEvery, for an
// hour) and returns the samples.
func (s *source) sample(st relay.Stats, now time.Time) []statSample {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n := len(s.samples); n == 0 || now.Sub(s.samples[n-1].at) >= sampleEvery || st.Sent < s.samples[n-1].sent {
		s.samples = append(s.samples, statSample{at: now, sent: st.Sent})
	}
	for len(s.samples) > 0 && now.Sub(s.samples[0].at) > chartWindow {
		s.samples = s.samples[1:]
	}
	return append([]statSample(nil), s.samples...)
}

// lookMemory is how long a look stays the "earlier look" that tells whether
// rows move.
const lookMemory = 10 * time.Minute

//go:embed templates/*.html
var templateFS embed.FS

// New returns a console for opts. It refuses options it cannot honour: no
// sources, a nil Admin, Actions without Authorize, a bad trusted origin.
func New(opts Options) (*Console, error) {
	if len(opts.Sources) == 0 {
		return nil, errors.New("console: Options.Sources is empty: give at least one Source{Admin: ...}")
	}
	c := &Console{opts: opts, logger: opts.Logger, cop: http.NewCrossOriginProtection()}
	for i, s := range opts.Sources {
		if s.Admin == nil {
			return nil, fmt.Errorf("console: Options.Sources[%d].Admin is nil: build one with relay.NewAdmin", i)
		}
		c.sources = append(c.sources, &source{Source: s})
	}
	if opts.Actions && opts.Authorize == nil {
		return nil, errors.New("console: Options.Actions needs Options.Authorize, to decide who may act")
	}
	if opts.Prefix != "" && (!strings.HasPrefix(opts.Prefix, "/") || strings.HasSuffix(opts.Prefix, "/")) {
		return nil, fmt.Errorf("console: Options.Prefix %q must start with / and not end with one, as in /relay", opts.Prefix)
	}
	for _, o := range opts.TrustedOrigins {
		if err := c.cop.AddTrustedOrigin(o); err != nil {
			return nil, fmt.Errorf("console: Options.TrustedOrigins: %w", err)
		}
	}
	if c.opts.PageSize == 0 {
		c.opts.PageSize = relay.DeadPageDefault
	}
	if c.opts.PageSize < 1 || c.opts.PageSize > relay.ListDeadMax {
		return nil, fmt.Errorf("console: Options.PageSize must be between 1 and %d, got %d", relay.ListDeadMax, c.opts.PageSize)
	}
	if c.opts.StallAfter < 0 {
		return nil, fmt.Errorf("console: Options.StallAfter must not be negative, got %s", c.opts.StallAfter)
	}
	if c.opts.StallAfter == 0 {
		c.opts.StallAfter = diagnose.StallAfterDefault
	}
	if c.logger == nil {
		c.logger = slog.Default()
	}
	c.logger = c.logger.With(slog.String("component", "relay console"))
	c.cop.SetDenyHandler(http.HandlerFunc(c.crossOrigin))

	var err error
	if c.pages, err = parseTemplates(); err != nil {
		return nil, err
	}
	c.mux = http.NewServeMux()
	c.mux.HandleFunc("GET /{$}", c.index)
	c.mux.HandleFunc("GET /app", c.app)
	c.mux.HandleFunc("GET /dead", c.dead)
	c.mux.HandleFunc("GET /charts", c.charts)
	c.mux.HandleFunc("POST /requeue", c.requeue)
	c.mux.HandleFunc("POST /purge", c.purge)
	return c, nil
}

// ServeHTTP implements [http.Handler].
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if c.opts.Prefix != "" {
		rest, ok := strings.CutPrefix(r.URL.Path, c.opts.Prefix)
		if !ok || rest != "" && !strings.HasPrefix(rest, "/") {
			http.NotFound(w, r)
			return
		}
		r2 := new(http.Request)
		*r2 = *r
		u := *r.URL
		u.Path, u.RawPath = rest, ""
		if u.Path == "" {
			u.Path = "/"
		}
		r2.URL = &u
		r = r2
	}
	who, canSee, canAct := "anonymous", true, false
	if c.opts.Authorize != nil {
		who, canSee, canAct = c.opts.Authorize(r)
	}
	if !canSee {
		c.logger.LogAttrs(r.Context(), slog.LevelWarn, "relay console: refused: may not see",
			slog.String("who", who), slog.String("method", r.Method), slog.String("path", r.URL.Path), slog.String("remote", r.RemoteAddr))
		c.errorPage(w, r, http.StatusForbidden, "You may not see this console.", who)
		return
	}
	ctx := withViewer(r.Context(), viewer{who: who, canAct: canAct && c.opts.Actions, token: c.token(w, r)})
	c.cop.Handler(c.mux).ServeHTTP(w, r.WithContext(ctx))
}

// crossOrigin answers an action that came from another origin.
func (c *Console) crossOrigin(w http.ResponseWriter, r *http.Request) {
	who := "anonymous"
	if c.opts.Authorize != nil {
		who, _, _ = c.opts.Authorize(r)
	}
	c.logger.LogAttrs(r.Context(), slog.LevelWarn, "relay console: refused: cross-origin request",
		slog.String("who", who), slog.String("path", r.URL.Path), slog.String("origin", r.Header.Get("Origin")),
		slog.String("sec_fetch_site", r.Header.Get("Sec-Fetch-Site")), slog.String("remote", r.RemoteAddr))
	c.errorPage(w, r, http.StatusForbidden, "Refused: this action came from another site. Use the console's own page.", who)
}

// tokenCookie holds the session's token; forms repeat it.
const tokenCookie = "relay_console_token"

// token returns the session's token, setting a new one when the request has none.
func (c *Console) token(w http.ResponseWriter, r *http.Request) string {
	if ck, err := r.Cookie(tokenCookie); err == nil && len(ck.Value) == 64 {
		return ck.Value
	}
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	t := hex.EncodeToString(b)
	// No Path: the browser scopes it to the console's own directory.
	http.SetCookie(w, &http.Cookie{Name: tokenCookie, Value: t, HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
	return t
}

// tokenOK says the form's token is the session's.
func tokenOK(r *http.Request) bool {
	ck, err := r.Cookie(tokenCookie)
	if err != nil || len(ck.Value) != 64 {
		return false
	}
	return subtle.ConstantTimeCompare([]byte(ck.Value), []byte(r.PostFormValue("token"))) == 1
}
