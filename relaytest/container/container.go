// Package container lets [relaytest] (and relay's own test harness) start
// PostgreSQL in a Docker container through testcontainers-go. Import it for
// its side effect, in a test file:
//
//	import _ "github.com/xadm/relay/relaytest/container"
//
// Then, when RELAY_TEST_DATABASE_URL is not set and a Docker engine answers
// within two seconds, the test binary's server is a postgres:16-alpine
// container, removed when the tests end (or by testcontainers' reaper);
// otherwise relaytest falls back to the local PostgreSQL binaries as without
// it. It is a module of its own so that an adopter who imports only relaytest
// gets none of Docker's client libraries in its go.mod.
package container

import (
	"context"
	"errors"
	"time"

	"github.com/moby/moby/client"
	"github.com/testcontainers/testcontainers-go"
	"github.com/testcontainers/testcontainers-go/modules/postgres"

	"github.com/xadm/relay/internal/testkit/pgserver"
)

// Image is the PostgreSQL image the container runs.
const Image = "postgres:16-alpine"

func init() { pgserver.RegisterContainer(start) }

// start runs PostgreSQL in a container with the given server settings, or
// returns pgserver.ErrNoEngine if no Docker engine answers.
func start(ctx context.Context, settings []string) (string, func() error, error) {
	if !dockerAnswers(ctx) {
		return "", nil, pgserver.ErrNoEngine
	}
	cmd := []string{"postgres"}
	for _, s := range settings {
		cmd = append(cmd, "-c", s)
	}
	ctr, err := postgres.Run(ctx, Image, testcontainers.WithCmd(cmd...), postgres.BasicWaitStrategies())
	if err != nil {
		return "", nil, errors.Join(err, testcontainers.TerminateContainer(ctr))
	}
	u, err := ctr.ConnectionString(ctx, "sslmode=disable")
	if err != nil {
		return "", nil, errors.Join(err, testcontainers.TerminateContainer(ctr))
	}
	return u, func() error { return testcontainers.TerminateContainer(ctr) }, nil
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
