package pass

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
)

// This file is the relay's account of stuck Sends: Sends that ignored their
// context past SendTimeout, which the relay gave up on (their messages failed
// with the context's cause) and whose goroutines have not returned. Each one
// holds its key: no other message of it is sent until the Send returns, so
// that two messages of a key are never in flight together (decision 0041);
// the type's other keys go on. They are bounded per relay (StuckSendsMax),
// since each holds a goroutine and its message: at the bound, the type whose
// Send reached it pauses, and probes again only once fewer run; its pause
// says so, and status is not OK while any run (decision 0040).

// stuckSends are a relay's stuck Sends, by key and by lane.
type stuckSends struct {
	max    int
	logger *slog.Logger

	mu     sync.Mutex
	byKey  map[string]int // key → its stuck Sends
	total  int
	warned bool // the bound was said to be reached, and not left since
}

func newStuckSends(max int, logger *slog.Logger) *stuckSends {
	return &stuckSends{max: max, logger: logger, byKey: map[string]int{}}
}

// holds reports whether key has a stuck Send: its messages wait.
func (s *stuckSends) holds(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.byKey[key] > 0
}

// full reports whether the relay runs its bound of stuck Sends.
func (s *stuckSends) full() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.total >= s.max
}

// add counts a Send of key, of lane l, given up while it runs, and pauses l
// when the relay reaches its bound.
func (s *stuckSends) add(l *lane, key string) {
	s.mu.Lock()
	s.byKey[key]++
	s.total++
	full, say := s.total >= s.max, false
	if full && !s.warned {
		s.warned, say = true, true
	}
	total := s.total
	s.mu.Unlock()
	l.abandoned(true)
	if say {
		s.logger.LogAttrs(context.Background(), slog.LevelError,
			"relay: the relay's bound of stuck Sends is reached: each holds a goroutine and its message; the type pauses until some return. "+
				"Its Sender ignores its context: fix it so that it returns when its context ends",
			slog.String("type", l.typ), slog.Int("stuck", total), slog.Int("stuck_sends_max", s.max))
	}
	if full {
		// internal/tools/diagnose reads a pause for stuck Sends by these words (stuckReason).
		l.pauseStuck(fmt.Sprintf("%d Sends ignored their context and still run, the relay's bound (StuckSendsMax): "+
			"its Sender must return when its context ends", total))
	}
}

// done says that a stuck Send of key, of lane l, returned at last.
func (s *stuckSends) done(l *lane, key string) {
	s.mu.Lock()
	if s.byKey[key]--; s.byKey[key] <= 0 {
		delete(s.byKey, key)
	}
	s.total--
	if s.total < s.max {
		s.warned = false
	}
	s.mu.Unlock()
	l.abandoned(false)
}
