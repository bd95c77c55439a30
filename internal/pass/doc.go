// Package pass is the relay's one dispatch engine: a pass selects batches of
// deliverable rows outside any transaction, each type its share, in epochs
// (cursor.go), splits them by natural key and by type, hands the keys to at
// most Concurrency workers, calls each type's Sender and records each
// outcome. Run, RunIfElected and the loop's periodic
// pass all run it, under whatever election the relay holds; it takes its
// dependencies as one value (Deps) and knows nothing of the election. It
// reaches the database by one route, its Outbox (internal/store's, built
// once in relay.New), which selects, records and lends the connections the
// outcomes are written on.
//
// # Guarantees
//
//   - Per-key order (decision 0041): the relay never sends a message while
//     an older live message of its key, of a type it serves, is unsent, and
//     never two messages of a key at once, across types too. One rule for
//     every way a row can be missing from a batch (its type paused or left
//     out, its backoff, a lane's cursor past it, another type's share of the
//     batch, a late commit, a re-queue): the select holds back each row whose
//     key has an older live row the batch lacks (sql/pass.sql, held), and the
//     engine blocks that key for the rest of the epoch (cursor.go). A key
//     stops at its first message not sent.
//   - A send starts only when its outcome can be recorded: a worker holds the
//     connection its outcomes are written on before its first send.
//   - Every outcome is fenced on the state the pass read; a row that moved on
//     meanwhile is left alone.
//   - Never re-sent what could not be recorded: a message whose outcome could
//     not be written is held back by this process, 1s doubling up to 5 min.
//   - One type never holds up another (lanes.go, decision 0040): the workers
//     are shared fairly, a slow type leaves one to the others, and a type
//     whose sends keep failing is paused and probed.
//
// # Failure handling
//
// A failure, a timeout or a panic in a Sender marks only its row. A Send that
// ignores its context is given up 100 ms after its deadline, and another
// goroutine takes its worker's place; at Concurrency of them still running a
// type is paused. The pass starts nothing new once its context ends, its
// election's lease is no longer trusted (internal/lease), or an outcome could
// not be recorded; it returns once the messages in flight are recorded.
package pass
