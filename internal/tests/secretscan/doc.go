// Package secretscan proves, end to end, that no secret lands in a log, a
// row or a page: it plants an Authorization header, a signing secret and a
// database password in a relay, its inbox receiver, its console, relayctl
// and its OpenTelemetry spans, runs deliveries, failures and panics through
// them, and greps everything they wrote for the planted values.
//
// It is a module of its own because it joins the core, the console and the
// otel modules, which the core must not depend on. Nothing here is meant to
// be imported, and it is never published.
package secretscan
