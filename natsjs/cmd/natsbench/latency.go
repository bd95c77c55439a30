package main

import (
	"net"
	"sync"
	"time"
)

// latencyProxy forwards TCP connections to a target, delaying every byte by
// a fixed one-way delay in each direction, so that an in-process server
// answers as one across a network would: a round trip costs 2 × delay more.
type latencyProxy struct {
	ln     net.Listener
	target string
	delay  time.Duration
	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  []net.Conn
}

// startLatencyProxy listens on a free port of 127.0.0.1 and forwards to target.
func startLatencyProxy(target string, delay time.Duration) (*latencyProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &latencyProxy{ln: ln, target: target, delay: delay}
	p.wg.Go(p.accept)
	return p, nil
}

// Addr is the proxy's address.
func (p *latencyProxy) Addr() string { return p.ln.Addr().String() }

func (p *latencyProxy) accept() {
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
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		p.wg.Go(func() { p.pipe(s, c) })
		p.wg.Go(func() { p.pipe(c, s) })
	}
}

// chunk is bytes read at a time, to be written delay later.
type chunk struct {
	at time.Time
	b  []byte
}

// pipe copies src to dst, each read written delay after it was read, in order.
func (p *latencyProxy) pipe(dst, src net.Conn) {
	defer dst.Close()
	ch := make(chan chunk, 4096)
	var wg sync.WaitGroup
	wg.Go(func() {
		defer src.Close()
		for c := range ch {
			time.Sleep(time.Until(c.at.Add(p.delay)))
			if _, err := dst.Write(c.b); err != nil {
				for range ch { // drain until the reader stops
				}
				return
			}
		}
	})
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			ch <- chunk{at: time.Now(), b: append([]byte(nil), buf[:n]...)}
		}
		if err != nil { // io.EOF, or the other side closed
			break
		}
	}
	close(ch)
	wg.Wait()
}

// Close stops accepting, closes every connection and waits for the pipes.
func (p *latencyProxy) Close() {
	p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}
