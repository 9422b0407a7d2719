package oob

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
)

// Role is which end of perftest's exchange a Session plays. The client (the
// side given the server's address) writes first in every exchange; the
// server reads, then writes the same size.
type Role uint8

const (
	// Client dials and writes first.
	Client Role = iota
	// Server accepts and answers.
	Server
)

// String is "client" or "server".
func (r Role) String() string {
	if r == Server {
		return "server"
	}
	return "client"
}

// SessionConfig configures a perftest Session. The zero value behaves like
// perftest 4.5 with default flags.
type SessionConfig struct {
	Options
	// Version is the version string sent; "" means PerftestVersion ("6.06").
	Version string
	// DontXchgVersions mirrors --dont_xchg_versions: no version, system data
	// or MTU exchange; the peer is assumed to run our version. Both sides
	// must agree on it.
	DontXchgVersions bool
	// CycleBuffer and CacheLineSize are this host's values for
	// check_sys_data; zero means 4096 and 64 (perftest's defaults).
	CycleBuffer, CacheLineSize uint32
	// ReportPerPort mirrors --report-per-port: four more doubles in the
	// bandwidth report exchange.
	ReportPerPort bool
	// Ext enables the rxed extension (rxedext.go: refusals a client can
	// read, token mode, address proof); nil speaks plain perftest. It
	// needs the version exchange.
	Ext *ExtConfig
	// Test is a plain server's own test (Ext nil; rxed perf): an rxed
	// client that announces another in its version message is refused
	// there, both ends failing with an error naming the two tests
	// (checkTest). Other clients see perftest's exchange unchanged. nil:
	// no check, as perftest.
	Test *Test
}

func (c *SessionConfig) version() string {
	if c.Version == "" {
		return PerftestVersion
	}
	return c.Version
}

// SysData is what check_sys_data negotiates: each side takes the larger of
// its own and the peer's value.
type SysData struct {
	CycleBuffer   uint32
	CacheLineSize uint32
}

// Negotiated is the outcome of Session.Negotiate.
type Negotiated struct {
	RemoteVersion string
	SysData       SysData
	MTU           int // ibv_mtu enum both sides use: min of both when the peer's is valid
}

// Session is one perftest out-of-band connection. Its methods are the
// exchanges perftest makes, to be called in perftest's order (see Test for
// the order per benchmark); each is symmetric, so both ends must make the
// same calls. A method that fails closes the connection: the session is
// over. A Session is not safe for concurrent use.
type Session struct {
	s         *stream
	role      Role
	cfg       SessionConfig
	remoteVer string
	remoteNum float64
	ext       extState
}

// NewSession runs the perftest exchange over an established connection. The
// session owns c from now on.
func NewSession(c net.Conn, role Role, cfg *SessionConfig) *Session {
	var cp SessionConfig
	if cfg != nil {
		cp = *cfg
	}
	s := &Session{s: newStream(c, &cp.Options), role: role, cfg: cp}
	// Until versions are exchanged (or when they never are) the peer is
	// taken to speak our version, as perftest does.
	s.remoteVer = cp.version()
	s.remoteNum = VersionNumber(s.remoteVer)
	return s
}

// DialPerftest connects to a perftest server (or another rxed) at address
// and returns the client end of the session.
func DialPerftest(ctx context.Context, address string, cfg *SessionConfig) (*Session, error) {
	var o *Options
	if cfg != nil {
		o = &cfg.Options
	}
	st, err := dial(ctx, address, o)
	if err != nil {
		return nil, err
	}
	return NewSession(st.c, Client, cfg), nil
}

// PerftestListener accepts perftest clients.
type PerftestListener struct {
	ln  net.Listener
	cfg *SessionConfig
}

// ListenPerftest listens on address (":18515" for every address, ":0" for a
// free port).
func ListenPerftest(address string, cfg *SessionConfig) (*PerftestListener, error) {
	ln, err := listen(address)
	if err != nil {
		return nil, err
	}
	return &PerftestListener{ln: ln, cfg: cfg}, nil
}

// Addr is the address the listener is bound to.
func (l *PerftestListener) Addr() net.Addr { return l.ln.Addr() }

// Close stops listening; sessions already accepted are not affected.
func (l *PerftestListener) Close() error { return l.ln.Close() }

// Accept waits (as long as ctx allows) for one client and returns the
// server end of its session.
func (l *PerftestListener) Accept(ctx context.Context) (*Session, error) {
	var o *Options
	if l.cfg != nil {
		o = &l.cfg.Options
	}
	st, err := accept(ctx, l.ln, o)
	if err != nil {
		return nil, err
	}
	return NewSession(st.c, Server, l.cfg), nil
}

// Role is this end's role.
func (s *Session) Role() Role { return s.role }

// RemoteAddr is the peer's TCP address.
func (s *Session) RemoteAddr() string { return s.s.peer }

// RemoteVersion is the peer's version string (ours until exchanged).
func (s *Session) RemoteVersion() string { return s.remoteVer }

