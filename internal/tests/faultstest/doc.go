// Package faultstest holds the relay's fault tests that take the whole
// PostgreSQL server away (an outage, a restart right after a send). They run
// against a throwaway server of their own, started by the package's TestMain,
// so that halting it disturbs no other package's tests; the tests of this
// package run one at a time for the same reason.
//
// The fault tests that only kill the test's own sessions, and the PgBouncer
// tests, live with the root package's tests (faults_test.go).
package faultstest
