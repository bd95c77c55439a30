// Package pgserver gives tests, the demo program, the soak and the benchmark a
// throwaway PostgreSQL server, and optionally a PgBouncer in front of it, found
// or started the same way everywhere.
package pgserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strconv"
	"sync"
)

// settings are the server settings of every server this package starts:
// durability off for speed (unless Options.Durable), room for many connections.
var settings = []string{"fsync=off", "full_page_writes=off", "max_connections=300", "shared_buffers=128MB"}

// durableSettings are the settings of a server started with Options.Durable:
// fsync, full_page_writes and synchronous_commit keep PostgreSQL's defaults, so
// a commit costs what it costs in production.
var durableSettings = []string{"max_connections=300", "shared_buffers=128MB"}

// Options tune the server StartWith starts. The zero value is what Start starts.
type Options struct {
	// Durable keeps PostgreSQL's durability defaults (fsync on, full_page_writes
	// on, synchronous_commit on) instead of turning them off for speed: for
	// benchmarks, where a commit must cost a WAL flush. It does not apply to a
	// server given by the environment variable.
	Durable bool

	// TLS, for a local cluster ([StartLocal]), serves this certificate and
	// accepts TCP connections over TLS only; the Server's URL then verifies
	// it (sslmode=verify-full, sslrootcert its CA). Nil: no TLS.
	TLS *TLS
}

func (o Options) settings() []string {
	if o.Durable {
		return durableSettings
	}
	return settings
}

// Server is a running PostgreSQL that the caller owns.
type Server struct {
	URL  string // a postgres:// URL usable by pgx; for Kind "local" TCP on 127.0.0.1 with sslmode=disable
	Kind string // "env", "container" or "local"

	mu        sync.Mutex
	stopped   bool
	container func() error // Kind "container": removes it
	local     *cluster     // Kind "local"
}

// Start returns a throwaway server, trying in order:
//  1. the URL in the environment variable envVar, if envVar is not "" and the variable
//     is set and non-empty (Kind "env"; Stop leaves that server alone);
//  2. a container, if a container route is registered ([RegisterContainer], done by
//     importing github.com/xadm/relay/relaytest/container) and it finds a Docker
//     engine (Kind "container");
//  3. a fresh cluster from the local PostgreSQL binaries, listening on 127.0.0.1 on a
//     free port, run as the postgres OS user when the process runs as root (Kind "local").
//
// If none can be had, the error says what to install.
func Start(ctx context.Context, envVar string) (*Server, error) {
	return StartWith(ctx, envVar, Options{})
}

// StartWith is [Start] with options: a server it starts itself (a container or a
// local cluster) runs with opt's settings.
func StartWith(ctx context.Context, envVar string, opt Options) (*Server, error) {
	if opt.TLS != nil {
		return StartLocal(ctx, opt) // a server given or contained knows nothing of opt's certificate
	}
	if envVar != "" {
		if u := os.Getenv(envVar); u != "" {
			return &Server{URL: u, Kind: "env"}, nil
		}
	}
	s, ok, containerErr := startContainer(ctx, opt)
	if ok && containerErr == nil {
		return s, nil
	}
	if binDir := findBinDir(ctx); binDir != "" {
		return startLocalWith(ctx, binDir, opt)
	}
	if opt.TLS != nil {
		return nil, errors.New("pgserver: Options.TLS needs the local PostgreSQL binaries")
	}
	hint := "install the PostgreSQL server (Debian: apt-get install -y postgresql; " +
		"macOS: brew install postgresql@16; Windows: the EDB installer, or set PG_BIN to its bin directory), " +
		"or start a Docker engine and import github.com/xadm/relay/relaytest/container for its side effect"
	if envVar != "" {
		hint = "set " + envVar + ", " + hint
	}
	err := errors.New("no PostgreSQL for the tests: " + hint)
	if containerErr != nil {
		err = fmt.Errorf("%w; the Docker engine answered but the container failed: %w", err, containerErr)
	}
	return nil, err
}

// ContainerFunc starts a PostgreSQL server in a container, its server started
// with the given settings ("name=value", as for postgres -c), and returns its
// URL and a function that removes it. It returns ErrNoEngine if no container
// engine answers, and then the next route is tried.
type ContainerFunc func(ctx context.Context, settings []string) (url string, remove func() error, err error)

// ErrNoEngine is what a ContainerFunc returns when no container engine answers.
var ErrNoEngine = errors.New("pgserver: no container engine answers")

var containerRoute struct {
	mu sync.Mutex
	f  ContainerFunc
}

// RegisterContainer makes Start try f before the local binaries. It lives
// behind a module of its own (github.com/xadm/relay/relaytest/container), so
// that what imports this package does not depend on Docker's client libraries.
func RegisterContainer(f ContainerFunc) {
	containerRoute.mu.Lock()
	defer containerRoute.mu.Unlock()
	containerRoute.f = f
}

// startContainer runs PostgreSQL through the registered container route, if any:
// ok is false when there is none or it found no engine.
func startContainer(ctx context.Context, opt Options) (s *Server, ok bool, err error) {
	containerRoute.mu.Lock()
	f := containerRoute.f
	containerRoute.mu.Unlock()
	if f == nil {
		return nil, false, nil
	}
	u, remove, err := f(ctx, opt.settings())
	if errors.Is(err, ErrNoEngine) {
		return nil, false, nil
	}
	if err != nil {
		return nil, true, err
	}
	return &Server{URL: u, Kind: "container", container: remove}, true, nil
}

// Stop stops and removes what Start started: the container, or the local server
// and its data directory. It does nothing for Kind "env" and is safe to call twice.
func (s *Server) Stop() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopped {
		return nil
	}
	s.stopped = true
	switch {
	case s.container != nil:
		return s.container()
	case s.local != nil:
		return s.local.remove()
	}
	return nil
}

// Local reports whether the server is a local cluster this process controls
// (Kind "local"), which Halt and Resume need.
func (s *Server) Local() bool { return s.local != nil }

// Halt stops the local server at once, as pg_ctl stop -m immediate does, keeping its
// data, so a test can observe an outage. It returns an error for other Kinds.
func (s *Server) Halt() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.controllable(); err != nil {
		return err
	}
	s.local.halt()
	return nil
}

// Resume starts a halted local server again on the same port and waits until it
// accepts connections. It returns an error for other Kinds.
func (s *Server) Resume(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.controllable(); err != nil {
		return err
	}
	return s.local.start(ctx)
}

// controllable returns an error unless s is a local cluster that has not been stopped.
func (s *Server) controllable() error {
	switch {
	case s.local == nil:
		return fmt.Errorf("pgserver: a %q server cannot be halted or resumed, only a local one", s.Kind)
	case s.stopped:
		return errors.New("pgserver: the server was stopped")
	}
	return nil
}

// BinDir is the directory of the local PostgreSQL binaries (pgbench lives there),
// or "" for Kinds other than "local".
func (s *Server) BinDir() string {
	if s.local == nil {
		return ""
	}
	return s.local.binDir
}

// pgURL is the URL of database db as user on 127.0.0.1:port, without TLS.
func pgURL(user string, port int, db string) string {
	u := url.URL{
		Scheme:   "postgres",
		User:     url.User(user),
		Host:     net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
		Path:     "/" + db,
		RawQuery: "sslmode=disable",
	}
	return u.String()
}
