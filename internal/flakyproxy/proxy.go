// Package flakyproxy is a TCP proxy that can be told to break: the lab's
// way to drive an iSCSI session into the stuck state of open-iscsi issue
// #387, shared by the e2e tests and the lab walk-through's flakyproxy
// command.
//
// Passing, the proxy forwards bytes both ways. Breaking, it resets every
// open connection and resets each new one as soon as the watched
// condition holds (the kernel shows the session's connection "bound"),
// or, with no condition set, after the first bytes of the iSCSI login
// PDU. A reset then lands after iscsid bound the new connection and, with
// luck, while it still sets the connection's parameters, before the login
// PDU: the window in which iscsid 2.1.8 reopens without stopping the
// connection and the kernel refuses every later bind with ENOTCONN. The
// window is narrow, so the condition is polled every 50 µs; a slower
// poller rarely hits it. A connection the initiator closes while the
// proxy waits for the condition (iscsid gives up on a reopen whose bind
// failed) is reset at once, not after the wait.
//
// Passing again, the proxy keeps watching the condition on each forwarded
// connection: one seen bound means the initiator got its bind through
// (the session is logging in, not stuck); one the initiator closes
// without it ever holding is a reopen whose bind failed — in a stuck
// session, every reopen. Forwards counts both, so a test decides within
// a reopen or two instead of waiting out a recovery period.
package flakyproxy

import (
	"io"
	"net"
	"sync"
	"time"
)

// Event is one thing the proxy did with a connection.
type Event string

const (
	// Forwarded: a connection was accepted and forwarded to the target.
	Forwarded Event = "forward"
	// Reset: a connection was reset while breaking, the condition unseen.
	Reset Event = "reset"
	// ResetBound: a connection was reset while breaking, after the
	// condition held.
	ResetBound Event = "reset bound"
	// Refused: the target refused the forwarded connection; the host's
	// connection was reset.
	Refused Event = "upstream refused"
	// ForwardBound: a forwarded connection was seen with the condition
	// holding.
	ForwardBound Event = "forward bound"
	// ForwardUnbound: the initiator closed a forwarded connection before
	// the condition ever held.
	ForwardUnbound Event = "forward closed unbound"
)

const (
	// boundWait bounds how long a new connection waits for the condition
	// before it is reset anyway.
	boundWait = 3 * time.Second
	// boundPoll is the condition's poll interval.
	boundPoll = 50 * time.Microsecond
	// loginHeader is the size of an iSCSI PDU's basic header segment.
	loginHeader = 48
)

// Proxy is a breakable TCP proxy. Its methods are safe for concurrent use.
type Proxy struct {
	ln       net.Listener
	target   string
	onEvent  func(Event)
	condWait time.Duration

	mu          sync.Mutex
	breaking    bool
	cond        func() bool
	conns       map[net.Conn]bool
	resets      int
	boundResets int
	// unboundRun counts the resets without the condition since the
	// latest reset with it.
	unboundRun int
	// fwdBound and fwdUnbound count forwarded connections seen with the
	// condition, and closed by the initiator without it.
	fwdBound, fwdUnbound int
}

// Listen starts a proxy on listen that forwards to target; onEvent, when
// not nil, is told of every connection's fate. It serves until Close.
func Listen(listen, target string, onEvent func(Event)) (*Proxy, error) {
	return start(listen, target, onEvent, boundWait)
}

func start(listen, target string, onEvent func(Event), condWait time.Duration) (*Proxy, error) {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, onEvent: onEvent, condWait: condWait, conns: map[net.Conn]bool{}}
	go p.serve()
	return p, nil
}

// Addr is the address the proxy listens on.
func (p *Proxy) Addr() net.Addr { return p.ln.Addr() }

// Close stops accepting and resets every open connection.
func (p *Proxy) Close() error {
	err := p.ln.Close()
	p.resetAll()
	return err
}

// Break resets every open connection and every new one until Pass. cond,
// when not nil, is the condition a new connection waits for (at most 3 s)
// before its reset.
func (p *Proxy) Break(cond func() bool) {
	p.mu.Lock()
	p.breaking, p.cond = true, cond
	p.mu.Unlock()
	p.resetAll()
}

// Pass makes the proxy forward new connections again.
func (p *Proxy) Pass() {
	p.mu.Lock()
	p.breaking = false
	p.mu.Unlock()
}

