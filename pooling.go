package relay

import "github.com/xadm/relay/internal/store"

// ErrTransactionPooling says the pool does not keep a session between
// statements: a pooler in transaction or statement mode (PgBouncer's
// pool_mode=transaction) sits between the relay and PostgreSQL. Session
// advisory locks, and so every election, need pool_mode=session or a direct
// connection; the relay refuses to elect instead (Start fails, RunIfElected,
// partitioned passes and Scheduler jobs return it) and delivers nothing under
// an election (internal/session checks the pool once, before its first).
var ErrTransactionPooling = store.ErrTransactionPooling