// exchange is ctx_xchg_data over Ethernet: the client writes then reads,
// the server reads then writes, both the same size. bounded=false lets the
// wait for the peer last as long as ctx allows.
func (s *Session) exchange(ctx context.Context, out, in []byte, what string, bounded bool) error {
	var err error
	if s.role == Client {
		if err = s.s.writeMsg(ctx, out, what); err == nil {
			err = s.s.readMsg(ctx, in, what, bounded)
		}
	} else {
		if err = s.s.readMsg(ctx, in, what, bounded); err == nil {
			err = s.s.writeMsg(ctx, out, what)
		}
	}
	return s.fail(err)
}

// fail closes the connection when err is not nil: a session that missed a
// step cannot resynchronise, and closing tells the peer at once (perftest
// exits, which does the same).
func (s *Session) fail(err error) error {
	if err != nil {
		_ = s.s.close()
	}
	return err
}

// ExchangeVersions is exchange_versions plus check_version_compatibility:
// both sides send their 16-byte version string, then a peer older than 5.70
// is refused (the exchange completes first, so the peer sees ours too).
// With DontXchgVersions nothing is sent and our own version is returned.
func (s *Session) ExchangeVersions(ctx context.Context) (string, error) {
	if s.cfg.DontXchgVersions {
		return s.remoteVer, nil
	}
	var out, in [VersionMsgLen]byte
	switch {
	case s.cfg.Ext != nil && s.role == Server:
		msg, err := s.extServerVersions(ctx)
		if err != nil {
			return "", err
		}
		copy(in[:], msg)
	case s.cfg.Test != nil && s.role == Server:
		msg, err := s.checkTest(ctx)
		if err != nil {
			return "", err
		}
		copy(in[:], msg)
	default:
		var flags byte
		if s.cfg.Ext != nil && len(s.cfg.Ext.Token) > 0 {
			flags = extFlagToken
		}
		if err := s.versionMsg(out[:], ExtOK, flags); err != nil {
			return "", err
		}
		if err := s.exchange(ctx, out[:], in[:], "perftest version", true); err != nil {
			return "", err
		}
	}
	v, _ := ParseVersion(in[:])
	s.remoteVer, s.remoteNum = v, VersionNumber(v)
	if s.remoteNum < MinPerftestVersion {
		return v, s.fail(errorf(s.s.peer, ErrVersion, "speaks perftest protocol version %s; perftest 4.5 and rxed need %.2f or newer",
			quoteMsg([]byte(v)), MinPerftestVersion))
	}
	if s.cfg.Ext != nil && s.role == Client {
		if err := s.extClientVersions(ctx, in[:]); err != nil {
			return v, err
		}
	}
	return v, nil
}

// CheckSysData is check_sys_data: cycle_buffer and cache_line_size are
// exchanged as 32-bit big-endian integers (unless DontXchgVersions) and each
// side keeps the larger value. (Peers older than 5.32 skipped it, but
// ExchangeVersions refuses anything below 5.70.)
func (s *Session) CheckSysData(ctx context.Context) (SysData, error) {
	local := SysData{CycleBuffer: s.cfg.CycleBuffer, CacheLineSize: s.cfg.CacheLineSize}
	if local.CycleBuffer == 0 {
		local.CycleBuffer = 4096
	}
	if local.CacheLineSize == 0 {
		local.CacheLineSize = 64
	}
	if s.cfg.DontXchgVersions {
		return local, nil
	}
	var out, in [SysDataMsgLen]byte
	binary.BigEndian.PutUint32(out[:], local.CycleBuffer)
	if err := s.exchange(ctx, out[:], in[:], "cycle buffer size", true); err != nil {
		return SysData{}, err
	}
	remote := SysData{CycleBuffer: binary.BigEndian.Uint32(in[:])}
	binary.BigEndian.PutUint32(out[:], local.CacheLineSize)
	if err := s.exchange(ctx, out[:], in[:], "cache line size", true); err != nil {
		return SysData{}, err
	}
	remote.CacheLineSize = binary.BigEndian.Uint32(in[:])
	// perftest compares them as C ints.
	if int32(remote.CycleBuffer) > int32(local.CycleBuffer) {
		local.CycleBuffer = remote.CycleBuffer
	}
	if int32(remote.CacheLineSize) > int32(local.CacheLineSize) {
		local.CacheLineSize = remote.CacheLineSize
	}
	return local, nil
}

