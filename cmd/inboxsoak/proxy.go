package main

import (
	"errors"
	"io"
	"net"
	"sync"
)

// cutProxy is a TCP proxy between the relays and the receiver that can cut
// the connections through it silently: a cut connection stops forwarding in
// both directions and sends no FIN, as a network that drops packets looks to
// both ends. What the relay sent on it after the cut is held, and delivered
// to the receiver later (Release), as a request stuck in a network arrives
// after its sender gave up; the receiver's answer goes nowhere. Connections
// made after a cut go through.
type cutProxy struct {
	ln     net.Listener
	target string

	mu       sync.Mutex
	links    map[*link]bool
	released []*link // cut and released: closed by Close
	closed   bool
	wg       sync.WaitGroup
}

// link is one connection through the proxy.
type link struct {
	client, server net.Conn
	cut            bool   // under the proxy's mu
	held           []byte // what the client sent after the cut
}

func newCutProxy(target string) (*cutProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &cutProxy{ln: ln, target: target, links: map[*link]bool{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// URL is the proxy's base URL.
func (p *cutProxy) URL() string { return "http://" + p.ln.Addr().String() }

func (p *cutProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close() // the receiver is down: the relay sees the refusal
			continue
		}
		l := &link{client: c, server: s}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			c.Close()
			s.Close()
			return
		}
		p.links[l] = true
		p.wg.Add(2)
		p.mu.Unlock()
		go p.pipe(l, true)
		go p.pipe(l, false)
	}
}

// pipe copies one direction of l: the client's bytes to the server (up), or
// the server's to the client.
func (p *cutProxy) pipe(l *link, up bool) {
	defer p.wg.Done()
	src, dst := l.server, l.client
	if up {
		src, dst = l.client, l.server
	}
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			cut := l.cut
			if cut && up {
				l.held = append(l.held, buf[:n]...)
			}
			p.mu.Unlock()
			if !cut {
				if _, werr := dst.Write(buf[:n]); werr != nil {
					p.drop(l)
					return
				}
			}
		}
		if err != nil {
			p.mu.Lock()
			cut := l.cut
			p.mu.Unlock()
			if !cut {
				// An end that closed: pass it on, as a network does.
				if tc, ok := dst.(*net.TCPConn); ok && errors.Is(err, io.EOF) {
					_ = tc.CloseWrite()
				} else {
					dst.Close()
				}
			}
			return
		}
	}
}

// drop forgets l and closes its ends.
func (p *cutProxy) drop(l *link) {
	p.mu.Lock()
	delete(p.links, l)
	p.mu.Unlock()
	l.client.Close()
	l.server.Close()
}

// Cut cuts every connection open now, silently, and returns how many.
func (p *cutProxy) Cut() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for l := range p.links {
		if !l.cut {
			l.cut = true
			n++
		}
	}
	return n
}

// Release delivers to the receiver what the relays sent on the cut
// connections, late, and closes them. It returns how many held anything.
func (p *cutProxy) Release() int {
	p.mu.Lock()
	var cut []*link
	for l := range p.links {
		if l.cut {
			cut = append(cut, l)
			delete(p.links, l)
		}
	}
	p.released = append(p.released, cut...)
	p.mu.Unlock()
	n := 0
	for _, l := range cut {
		p.mu.Lock()
		held := l.held
		l.held = nil
		p.mu.Unlock()
		if len(held) > 0 {
			n++
			_, _ = l.server.Write(held)
			// Half-close: the receiver reads the request to its end and
			// answers into the void.
			if tc, ok := l.server.(*net.TCPConn); ok {
				_ = tc.CloseWrite()
			}
		}
		l.client.Close()
	}
	return n
}

// Close stops listening, closes every connection and waits for the
// proxy's goroutines.
func (p *cutProxy) Close() {
	p.mu.Lock()
	p.closed = true
	links := p.links
	p.links = map[*link]bool{}
	released := p.released
	p.mu.Unlock()
	_ = p.ln.Close()
	for l := range links {
		l.client.Close()
		l.server.Close()
	}
	for _, l := range released {
		l.server.Close()
	}
	p.wg.Wait()
}
