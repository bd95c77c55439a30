package natsjs

import (
	"errors"
	"regexp"
	"strconv"
	"sync"

	"github.com/nats-io/nats.go"
)

// A NATS server answers a publish to a subject the client may not publish to
// with an asynchronous "-ERR 'Permissions Violation for Publish to "subj"'"
// instead of an acknowledgement, and nats.go hands it to the connection's
// error handler (nats.ErrPermissionViolation). Left alone, such a publish
// would wait for its deadline and look like a slow server. denials listens to
// the error handler and wakes up the batches waiting on the denied subject.
type denials struct {
	mu      sync.Mutex
	watches map[*watch]struct{}
}

// watchDenials chains a handler onto nc's error handler; the handler set
// before still runs after it.
func watchDenials(nc *nats.Conn) *denials {
	d := &denials{watches: make(map[*watch]struct{})}
	prev := nc.ErrorHandler()
	nc.SetErrorHandler(func(c *nats.Conn, sub *nats.Subscription, err error) {
		if subj := deniedSubject(err); subj != "" {
			d.deny(subj, err)
		}
		if prev != nil {
			prev(c, sub, err)
		}
	})
	return d
}

var deniedRe = regexp.MustCompile(`(?i)publish to ("(?:[^"\\]|\\.)*")`)

// deniedSubject is the subject err says the server refused a publish to, or "".
func deniedSubject(err error) string {
	if !errors.Is(err, nats.ErrPermissionViolation) {
		return ""
	}
	m := deniedRe.FindStringSubmatch(err.Error())
	if m == nil {
		return ""
	}
	subj, uerr := strconv.Unquote(m[1])
	if uerr != nil {
		return ""
	}
	return subj
}

// deny tells every batch waiting now that the server refused subj.
func (d *denials) deny(subj string, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for w := range d.watches {
		w.mu.Lock()
		if w.refused == nil {
			w.refused = make(map[string]error)
		}
		w.refused[subj] = err
		w.mu.Unlock()
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
}

// watch is one batch's view of the denials that arrive while it waits.
type watch struct {
	d       *denials
	wake    chan struct{}
	mu      sync.Mutex
	refused map[string]error
}

// watch starts collecting denials; stop ends it.
func (d *denials) watch() *watch {
	w := &watch{d: d, wake: make(chan struct{}, 1)}
	d.mu.Lock()
	d.watches[w] = struct{}{}
	d.mu.Unlock()
	return w
}

func (w *watch) stop() {
	w.d.mu.Lock()
	delete(w.d.watches, w)
	w.d.mu.Unlock()
}

// changed receives after a denial arrived.
func (w *watch) changed() <-chan struct{} { return w.wake }

// denied is the violation the server reported for subj since the watch began, or nil.
func (w *watch) denied(subj string) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.refused[subj]
}
