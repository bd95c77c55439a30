package main

import (
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"
)

// setEnv sets the service's variables for t: every one named in vars, and
// the others this test reads cleared, so that the machine's own environment
// does not leak in. Tests that set the environment cannot run in parallel.
func setEnv(t *testing.T, vars map[string]string) {
	t.Helper()
	for _, name := range []string{"DATABASE_URL", "DESTINATION_URL", "RELAY_TYPES", "LOG_LEVEL",
		"RELAY_APP_NAME", "RELAY_TABLE", "RELAY_INTERVAL", "RELAY_CONCURRENCY", "RELAY_CLUSTER_LOCK"} {
		t.Setenv(name, vars[name])
	}
}

func TestLoadConfig(t *testing.T) {
	t.Run("EveryMissingVariableAtOnce", func(t *testing.T) {
		setEnv(t, nil)
		_, err := loadConfig()
		require.Error(t, err)
		msg := err.Error()
		for _, want := range []string{
			"DATABASE_URL is not set",
			"DESTINATION_URL is not set",
			"RELAY_TYPES is not set",
		} {
			require.Contains(t, msg, want)
		}
		t.Logf("the service says:\n%s", msg)
	})

	t.Run("EveryMalformedVariableAtOnce", func(t *testing.T) {
		setEnv(t, map[string]string{
			"DATABASE_URL":      "postgres://localhost:notaport/db",
			"DESTINATION_URL":   "localhost:8080/relay",
			"RELAY_TYPES":       " , ",
			"RELAY_INTERVAL":    "5",
			"RELAY_CONCURRENCY": "many",
			"LOG_LEVEL":         "loud",
		})
		_, err := loadConfig()
		require.Error(t, err)
		msg := err.Error()
		for _, want := range []string{
			"DATABASE_URL: ",
			`DESTINATION_URL="localhost:8080/relay" is not an absolute http or https URL`,
			`RELAY_TYPES=" , " names no message type`,
			`RELAY_INTERVAL="5" is not a duration`,
			`RELAY_CONCURRENCY="many" is not an integer`,
			`LOG_LEVEL="loud"`,
		} {
			require.Contains(t, msg, want)
		}
		require.NotContains(t, msg, "is not set", "every variable is set, if badly")
		t.Logf("the service says:\n%s", msg)
	})

	t.Run("ATypeTheSenderRefuses", func(t *testing.T) {
		setEnv(t, map[string]string{
			"DATABASE_URL":    "postgres://localhost/db",
			"DESTINATION_URL": "http://localhost:8080/relay/",
			"RELAY_TYPES":     "order,in\nvoice",
		})
		_, err := loadConfig()
		require.ErrorContains(t, err, "RELAY_TYPES: ")
		require.ErrorContains(t, err, "control characters")
	})

	t.Run("Complete", func(t *testing.T) {
		setEnv(t, map[string]string{
			"DATABASE_URL":      "postgres://postgres@localhost:5432/postgres?pool_max_conns=3",
			"DESTINATION_URL":   "http://localhost:8080/relay/",
			"RELAY_TYPES":       " order, invoice ,,",
			"RELAY_APP_NAME":    "billing",
			"RELAY_CONCURRENCY": "4",
			"LOG_LEVEL":         "debug",
		})
		c, err := loadConfig()
		require.NoError(t, err)
		require.Equal(t, "billing", c.relay.AppName)
		require.Equal(t, "http://localhost:8080/relay", c.destination)
		require.Len(t, c.senders, 2)
		require.Equal(t, "order", c.senders[0].Type())
		require.Equal(t, "invoice", c.senders[1].Type())
		require.Equal(t, slog.LevelDebug, c.logLevel)
		require.EqualValues(t, 6, c.pool.MaxConns, "raised to Concurrency + 2")
	})
}
