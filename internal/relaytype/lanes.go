package relaytype

import "time"

// PausedType is a message type a relay has paused (Config.PauseAfter): its
// rows wait, with their status and attempts untouched, while the relay's
// other types go on (docs/decisions/0040-isolation.md).
type PausedType struct {
	Type   string
	Reason string    // why: the last failure, or the abandoned Sends still running
	Since  time.Time // when the first pause of this run of pauses began
	Until  time.Time // when one of its messages is next sent as a probe
	// Probing says the pause has ended and a message is being sent as a
	// probe: its success resumes the type.
	Probing bool
}

// StuckSends are one type's abandoned Sends still running on a relay: Sends
// that ignored their context, which the relay gave up on (their rows were
// marked failed) and whose goroutines have not returned yet.
type StuckSends struct {
	Type  string
	Sends int       // how many run now
	Since time.Time // since when the type has had some running, without a break
}
