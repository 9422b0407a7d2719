package oob

import (
	"context"
	"errors"
	"net"
)

// DialPingpong is the client side of the ibv_*_pingpong exchange: it
// connects to address (host:port, port 18515 by default in the tools), sends
// local, reads the server's address, calls connect (if not nil) so the
// caller can move its QP to RTR/RTS, and then sends "done\0". It returns the
// server's address. Every step is bounded by opts.Timeout and ctx.
//
// rc_pingpong itself sends "done" before connecting its QP; sending it after
// is equivalent on the wire (the server only waits for it) and lets a
// failed connect abort the exchange visibly.
func DialPingpong(ctx context.Context, address string, local PingpongDest, connect func(remote PingpongDest) error, opts *Options) (PingpongDest, error) {
	var msg [PingpongMsgLen]byte
	if err := local.Encode(msg[:]); err != nil {
		return PingpongDest{}, err
	}
	s, err := dial(ctx, address, opts)
	if err != nil {
		return PingpongDest{}, err
	}
	defer s.close()
	if err := s.writeMsg(ctx, msg[:], "pingpong address"); err != nil {
		return PingpongDest{}, err
	}
	if err := s.readMsg(ctx, msg[:], "pingpong address", true); err != nil {
		return PingpongDest{}, unanswered(s.peer, err)
	}
	remote, err := s.pingpongRemote(msg[:], connect)
	if err != nil {
		return PingpongDest{}, err
	}
	if err := s.writeMsg(ctx, PingpongDoneMsg[:], "pingpong done"); err != nil {
		return PingpongDest{}, err
	}
	return remote, nil
}

// unanswered rewords a server that closed the connection without a byte
// of its address, after ours: the tools' server does so when it refuses
// our address (rdma-core's pp_server_exch_dest closes when
// pp_connect_ctx fails, e.g. on a GID of the other IP family), and the
// 52-byte format has no way to say why (a real client takes whatever
// 52 bytes come for an address, unchecked). "sent 0 bytes, want 52"
// pointed at nothing; this points at the server's own error.
func unanswered(peer string, err error) error {
	var se *stepError
	if !errors.Is(err, ErrClosed) || !errors.As(err, &se) || se.got != 0 {
		return err
	}
	return errorf(peer, ErrClosed, "closed the exchange without answering our pingpong address: "+
		"the server refused it, and its own error says why (check that both sides' GIDs are of one IP family, "+
		"IPv4 or IPv6)")
}

// PingpongListener is the server side of the ibv_*_pingpong exchange.
type PingpongListener struct {
	ln   net.Listener
	opts *Options
}

// ListenPingpong listens on address (":18515" listens on every address, as
// the tools do; ":0" picks a free port, see Addr).
func ListenPingpong(address string, opts *Options) (*PingpongListener, error) {
	ln, err := listen(address)
	if err != nil {
		return nil, err
	}
	return &PingpongListener{ln: ln, opts: opts}, nil
}

// Addr is the address the listener is bound to.
func (l *PingpongListener) Addr() net.Addr { return l.ln.Addr() }

// Close stops listening.
func (l *PingpongListener) Close() error { return l.ln.Close() }

// Exchange accepts one client (waiting as long as ctx allows, like the tools
// which wait forever), reads its address, calls connect (if not nil) so the
// caller moves its QP to RTR/RTS before answering, as the tools' server
// does, replies with local and waits for exactly "done\0". The steps after
// accept are bounded by Options.Timeout. It returns the client's address.
func (l *PingpongListener) Exchange(ctx context.Context, local PingpongDest, connect func(remote PingpongDest) error) (PingpongDest, error) {
	var msg [PingpongMsgLen]byte
	if err := local.Encode(msg[:]); err != nil {
		return PingpongDest{}, err
	}
	s, err := accept(ctx, l.ln, l.opts)
	if err != nil {
		return PingpongDest{}, err
	}
	defer s.close()
	var in [PingpongMsgLen]byte
	if err := s.readMsg(ctx, in[:], "pingpong address", true); err != nil {
		return PingpongDest{}, err
	}
	remote, err := s.pingpongRemote(in[:], connect)
	if err != nil {
		return PingpongDest{}, err
	}
	if err := s.writeMsg(ctx, msg[:], "pingpong address"); err != nil {
		return PingpongDest{}, err
	}
	var done [len(PingpongDoneMsg)]byte
	if err := s.readMsg(ctx, done[:], "pingpong done", true); err != nil {
		return PingpongDest{}, err
	}
	if done != PingpongDoneMsg {
		return PingpongDest{}, errorf(s.peer, ErrMalformed, "sent %s instead of \"done\\x00\"", quoteMsg(done[:]))
	}
	return remote, nil
}

// pingpongRemote parses the peer's address message and calls connect (if
// not nil) with it.
func (s *stream) pingpongRemote(msg []byte, connect func(remote PingpongDest) error) (PingpongDest, error) {
	remote, err := ParsePingpongDest(msg)
	if err != nil {
		return PingpongDest{}, errorf(s.peer, ErrMalformed, "sent a malformed pingpong address %s: %v", quoteMsg(msg), err)
	}
	if connect != nil {
		if err := connect(remote); err != nil {
			return PingpongDest{}, errorf(s.peer, ErrConnect, "connecting our QP to QPN %#06x failed: %v", remote.QPN, err)
		}
	}
	return remote, nil
}
