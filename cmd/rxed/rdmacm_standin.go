//go:build !rdmacm

package main

// TEMPORARY stand-in for rdmacm_glue.go while pkg/rdmacm is being
// written: the same functions, with the QP numbers exchanged over TCP on
// the rdma_cm address and port instead of CM MADs. Deleted once
// pkg/rdmacm lands (then rdmacm_glue.go loses its build tag).

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"syscall"

	"github.com/rxed/rxed/pkg/ib"
)

type standinMsg struct {
	QPN, PSN, QKey uint32
	GID            netip.Addr
	UD             bool
	Port           uint16
}

type cmListener struct {
	dev *ib.Device
	ln  net.Listener
}

func cmListen(dev *ib.Device, addr netip.AddrPort, ud bool) (*cmListener, error) {
	ln, err := net.Listen("tcp", addr.String())
	if err != nil {
		return nil, err
	}
	return &cmListener{dev: dev, ln: ln}, nil
}

func (l *cmListener) accept(ctx context.Context) (*cmRequest, error) {
	stop := context.AfterFunc(ctx, func() { l.ln.Close() })
	defer stop()
	c, err := l.ln.Accept()
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
	r := &cmRequest{dev: l.dev, c: c, rd: bufio.NewReader(c)}
	line, err := r.rd.ReadBytes('\n')
	if err != nil {
		c.Close()
		return nil, err
	}
	if err := json.Unmarshal(line, &r.req); err != nil {
		c.Close()
		return nil, err
	}
	return r, nil
}

func (l *cmListener) close() error { return l.ln.Close() }

type cmRequest struct {
	dev *ib.Device
	c   net.Conn
	rd  *bufio.Reader
	req standinMsg
}

func (r *cmRequest) remote() netip.AddrPort {
	return netip.AddrPortFrom(r.req.GID, r.req.Port)
}
func (r *cmRequest) isUD() bool { return r.req.UD }

func cmError(err error) error { return err }

func standinConnect(dev *ib.Device, q *ib.QP, local netip.Addr, peer standinMsg, psn uint32, p cmParams) error {
	av := ib.AddrVector{DGID: peer.GID, SGIDIndex: uint8(max(dev.GIDIndex(local), 0)), PortNum: 1, DestPort: dev.UDPPort()}
	_, err := connectQP(q.PD(), q, ib.RC, qpPath{av: av, mtu: ib.MTU1024, destQPN: peer.QPN, rqPSN: peer.PSN, sqPSN: psn,
		timeout: max(p.ackTimeout, 14), maxDestRdAtom: 1, maxRdAtomic: 1})
	return err
}

func (r *cmRequest) accept(ctx context.Context, q *ib.QP, p cmParams) (*cmConn, error) {
	psn := rand.Uint32() & 0xffffff
	local := r.c.LocalAddr().(*net.TCPAddr).AddrPort().Addr().Unmap()
	if err := standinConnect(r.dev, q, local, r.req, psn, p); err != nil {
		return nil, err
	}
	b, _ := json.Marshal(standinMsg{QPN: q.Num(), PSN: psn, GID: local})
	if _, err := r.c.Write(append(b, '\n')); err != nil {
		return nil, err
	}
	if _, err := r.rd.ReadBytes('\n'); err != nil { // RTU
		return nil, err
	}
	return newStandinConn(r.c, r.rd), nil
}

func (r *cmRequest) acceptUD(q *ib.QP) error {
	b, _ := json.Marshal(standinMsg{QPN: q.Num(), QKey: rdmaUDPQKey})
	_, err := r.c.Write(append(b, '\n'))
	r.c.Close()
	return err
}

func (r *cmRequest) reject() error { return r.c.Close() }

type cmConn struct {
	c      net.Conn
	doneCh chan struct{}
	once   sync.Once
}

func newStandinConn(c net.Conn, rd *bufio.Reader) *cmConn {
	cc := &cmConn{c: c, doneCh: make(chan struct{})}
	go func() {
		_, _ = rd.ReadBytes('\n')
		cc.once.Do(func() { close(cc.doneCh) })
	}()
	return cc
}

func (c *cmConn) done() <-chan struct{} { return c.doneCh }
func (c *cmConn) disconnect(ctx context.Context) error {
	c.c.Close()
	c.once.Do(func() { close(c.doneCh) })
	return nil
}

type standinRejected struct{}

func (standinRejected) Error() string { return "rejected: invalid service ID (8)" }

func standinDial(ctx context.Context, raddr netip.AddrPort, p cmParams, m standinMsg) (net.Conn, *bufio.Reader, standinMsg, error) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: p.local.AsSlice()}, Timeout: p.timeout}
	c, err := d.DialContext(ctx, "tcp", raddr.String())
	if err != nil {
		if errors.Is(err, syscall.ECONNREFUSED) {
			return nil, nil, standinMsg{}, standinRejected{}
		}
		return nil, nil, standinMsg{}, err
	}
	m.GID = p.local
	m.Port = uint16(c.LocalAddr().(*net.TCPAddr).Port)
	b, _ := json.Marshal(m)
	if _, err := c.Write(append(b, '\n')); err != nil {
		c.Close()
		return nil, nil, standinMsg{}, err
	}
	rd := bufio.NewReader(c)
	line, err := rd.ReadBytes('\n')
	if err != nil {
		c.Close()
		return nil, nil, standinMsg{}, fmt.Errorf("rejected: %v", err)
	}
	var rep standinMsg
	if err := json.Unmarshal(line, &rep); err != nil {
		c.Close()
		return nil, nil, standinMsg{}, err
	}
	return c, rd, rep, nil
}

func cmDial(ctx context.Context, q *ib.QP, raddr netip.AddrPort, p cmParams) (*cmConn, error) {
	psn := rand.Uint32() & 0xffffff
	c, rd, rep, err := standinDial(ctx, raddr, p, standinMsg{QPN: q.Num(), PSN: psn})
	if err != nil {
		return nil, err
	}
	if err := standinConnect(q.PD().Device(), q, p.local, rep, psn, p); err != nil {
		c.Close()
		return nil, err
	}
	if _, err := c.Write([]byte("{}\n")); err != nil {
		c.Close()
		return nil, err
	}
	return newStandinConn(c, rd), nil
}

type udRemote struct {
	gid       netip.Addr
	qpn, qkey uint32
}

func cmDialUD(ctx context.Context, dev *ib.Device, raddr netip.AddrPort, p cmParams) (udRemote, error) {
	c, _, rep, err := standinDial(ctx, raddr, p, standinMsg{UD: true})
	if err != nil {
		return udRemote{}, err
	}
	c.Close()
	return udRemote{gid: raddr.Addr(), qpn: rep.QPN, qkey: rep.QKey}, nil
}
