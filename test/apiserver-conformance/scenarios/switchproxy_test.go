package scenarios

import (
	"io"
	"net"
	"sync"
)

// switchProxy is an address whose TCP connections go to a target that can
// change: what a DNS name or a load balancer in front of etcd is to
// kube-apiserver. mu guards target and conns.
type switchProxy struct {
	ln net.Listener
	wg sync.WaitGroup // the accept loop and the pipes

	mu     sync.Mutex
	target string // host:port; "" refuses connections
	conns  map[net.Conn]bool
}

// startSwitchProxy listens on a loopback port and forwards to target
// ("http://host:port" or "host:port") until close.
func startSwitchProxy(target string) (*switchProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &switchProxy{ln: ln, conns: map[net.Conn]bool{}}
	p.point(target)
	p.wg.Add(1)
	go func() { defer p.wg.Done(); p.serve() }()
	return p, nil
}

func (p *switchProxy) url() string { return "http://" + p.ln.Addr().String() }

func (p *switchProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		p.mu.Lock()
		target := p.target
		p.mu.Unlock()
		if target == "" {
			c.Close()
			continue
		}
		p.wg.Add(1)
		go func() { defer p.wg.Done(); p.pipe(c, target) }()
	}
}

// pipe copies between c and a new connection to target until either side
// ends or point closes them.
func (p *switchProxy) pipe(c net.Conn, target string) {
	u, err := net.Dial("tcp", target)
	if err != nil {
		c.Close()
		return
	}
	p.mu.Lock()
	p.conns[c], p.conns[u] = true, true
	p.mu.Unlock()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(u, c); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, u); done <- struct{}{} }()
	<-done
	c.Close()
	u.Close()
	<-done
	p.mu.Lock()
	delete(p.conns, c)
	delete(p.conns, u)
	p.mu.Unlock()
}

// point sends new connections to target ("" refuses them) and closes the
// open ones, as the old server going away would.
func (p *switchProxy) point(target string) {
	if len(target) > 7 && target[:7] == "http://" {
		target = target[7:]
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.target = target
	for c := range p.conns {
		c.Close()
	}
}

func (p *switchProxy) close() {
	p.ln.Close()
	p.point("")
	p.wg.Wait()
}