// CheckMTU is check_mtu's exchange: localMTU is this side's ibv_mtu enum
// value (1 = 256 ... 5 = 4096), sent as 2 bytes of decimal text; the result
// is the smaller of both when the peer's value is valid, else ours. With
// DontXchgVersions nothing is sent. (Peers older than 5.31 sent 4 bytes and
// older than 5.1 nothing, but ExchangeVersions refuses anything below 5.70.)
func (s *Session) CheckMTU(ctx context.Context, localMTU int) (int, error) {
	if localMTU < 1 || localMTU > 5 {
		return 0, fmt.Errorf("oob: local MTU enum %d is not 1..5", localMTU)
	}
	if s.cfg.DontXchgVersions {
		return localMTU, nil
	}
	var out, in [MTUMsgLen]byte
	if err := EncodeMTU(out[:], localMTU); err != nil {
		return 0, err
	}
	if err := s.exchange(ctx, out[:], in[:], "MTU", true); err != nil {
		return 0, err
	}
	if rem, ok := ParseMTU(in[:]); ok && rem < localMTU {
		return rem, nil
	}
	return localMTU, nil
}

// Negotiate runs ExchangeVersions, CheckSysData and CheckMTU in perftest's
// order.
func (s *Session) Negotiate(ctx context.Context, localMTU int) (Negotiated, error) {
	var n Negotiated
	var err error
	if n.RemoteVersion, err = s.ExchangeVersions(ctx); err != nil {
		return n, err
	}
	if n.SysData, err = s.CheckSysData(ctx); err != nil {
		return n, err
	}
	n.MTU, err = s.CheckMTU(ctx, localMTU)
	return n, err
}

// HandShake is ctx_hand_shake: one 108-byte key message each way. perftest
// uses it to exchange each QP's address and, with identical content, as a
// barrier. Bounded by Options.Timeout.
func (s *Session) HandShake(ctx context.Context, local Key) (Key, error) {
	return s.handShake(ctx, local, "key message", true)
}

// AwaitHandShake is HandShake for a barrier the peer reaches only after its
// whole test run (a half-duplex server waiting for the client to finish):
// the wait for the peer is bounded by ctx alone, the rest by the timeout.
func (s *Session) AwaitHandShake(ctx context.Context, local Key) (Key, error) {
	return s.handShake(ctx, local, "key message", false)
}

func (s *Session) handShake(ctx context.Context, local Key, what string, bounded bool) (Key, error) {
	var out, in [KeyMsgLen]byte
	if err := local.Encode(out[:]); err != nil {
		return Key{}, err
	}
	if err := s.exchange(ctx, out[:], in[:], what, bounded); err != nil {
		return Key{}, err
	}
	k, err := ParseKey(in[:])
	if err != nil {
		return Key{}, s.fail(errorf(s.s.peer, ErrMalformed, "sent a malformed %s %s: %v", what, quoteMsg(in[:]), err))
	}
	return k, nil
}

// ExchangeBWReports is xchg_bw_reports: size, iters (4 bytes for peers
// older than 5.33), peak, average and message rate (and the per-port
// figures with ReportPerPort), each its own exchange, big-endian.
func (s *Session) ExchangeBWReports(ctx context.Context, my BWReport) (BWReport, error) {
	itersLen := ReportItersLen(s.remoteNum)
	out := AppendBWReport(nil, my, itersLen, s.cfg.ReportPerPort)
	in := make([]byte, len(out))
	sizes := []int{8, itersLen, 8, 8, 8}
	if s.cfg.ReportPerPort {
		sizes = append(sizes, 8, 8, 8, 8)
	}
	names := []string{"report size", "report iterations", "report peak bandwidth", "report average bandwidth",
		"report message rate", "report port 1 bandwidth", "report port 1 message rate",
		"report port 2 bandwidth", "report port 2 message rate"}
	off := 0
	for i, n := range sizes {
		if err := s.exchange(ctx, out[off:off+n], in[off:off+n], names[i], true); err != nil {
			return BWReport{}, err
		}
		off += n
	}
	return ParseBWReport(in, itersLen, s.cfg.ReportPerPort)
}

// Close is ctx_close_connection: a final key exchange, then each side
// writes "done\0" and closes. perftest never reads the peer's "done"; Close
// reads it to catch a confused peer, but a peer that closes without sending
// it is fine. The connection is closed in every case.
func (s *Session) Close(ctx context.Context, local Key) error {
	return s.close(ctx, local, true)
}

func (s *Session) close(ctx context.Context, local Key, bounded bool) error {
	defer s.s.close()
	if _, err := s.handShake(ctx, local, "closing key message", bounded); err != nil {
		return err
	}
	if err := s.s.writeMsg(ctx, PerftestDoneMsg[:], "done message"); err != nil {
		return err
	}
	var in [len(PerftestDoneMsg)]byte
	err := s.s.readMsg(ctx, in[:], "done message", true)
	var se *stepError
	if errors.Is(err, ErrClosed) && errors.As(err, &se) && se.got == 0 {
		return nil // closed right after its final key message
	}
	if err != nil {
		return err
	}
	if in != PerftestDoneMsg {
		return errorf(s.s.peer, ErrMalformed, "sent %s instead of \"done\\x00\"", quoteMsg(in[:]))
	}
	return nil
}

// CloseWithoutExchange closes the connection with no final exchange, as
// ib_write_lat does at the end of its run (and as anyone does on error).
func (s *Session) CloseWithoutExchange() error { return s.s.close() }
