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
	"time"

	"github.com/moby/moby/client"
	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/modules/postgres"
)

// settings are the server settings of every server this package starts:
// durability off for speed, room for many connections.
var settings = []string{"fsync=off", "full_page_writes=off", "max_connections=300", "shared_buffers=128MB"}

// Server is a running PostgreSQL that the caller owns.
type Server struct {
	URL  string // a postgres:// URL usable by pgx; for Kind "local" TCP on 127.0.0.1 with sslmode=disable
	Kind string // "env", "container" or "local"

	mu        sync.Mutex
	stopped   bool
	container testcontainers.Container // Kind "container"
	local     *cluster                 // Kind "local"
}

// Start returns a throwaway server, trying in order:
//  1. the URL in the environment variable envVar, if envVar is not "" and the variable
//     is set and non-empty (Kind "env"; Stop leaves that server alone);
//  2. a "postgres:16-alpine" container through testcontainers-go, if a Docker engine
//     answers within two seconds (Kind "container");
//  3. a fresh cluster from the local PostgreSQL binaries, listening on 127.0.0.1 on a
//     free port, run as the postgres OS user when the process runs as root (Kind "local").
//
// If none can be had, the error says what to install.
func Start(ctx context.Context, envVar string) (*Server, error) {
	if envVar != "" {
		if u := os.Getenv(envVar); u != "" {
			return &Server{URL: u, Kind: "env"}, nil
		}
	}
	var containerErr error
	if dockerAnswers(ctx) {
		s, err := startContainer(ctx)
		if err == nil {
			return s, nil
		}
		containerErr = err
	}
	if binDir := findBinDir(ctx); binDir != "" {
		return startLocal(ctx, binDir)
	}
	hint := "start a Docker engine, or install the PostgreSQL server (Debian: apt-get install -y postgresql)"
	if envVar != "" {
		hint = "set " + envVar + ", " + hint
	}
	err := errors.New("no PostgreSQL for the tests: " + hint)
	if containerErr != nil {
		err = fmt.Errorf("%w; the Docker engine answered but the container failed: %w", err, containerErr)
	}
	return nil, err
}

// dockerAnswers reports whether a Docker engine answers a ping within two seconds.
func dockerAnswers(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	cli, err := testcontainers.NewDockerClientWithOpts(ctx)
	if err != nil {
		return false
	}
	defer cli.Close()
	_, err = cli.Ping(ctx, client.PingOptions{})
	return err == nil
}

// startContainer runs PostgreSQL in a container with the same settings as a local cluster.
func startContainer(ctx context.Context) (*Server, error) {
	cmd := []string{"postgres"}
	for _, s := range settings {
		cmd = append(cmd, "-c", s)
	}
	ctr, err := postgres.Run(ctx, "postgres:16-alpine",
		testcontainers.WithCmd(cmd...), postgres.BasicWaitStrategies())
	if err != nil {
		return nil, errors.Join(err, testcontainers.TerminateContainer(ctr))
	}
	u, err := ctr.ConnectionString(ctx, "sslmode=disable")
	if err != nil {
		return nil, errors.Join(err, testcontainers.TerminateContainer(ctr))
	}
	return &Server{URL: u, Kind: "container", container: ctr}, nil
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
		return testcontainers.TerminateContainer(s.container)
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
