package main

import (
	"cmp"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/xadm/relay"
)

// config is everything the service reads from the environment.
type config struct {
	relay    relay.Config
	pool     *pgxpool.Config
	senders  []relay.Sender
	logLevel slog.Level
	// destination is DESTINATION_URL without a trailing slash, for the start-up log.
	destination string
}

// loadConfig reads the environment: DATABASE_URL, DESTINATION_URL, RELAY_TYPES,
// LOG_LEVEL and the RELAY_* variables of [relay.ConfigFromEnv]. It checks them
// all before it returns, so that one run names every variable that is missing
// or malformed, each on a line of its own with what it wants.
func loadConfig() (config, error) {
	var (
		c    config
		errs []error
		err  error
	)
	switch dbURL := env("DATABASE_URL"); {
	case dbURL == "":
		errs = append(errs, errors.New("DATABASE_URL is not set: the PostgreSQL the outbox table lives in, "+
			"as in postgres://postgres:secret@localhost:5432/postgres"))
	default:
		if c.pool, err = pgxpool.ParseConfig(dbURL); err != nil {
			errs = append(errs, fmt.Errorf("DATABASE_URL: %w", err))
		}
	}

	base := env("DESTINATION_URL")
	switch u, err := url.Parse(base); {
	case base == "":
		errs = append(errs, errors.New("DESTINATION_URL is not set: the base URL of the receiving service, "+
			"as in http://localhost:8080/relay; a message of type T and natural key K is delivered by PUT DESTINATION_URL/T/K"))
	case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "":
		errs = append(errs, fmt.Errorf("DESTINATION_URL=%q is not an absolute http or https URL, as in http://localhost:8080/relay", base))
		base = ""
	}
	c.destination = strings.TrimRight(base, "/")

	var types []string
	for _, typ := range strings.Split(env("RELAY_TYPES"), ",") {
		if typ = strings.TrimSpace(typ); typ != "" {
			types = append(types, typ)
		}
	}
	if len(types) == 0 {
		what := " is not set"
		if v := os.Getenv("RELAY_TYPES"); v != "" {
			what = fmt.Sprintf("=%q names no message type", v)
		}
		errs = append(errs, fmt.Errorf("RELAY_TYPES%s: the message types this service delivers, "+
			"comma-separated, as in order,invoice (the relay drains only these)", what))
	}
	for _, typ := range types {
		// One sender per type, delivering to DESTINATION_URL/<type>/<key>.
		// Without a valid base URL the types are still checked, on a stand-in.
		s, err := relay.NewHTTPSender(relay.HTTPSenderConfig{
			Type: typ,
			URL:  relay.URLWithKey(cmp.Or(c.destination, "http://destination.invalid") + "/" + url.PathEscape(typ)),
		})
		if err != nil {
			errs = append(errs, fmt.Errorf("RELAY_TYPES: %w", err))
			continue
		}
		c.senders = append(c.senders, s)
	}

	if c.relay, err = relay.ConfigFromEnv(); err != nil {
		errs = append(errs, err)
	}

	if lvl := env("LOG_LEVEL"); lvl != "" {
		if err := c.logLevel.UnmarshalText([]byte(lvl)); err != nil {
			errs = append(errs, fmt.Errorf("LOG_LEVEL=%q is not debug, info, warn or error", lvl))
		}
	}

	if len(errs) > 0 {
		return config{}, &configError{errs: errs}
	}
	// The relay needs Concurrency + 2 connections (docs/operations.md): the
	// election holds one for the whole pass, the select another, and each
	// message in flight records its outcome on one more.
	c.pool.MaxConns = max(c.pool.MaxConns, int32(c.relay.Concurrency)+2)
	return c, nil
}

// configError is every problem loadConfig found, one per line.
type configError struct{ errs []error }

func (e *configError) Error() string {
	var b strings.Builder
	b.WriteString("the environment does not configure the service:")
	for _, err := range e.errs {
		// relay.ConfigFromEnv joins its own errors: one line each.
		for line := range strings.SplitSeq(err.Error(), "\n") {
			b.WriteString("\n  - " + line)
		}
	}
	b.WriteString("\nexamples/service/main.go documents every variable; the README's \"Run it against your endpoint\" is a walk-through.")
	return b.String()
}

func (e *configError) Unwrap() []error { return e.errs }

// env returns the variable name, without surrounding blanks.
func env(name string) string { return strings.TrimSpace(os.Getenv(name)) }