// Resets reports how many connections were reset while breaking, and how
// many of those after their condition held.
func (p *Proxy) Resets() (all, afterCond int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.resets, p.boundResets
}

// Forwards reports how many forwarded connections were seen with the
// condition holding (bound), and how many the initiator closed before it
// ever held (unbound), since the proxy started. Only connections
// forwarded while a condition is set (a Break set one) are watched.
func (p *Proxy) Forwards() (bound, unbound int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.fwdBound, p.fwdUnbound
}

// UnboundRun is the number of resets whose condition never held since the
// latest reset after it held (0 before any such reset). For an iSCSI
// session it is the stuck state's signature: once a reset after the bind
// has hit the window, every later reopen fails its bind (ENOTCONN) and
// never shows the connection bound.
func (p *Proxy) UnboundRun() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.unboundRun
}

func (p *Proxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		go p.handle(c)
	}
}

func (p *Proxy) event(e Event) {
	if p.onEvent != nil {
		p.onEvent(e)
	}
}

func (p *Proxy) handle(c net.Conn) {
	p.mu.Lock()
	breaking, cond := p.breaking, p.cond
	p.mu.Unlock()
	if breaking {
		p.breakConn(c, cond)
		return
	}
	up, err := net.Dial("tcp", p.target)
	if err != nil {
		reset(c)
		p.event(Refused)
		return
	}
	p.event(Forwarded)
	p.track(c, up)
	done := make(chan struct{}, 2)
	clientGone := make(chan struct{})
	go func() { _, _ = io.Copy(up, c); close(clientGone); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, up); done <- struct{}{} }()
	if cond != nil {
		go p.watchForward(cond, clientGone)
	}
	<-done
	c.Close()
	up.Close()
	p.untrack(c, up)
}

// watchForward polls cond for a forwarded connection until it holds (a
// ForwardBound), the initiator closes the connection first (a
// ForwardUnbound), or the condition wait passes (neither).
func (p *Proxy) watchForward(cond func() bool, clientGone <-chan struct{}) {
	deadline := time.Now().Add(p.condWait)
	for time.Now().Before(deadline) {
		if cond() {
			p.mu.Lock()
			p.fwdBound++
			p.mu.Unlock()
			p.event(ForwardBound)
			return
		}
		select {
		case <-clientGone:
			// One last look: the bind may have come just before the close.
			if cond() {
				continue
			}
			p.mu.Lock()
			p.fwdUnbound++
			p.mu.Unlock()
			p.event(ForwardUnbound)
			return
		default:
		}
		time.Sleep(boundPoll)
	}
}

func (p *Proxy) breakConn(c net.Conn, cond func() bool) {
	saw := false
	if cond != nil {
		// The initiator closing its end ends the wait: a reopen whose
		// bind failed is never bound.
		clientGone := make(chan struct{})
		go func() { _, _ = io.Copy(io.Discard, c); close(clientGone) }()
	wait:
		for deadline := time.Now().Add(p.condWait); !saw && time.Now().Before(deadline); {
			saw = cond()
			select {
			case <-clientGone:
				if !saw {
					saw = cond()
				}
				break wait
			default:
			}
			if !saw {
				time.Sleep(boundPoll)
			}
		}
	} else {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		_, _ = io.ReadFull(c, make([]byte, loginHeader))
	}
	reset(c)
	p.mu.Lock()
	p.resets++
	switch {
	case saw:
		p.boundResets++
		p.unboundRun = 0
	case p.boundResets > 0:
		p.unboundRun++
	}
	p.mu.Unlock()
	if saw {
		p.event(ResetBound)
	} else {
		p.event(Reset)
	}
}

func (p *Proxy) track(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		p.conns[c] = true
	}
}

func (p *Proxy) untrack(cs ...net.Conn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range cs {
		delete(p.conns, c)
	}
}

func (p *Proxy) resetAll() {
	p.mu.Lock()
	cs := make([]net.Conn, 0, len(p.conns))
	for c := range p.conns {
		cs = append(cs, c)
	}
	p.mu.Unlock()
	// Linger 0 on every connection first: a pipe that ends because its
	// peer was just reset closes its side with an RST too, not a FIN.
	for _, c := range cs {
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0)
		}
	}
	for _, c := range cs {
		_ = c.Close()
	}
}

// reset closes c with an RST instead of a FIN.
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}
