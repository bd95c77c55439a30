package pgserver

import (
	"errors"
	"io"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
)

// Proxy is a TCP proxy in front of a server, for fault tests: it can freeze
// every connection through it — stop forwarding in both directions while
// keeping every socket open, as a host cut off from the network without a FIN
// looks to the server, or a sidecar proxy whose own kernel still answers the
// server's keepalive probes — and thaw them again.
type Proxy struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	frozen bool
	thawed *sync.Cond
	conns  []net.Conn
	closed bool
	wg     sync.WaitGroup

	roundTrips atomic.Int64 // simple queries and Syncs the clients sent
}

// RoundTrips is how many round trips the clients through the proxy have asked
// of the server so far: each simple query ('Q', a pgx Ping among them) and
// each Sync of the extended protocol ('S': one per statement, or one per
// pipeline or batch).
func (p *Proxy) RoundTrips() int64 { return p.roundTrips.Load() }

// NewProxy listens on 127.0.0.1 on a free port and forwards each connection to
// target (host:port).
func NewProxy(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target}
	p.thawed = sync.NewCond(&p.mu)
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// ProxyURL returns a proxy in front of the server of the postgres:// URL u, and
// u rewritten to go through it.
func ProxyURL(u string) (*Proxy, string, error) {
	parsed, err := url.Parse(u)
	if err != nil {
		return nil, "", err
	}
	p, err := NewProxy(parsed.Host)
	if err != nil {
		return nil, "", err
	}
	parsed.Host = p.ln.Addr().String()
	return p, parsed.String(), nil
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			c.Close()
			s.Close()
			return
		}
		p.conns = append(p.conns, c, s)
		p.wg.Add(2)
		p.mu.Unlock()
		go p.pipe(s, c, &frontendCounter{n: &p.roundTrips})
		go p.pipe(c, s, nil)
	}
}

// pipe copies from src to dst, holding each chunk while the proxy is frozen;
// count, when set, reads the client's messages as they pass.
func (p *Proxy) pipe(dst, src net.Conn, count *frontendCounter) {
	defer p.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			for p.frozen && !p.closed {
				p.thawed.Wait()
			}
			closed := p.closed
			p.mu.Unlock()
			if closed {
				return
			}
			if count != nil {
				count.feed(buf[:n])
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				dst.Close()
				return
			}
			// Half-close: pass the end on, as a real network would.
			if tc, ok := dst.(*net.TCPConn); ok {
				_ = tc.CloseWrite()
			}
			return
		}
	}
}

// Freeze stops forwarding: bytes already in flight stay in the sockets'
// buffers, nothing is delivered, nothing is closed.
func (p *Proxy) Freeze() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.frozen = true
}

// Thaw forwards again what was held and what comes next.
func (p *Proxy) Thaw() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.frozen = false
	p.thawed.Broadcast()
}

// Close stops listening, closes every connection through the proxy and waits
// for its goroutines. It is safe to call twice.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	p.thawed.Broadcast()
	conns := p.conns
	p.mu.Unlock()
	err := p.ln.Close()
	for _, c := range conns {
		c.Close()
	}
	p.wg.Wait()
	return err
}

// frontendCounter follows the client's side of the protocol through the
// stream: the untyped start (an SSL or GSS request, then the startup
// message), then typed messages, a byte of type and a length of four. It
// counts the messages that ask the server for an answer: 'Q' and 'S'.
type frontendCounter struct {
	n       *atomic.Int64
	started bool    // past the startup message
	head    [5]byte // the header being read
	have    int     // bytes of head read
	skip    int     // bytes of the current message's body still to pass
}

func (c *frontendCounter) feed(b []byte) {
	for len(b) > 0 {
		if c.skip > 0 {
			k := min(c.skip, len(b))
			c.skip, b = c.skip-k, b[k:]
			continue
		}
		want := 5
		if !c.started {
			want = 4 // untyped: a length only
		}
		k := min(want-c.have, len(b))
		copy(c.head[c.have:], b[:k])
		c.have, b = c.have+k, b[k:]
		if c.have < want {
			return
		}
		c.have = 0
		if !c.started {
			size := int(uint32(c.head[0])<<24 | uint32(c.head[1])<<16 | uint32(c.head[2])<<8 | uint32(c.head[3]))
			c.skip = max(size-4, 0)
			// An SSL or GSS encryption request (8 bytes) comes before the
			// startup message; anything longer is the startup itself.
			c.started = size != 8
			continue
		}
		if t := c.head[0]; t == 'Q' || t == 'S' {
			c.n.Add(1)
		}
		size := int(uint32(c.head[1])<<24 | uint32(c.head[2])<<16 | uint32(c.head[3])<<8 | uint32(c.head[4]))
		c.skip = max(size-4, 0)
	}
}
