package relay

// MissTransactionPoolingForTest makes r's check that its pool keeps its
// sessions find that it does without looking, as a check that missed a
// pooler would: what is left to protect the elections is that every statement
// on a lock's session acts only on its backend.
func MissTransactionPoolingForTest(r *Relay) {
	if r.sessions == nil {
		return // an election that takes no lock on the pool: nothing to check
	}
	r.sessions.MissForTest()
}
