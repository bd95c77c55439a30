package relaytype

// Outcome is what became of one message a pass took: the kind of outcome its
// row was recorded with (relay.Outcome, whose constants are these).
type Outcome string

// The outcomes of a message.
const (
	// OutcomeInterrupted: the pass was cancelled mid-send; nothing is
	// recorded, and the row stays as read.
	OutcomeInterrupted Outcome = ""
	OutcomeSent        Outcome = "SENT"  // delivered and recorded SENT
	OutcomeError       Outcome = "ERROR" // failed, recorded ERROR below the ceiling: a later pass retries it
	OutcomeDead        Outcome = "DEAD"  // failed at the ceiling, refused as permanent, or undeliverable: recorded ERROR at the ceiling, dead until re-queued
)

// Delivered says o is a delivery: its key's next message may follow in the
// same pass, its type is healthy, and no failure text is written.
func (o Outcome) Delivered() bool { return o == OutcomeSent }

// Status is the status column o writes: SENT, or ERROR (a dead row is an
// ERROR row at the ceiling); "" for OutcomeInterrupted, which writes nothing.
func (o Outcome) Status() string {
	switch o {
	case OutcomeSent:
		return "SENT"
	case OutcomeError, OutcomeDead:
		return "ERROR"
	}
	return ""
}

// Attempts is the attempts column o writes over a row read with read
// attempts (a NULL read as 0), under the ceiling maxAttempts: a dead row is
// written at the ceiling at least, so that it is dead by the table's own rule
// (ERROR and attempts >= MaxAttempts), which the JVM relay shares.
func (o Outcome) Attempts(read int64, maxAttempts int) int64 {
	switch o {
	case OutcomeSent:
		return read
	case OutcomeDead:
		return max(read+1, int64(maxAttempts))
	default:
		return read + 1
	}
}

// Counts are how many outcomes of each kind were recorded.
type Counts struct {
	Sent   int // recorded SENT
	Failed int // recorded ERROR below the ceiling
	Dead   int // recorded dead
}

// Add counts one recorded outcome o.
func (c *Counts) Add(o Outcome) {
	switch o {
	case OutcomeSent:
		c.Sent++
	case OutcomeError:
		c.Failed++
	case OutcomeDead:
		c.Dead++
	}
}

// Processed is how many rows were recorded, whatever their outcome.
func (c Counts) Processed() int { return c.Sent + c.Failed + c.Dead }
