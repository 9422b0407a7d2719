package daemon

// perftest's rdma_cm mode (-R) has no TCP: its out-of-band exchange runs
// over a "control" RC connection that rdma_cm sets up first, on the same
// port as the test connections that follow (18515 by default), as SENDs of
// exactly the size of each message, one each way at a time (the client
// writes first, the server reads and answers the same size; each side
// keeps one receive of sizeof(struct pingpong_dest) = 56 bytes posted).
// The messages are those of the TCP exchange (pkg/oob's codecs) except
// the keys, which are binary (rdmacm_key.go), and the end, where no
// "done" follows the last key. Measured on
// /work/shared/pcaps/perftest_write_bw_rc_4096_rdmacm.pcap,
// rdmacm_read_bw_R.pcap and rdmacm_send_bw_R.pcap:
//
//	control: REQ/REP/RTU (responder resources and initiator depth 0,
//	         retry 7, RNR retry 7, no private data)
//	version 16, cycle buffer 4, cache line 4, MTU 2       (Negotiate)
//	key 56 of zeros                                       (HandShake)
//	test QPs: REQ/REP/RTU per QP (out_reads both ways for read/atomic)
//	key 56 of zeros                                       (HandShake)
//	key 56 per QP, then 2 (write/read/atomic bw) or 3 barriers
//	... run ...
//	key 56, report 8+8+8+8+8 (write/read/atomic bw)       (Finish)
//	key 56 (all but ib_write_lat)                          (Finish)
//	DREQ/DREP: the test connections (the client), then the control one
//
// CMControl is that control connection. Both rxed perf -R and rxed serve's
// rdma_cm listener use it.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/oob"
	"github.com/rxed/rxed/pkg/rdmacm"
	"github.com/rxed/rxed/pkg/roce"
)

// Control QP resources: one send slot and cmCtrlRecvs receive slots of
// cmCtrlSlot bytes (perftest posts one of 56; more costs nothing and
// keeps a confused peer from an RNR loop).
const (
	cmCtrlSlot  = 64
	cmCtrlRecvs = 4
	cmCtrlSend  = ^uint64(0) // wr_id of the send
	// cmCtrlKeepAlive is the wr_id of a keepalive (CMControlConfig.KeepAlive).
	cmCtrlKeepAlive = ^uint64(0) - 1
)

// CMControlConfig configures a CMControl.
type CMControlConfig struct {
	Role     oob.Role      // the client (Dial side) writes first
	Timeout  time.Duration // bound of every step but an idle server's wait (0: oob.DefaultTimeout)
	GIDIndex int           // the gid_index field of our keys (perftest's -x)
	// DontXchgVersions mirrors --dont_xchg_versions.
	DontXchgVersions bool
	// MaxMsg bounds what the peer may send in one message (0: 56, the
	// largest perftest sends); a longer SEND fails the receive.
	MaxMsg int
	// KeepAlive is how long an idle server's unbounded wait (Finish's,
	// through the client's run) may see no completion before it probes
	// the peer with a signaled zero-length RDMA WRITE on the control QP,
	// as rsockets and examples/kv do: it needs no memory or rkey at the
	// peer (IBA 9.4.4, C9-88; rdma_cm's QPs allow remote writes) and no
	// receive, so perftest's QP ACKs it like rxed's. A peer that vanished
	// without a DREQ (SIGKILL, host lost) leaves it unacknowledged, the
	// QP's retries run out, and the wait ends with an error within
	// KeepAlive plus the retries, where it waited for ever. 0 or
	// negative: no probes.
	KeepAlive time.Duration
	// Clock times KeepAlive (nil: the system clock).
	Clock roce.Clock
	// Log gets the keepalives at debug level (nil: none).
	Log *slog.Logger
	// Test is this side's test (rxed perf -R; nil: none, serve). A
	// client announces it in its version message (rxed's trailer, past
	// the NUL perftest reads to); a server refuses a client that
	// announces another there, both sides failing with an error naming
	// the two tests (as oob.SessionConfig.Test over TCP). A perftest
	// peer sends and reads nothing new.
	Test *oob.Test
}

// CMControl is the control connection of one perftest -R session.
//
// It is not safe for concurrent use, except Close after the exchange
// has stopped. The QP, CQ and buffer are its own.
type CMControl struct {
	cfg   CMControlConfig
	qp    *ib.QP
	cq    *ib.CQ
	mr    *ib.MR
	buf   []byte // slot 0 sends, slots 1.. receive
	conn  *rdmacm.Conn
	done  <-chan struct{} // conn.Done(): closed once the connection has ended
	peer  string
	inbox [][]byte // received, not yet read
	wcs   [8]ib.WC

	sendBusy      bool
	bytesIn       int64
	remoteVersion string

	kaTimer roce.Timer // KeepAlive's, made at the first idle wait
	probing bool       // a keepalive is outstanding
}

// NewCMControl creates the control QP (RC, in INIT with its receives
// posted, ready for rdmacm.Dial or Request.Accept) on pd.
func NewCMControl(dev *ib.Device, pd *ib.PD, cfg CMControlConfig) (c *CMControl, err error) {
	if cfg.Timeout == 0 {
		cfg.Timeout = oob.DefaultTimeout
	}
	if cfg.MaxMsg <= 0 || cfg.MaxMsg > cmCtrlSlot {
		cfg.MaxMsg = CMKeyLen
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	c = &CMControl{cfg: cfg, buf: make([]byte, cmCtrlSlot*(1+cmCtrlRecvs)), remoteVersion: oob.PerftestVersion}
	made := c // a failing return sets c to nil before this runs
	defer func() {
		if err != nil {
			made.Close()
		}
	}()
	if c.cq, err = dev.CreateCQ(2 * (1 + cmCtrlRecvs)); err != nil {
		return nil, err
	}
	if c.mr, err = pd.RegMR(c.buf, ib.AccessLocalWrite); err != nil {
		return nil, err
	}
	if c.qp, err = pd.CreateQP(ib.QPInitAttr{Type: ib.RC, SendCQ: c.cq, RecvCQ: c.cq,
		Cap: ib.QPCap{MaxSendWR: 2, MaxRecvWR: cmCtrlRecvs, MaxSendSGE: 1, MaxRecvSGE: 1}}); err != nil {
		return nil, err
	}
	if err = ib.InitQP(c.qp, ib.ConnectAttr{AccessFlags: ib.AccessRemoteWrite}); err != nil {
		return nil, fmt.Errorf("control QP to INIT: %v", err)
	}
	for i := 1; i <= cmCtrlRecvs; i++ {
		if err = c.postRecv(i); err != nil {
			return nil, err
		}
	}
	return c, nil
}

// QP is the control QP, to Dial or Accept with.
func (c *CMControl) QP() *ib.QP { return c.qp }

// Attach records the established connection of the control QP; waits
// end early when it is disconnected.
func (c *CMControl) Attach(conn *rdmacm.Conn) {
	c.conn = conn
	c.done = conn.Done()
	c.peer = conn.RemoteAddr().String()
}

// Conn is the attached connection (nil before Attach).
func (c *CMControl) Conn() *rdmacm.Conn { return c.conn }

// BytesRead is how many bytes the peer has sent over the control
// connection.
func (c *CMControl) BytesRead() int64 { return c.bytesIn }

// RemoteVersion is the peer's version string (ours until exchanged).
func (c *CMControl) RemoteVersion() string { return c.remoteVersion }

// Close destroys the QP and CQ and deregisters the buffer; disconnect
// first (the QP is simply destroyed otherwise).
func (c *CMControl) Close() {
	if c.qp != nil {
		_ = c.qp.Destroy()
	}
	if c.cq != nil {
		_ = c.cq.Destroy()
	}
	if c.mr != nil {
		_ = c.mr.Dereg()
	}
}

func (c *CMControl) slot(i int) []byte { return c.buf[i*cmCtrlSlot : (i+1)*cmCtrlSlot] }

func (c *CMControl) postRecv(i int) error {
	wr := ib.RecvWR{ID: uint64(i), SGL: []ib.SGE{{Addr: c.mr.IOVA() + uint64(i*cmCtrlSlot), Length: uint32(c.cfg.MaxMsg), LKey: c.mr.LKey()}}}
	if err := c.qp.PostRecv(wr); err != nil {
		return fmt.Errorf("posting a control receive: %v", err)
	}
	return nil
}

// errorf names the peer and the step, wrapping one of oob's sentinels.
func (c *CMControl) errorf(cause error, what, format string, a ...any) error {
	return fmt.Errorf("rdma_cm control connection with %s: %s: %s: %w", c.peer, what, fmt.Sprintf(format, a...), cause)
}

// refusedf is errorf for a refusal whose words already say so: it wraps
// oob.ErrRefused without appending its text, which read "...: refused;
// run the same test on both sides: refused by the server" (and said "by
// the server" of the server's own refusal).
func (c *CMControl) refusedf(what, format string, a ...any) error {
	return &refusal{msg: fmt.Sprintf("rdma_cm control connection with %s: %s: %s", c.peer, what, fmt.Sprintf(format, a...))}
}

// refusal is an error that is oob.ErrRefused in other words.
type refusal struct{ msg string }

func (e *refusal) Error() string { return e.msg }
func (e *refusal) Unwrap() error { return oob.ErrRefused }

// wait handles the next completions: at most the step timeout when
// bounded, never longer than ctx or the connection.
func (c *CMControl) wait(ctx context.Context, bounded bool, what string) error {
	if n := c.cq.Poll(c.wcs[:]); n > 0 {
		return c.handle(n, what)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if bounded {
		var cancelT context.CancelFunc
		wctx, cancelT = context.WithTimeout(wctx, c.cfg.Timeout)
		defer cancelT()
	}
	// An idle server's wait (unbounded) is cut every KeepAlive to probe
	// the peer; probeDue closes when that happens.
	var idle <-chan time.Time
	probeDue := make(chan struct{})
	if !bounded && c.cfg.KeepAlive > 0 {
		if c.kaTimer == nil {
			clk := c.cfg.Clock
			if clk == nil {
				clk = roce.SystemClock{}
			}
			c.kaTimer = clk.NewTimer()
		}
		c.kaTimer.Reset(c.cfg.KeepAlive)
		defer c.kaTimer.Stop()
		idle = c.kaTimer.C()
	}
	done := c.done
	if done != nil || idle != nil {
		// The watcher is gone when wait returns: one left behind could
		// take the next wait's keepalive firing, and that wait would
		// never probe.
		stop, exited := make(chan struct{}), make(chan struct{})
		defer func() { close(stop); <-exited }()
		go func() {
			defer close(exited)
			select {
			case <-done: // nil before Attach: never
				cancel()
			case <-idle: // nil unless probing: never
				close(probeDue)
				cancel()
			case <-stop:
			}
		}()
	}
	n, err := c.cq.WaitPoll(wctx, c.wcs[:])
	if n > 0 {
		return c.handle(n, what)
	}
	select {
	case <-done:
		if n := c.cq.Poll(c.wcs[:]); n > 0 {
			return c.handle(n, what)
		}
		return c.errorf(oob.ErrClosed, what, "the peer disconnected")
	default:
	}
	if ctx.Err() != nil {
		return c.errorf(oob.ErrCanceled, what, "%v", ctx.Err())
	}
	select {
	case <-probeDue:
		return c.probe(what) // the caller waits again
	default:
	}
	if err == nil || errors.Is(err, context.DeadlineExceeded) {
		return c.errorf(oob.ErrTimeout, what, "nothing within %v", c.cfg.Timeout)
	}
	return c.errorf(oob.ErrClosed, what, "%v", err)
}

// probe posts a keepalive, unless one is still outstanding (its retries
// outlast KeepAlive): a signaled zero-length RDMA WRITE, which handle
// sees complete or fail.
func (c *CMControl) probe(what string) error {
	if c.probing {
		return nil
	}
	if err := c.qp.PostSend(ib.SendWR{ID: cmCtrlKeepAlive, Opcode: ib.WRRDMAWrite, Flags: ib.SendSignaled}); err != nil {
		return c.errorf(oob.ErrClosed, what, "posting a keepalive: %v", err)
	}
	c.probing = true
	c.cfg.Log.Debug("rdma_cm control keepalive sent", "peer", c.peer, "idle", c.cfg.KeepAlive)
	return nil
}

func (c *CMControl) handle(n int, what string) error {
	for _, wc := range c.wcs[:n] {
		if wc.ID == cmCtrlKeepAlive {
			c.probing = false
			if wc.Status == ib.WCSuccess {
				c.cfg.Log.Debug("rdma_cm control keepalive acknowledged", "peer", c.peer)
				continue
			}
		}
		if wc.Status == ib.WCWRFlushErr && c.ended() {
			// The peer disconnected: the QP went to ERR and flushed
			// what was outstanding. A flushed SEND is the last message
			// of the exchange, whose ACK was lost while the peer, which
			// had read it, closed (the client disconnects right after
			// the final key): done, not failed. If the peer left before
			// reading it, the next step's receive reports the
			// disconnection; flushed receives carry nothing.
			if wc.ID == cmCtrlSend {
				c.sendBusy = false
			}
			continue
		}
		if wc.Status != ib.WCSuccess {
			return c.completionError(what, wc)
		}
		if wc.ID == cmCtrlSend {
			c.sendBusy = false
			continue
		}
		i := int(wc.ID)
		if i < 1 || i > cmCtrlRecvs {
			continue
		}
		c.inbox = append(c.inbox, append([]byte(nil), c.slot(i)[:wc.ByteLen]...))
		c.bytesIn += int64(wc.ByteLen)
		if err := c.postRecv(i); err != nil {
			return c.errorf(oob.ErrClosed, what, "%v", err)
		}
	}
	return nil
}

// completionError is a failed completion of the control QP as the
// operator reads it: a keepalive, or our SEND, that the QP's retries
// never got acknowledged says the peer is gone without a DREQ (rping and
// perftest print only "status 12"); anything else is named as it is.
func (c *CMControl) completionError(what string, wc ib.WC) error {
	const gone = "so its process was killed or its host is gone"
	switch {
	case wc.ID == cmCtrlKeepAlive:
		return c.errorf(oob.ErrClosed, what, "the peer stopped answering: the keepalive on the idle connection "+
			"(a zero-length RDMA WRITE) ended in %v, "+gone, wc.Status)
	case wc.Status == ib.WCRetryExcErr:
		return c.errorf(oob.ErrClosed, what, "the peer stopped answering: our SEND on the control connection "+
			"ended in %v (no ACK through the QP's retries), "+gone, wc.Status)
	}
	return c.errorf(oob.ErrClosed, what, "control QP completion %v", wc.Status)
}

// ended reports whether the attached connection has ended, waiting up
// to flushGrace for it: rdma_cm moves the QP to ERR on the peer's DREQ
// before the connection's end is published, so a flush can be seen
// first.
func (c *CMControl) ended() bool {
	if c.done == nil {
		return false
	}
	t := time.NewTimer(flushGrace)
	defer t.Stop()
	select {
	case <-c.done:
		return true
	case <-t.C:
		return false
	}
}

// flushGrace bounds ended's wait for a disconnection that flushed the QP.
const flushGrace = time.Second

// send sends msg as one SEND and waits for its completion.
func (c *CMControl) send(ctx context.Context, msg []byte, what string) error {
	if len(msg) > cmCtrlSlot {
		return fmt.Errorf("control message %s of %d bytes: at most %d", what, len(msg), cmCtrlSlot)
	}
	copy(c.slot(0), msg)
	wr := ib.SendWR{ID: cmCtrlSend, Opcode: ib.WRSend, Flags: ib.SendSignaled,
		SGL: []ib.SGE{{Addr: c.mr.IOVA(), Length: uint32(len(msg)), LKey: c.mr.LKey()}}}
	if err := c.qp.PostSend(wr); err != nil {
		return c.errorf(oob.ErrClosed, what, "posting the send: %v", err)
	}
	c.sendBusy = true
	for c.sendBusy {
		if err := c.wait(ctx, true, what); err != nil {
			return err
		}
	}
	return nil
}

// recv returns the peer's next message, which must be n bytes.
func (c *CMControl) recv(ctx context.Context, n int, what string, bounded bool) ([]byte, error) {
	for len(c.inbox) == 0 {
		if err := c.wait(ctx, bounded, what); err != nil {
			return nil, err
		}
	}
	m := c.inbox[0]
	c.inbox = c.inbox[1:]
	if len(m) != n {
		return nil, c.errorf(oob.ErrMalformed, what, "the peer sent %d bytes, want %d", len(m), n)
	}
	return m, nil
}

// xchg is perftest's ctx_xchg_data: the client sends then reads, the
// server reads then answers; both messages have len(my) bytes.
func (c *CMControl) xchg(ctx context.Context, my []byte, what string, bounded bool) ([]byte, error) {
	return c.xchgThen(ctx, my, what, bounded, nil)
}

// xchgThen is xchg; a server calls beforeAnswer (if not nil) between
// reading the peer's message and answering it, and answers only if it
// returns nil.
func (c *CMControl) xchgThen(ctx context.Context, my []byte, what string, bounded bool, beforeAnswer func() error) ([]byte, error) {
	if c.cfg.Role == oob.Client {
		if err := c.send(ctx, my, what); err != nil {
			return nil, err
		}
		return c.recv(ctx, len(my), what, true)
	}
	m, err := c.recv(ctx, len(my), what, bounded)
	if err != nil {
		return nil, err
	}
	if beforeAnswer != nil {
		if err := beforeAnswer(); err != nil {
			return nil, err
		}
	}
	return m, c.send(ctx, my, what)
}

// Negotiate is exchange_versions, check_sys_data and check_mtu (as
// oob.Session.Negotiate): localMTU is our ibv_mtu enum.
func (c *CMControl) Negotiate(ctx context.Context, localMTU int) (oob.Negotiated, error) {
	neg := oob.Negotiated{RemoteVersion: oob.PerftestVersion, SysData: oob.SysData{CycleBuffer: 4096, CacheLineSize: 64}, MTU: localMTU}
	if c.cfg.DontXchgVersions {
		return neg, nil
	}
	var v [oob.VersionMsgLen]byte
	_ = oob.EncodeVersion(v[:], oob.PerftestVersion)
	if c.cfg.Test != nil && c.cfg.Role == oob.Client {
		oob.AnnounceTest(v[:], *c.cfg.Test)
	}
	var m []byte
	var err error
	if c.cfg.Test != nil && c.cfg.Role == oob.Server {
		m, err = c.versionCheckingTest(ctx, v[:])
	} else {
		m, err = c.xchg(ctx, v[:], "version", true)
	}
	if err != nil {
		return neg, err
	}
	if theirs, known, ok := oob.OtherTest(m); ok && c.cfg.Role == oob.Client && c.cfg.Test != nil {
		if !known {
			return neg, c.refusedf("version", "the server runs another test: refused; run the same test on both sides")
		}
		return neg, c.refusedf("version", "the server runs %s, we run %s: refused; run the same test on both sides",
			theirs, *c.cfg.Test)
	}
	rv, err := oob.ParseVersion(m)
	if err != nil {
		return neg, c.errorf(oob.ErrMalformed, "version", "%v", err)
	}
	c.remoteVersion, neg.RemoteVersion = rv, rv
	if oob.VersionNumber(rv) < oob.MinPerftestVersion {
		return neg, c.errorf(oob.ErrVersion, "version", "the peer runs %q, older than %.2f", rv, oob.MinPerftestVersion)
	}
	for _, f := range []struct {
		what string
		v    *uint32
	}{{"cycle buffer", &neg.SysData.CycleBuffer}, {"cache line size", &neg.SysData.CacheLineSize}} {
		var b [oob.SysDataMsgLen]byte
		binary.BigEndian.PutUint32(b[:], *f.v)
		m, err := c.xchg(ctx, b[:], f.what, true)
		if err != nil {
			return neg, err
		}
		*f.v = max(*f.v, binary.BigEndian.Uint32(m))
	}
	var mb [oob.MTUMsgLen]byte
	_ = oob.EncodeMTU(mb[:], localMTU)
	if m, err = c.xchg(ctx, mb[:], "MTU", true); err != nil {
		return neg, err
	}
	if rm, ok := oob.ParseMTU(m); ok && rm < localMTU {
		neg.MTU = rm
	}
	return neg, nil
}

// versionCheckingTest is a server's version exchange with Test set: it
// reads the client's version message and answers with v, made a refusal
// (oob.PutOtherTest) when the client announced another test than ours,
// in which case, once that is sent, it fails naming both.
func (c *CMControl) versionCheckingTest(ctx context.Context, v []byte) ([]byte, error) {
	m, err := c.recv(ctx, len(v), "version", true)
	if err != nil {
		return nil, err
	}
	mine := *c.cfg.Test
	theirs, announced := oob.AnnouncedTest(m)
	other := announced && theirs != mine
	if other {
		oob.PutOtherTest(v, mine)
	}
	if err := c.send(ctx, v, "version"); err != nil {
		return nil, err
	}
	if other {
		return nil, c.refusedf("version", "the client runs %s, this server %s: refused; run the same test on both sides",
			theirs, mine)
	}
	return m, nil
}

// HandShake is ctx_hand_shake with binary keys: one each way. bounded
// false leaves the wait for the peer to ctx alone (an idle server waiting
// for the client's run).
func (c *CMControl) HandShake(ctx context.Context, k oob.Key, bounded bool) (oob.Key, error) {
	return c.handShakeThen(ctx, k, bounded, nil)
}

// handShakeThen is HandShake with xchgThen's beforeAnswer.
func (c *CMControl) handShakeThen(ctx context.Context, k oob.Key, bounded bool, beforeAnswer func() error) (oob.Key, error) {
	gidx := c.cfg.GIDIndex
	if k == (oob.Key{}) {
		gidx = 0 // perftest's all-zero my_dest of the hand shakes around the CM connection
	}
	m, err := c.xchgThen(ctx, AppendCMKey(nil, k, gidx), "key message", bounded, beforeAnswer)
	if err != nil {
		return oob.Key{}, err
	}
	rk, err := ParseCMKey(m)
	if err != nil {
		return oob.Key{}, c.errorf(oob.ErrMalformed, "key message", "%v", err)
	}
	return rk, nil
}

// ExchangeBWReports is xchg_bw_reports: each field its own exchange.
func (c *CMControl) ExchangeBWReports(ctx context.Context, my oob.BWReport) (oob.BWReport, error) {
	itersLen := oob.ReportItersLen(oob.VersionNumber(c.remoteVersion))
	all := oob.AppendBWReport(nil, my, itersLen, false)
	sizes := []int{8, itersLen, 8, 8, 8}
	var got []byte
	for i, off := 0, 0; i < len(sizes); off, i = off+sizes[i], i+1 {
		m, err := c.xchg(ctx, all[off:off+sizes[i]], "bandwidth report", true)
		if err != nil {
			return oob.BWReport{}, err
		}
		got = append(got, m...)
	}
	rep, err := oob.ParseBWReport(got, itersLen, false)
	if err != nil {
		return oob.BWReport{}, c.errorf(oob.ErrMalformed, "bandwidth report", "%v", err)
	}
	return rep, nil
}

// Finish runs the exchanges after the test, as oob.Session.Finish does
// over TCP, without the "done" (rdma_cm mode has none): for
// write/read/atomic bandwidth a key and the reports (the peer's is
// returned), then the closing key unless the test is ib_write_lat. An
// idle server's first wait is bounded by ctx alone.
func (c *CMControl) Finish(ctx context.Context, t oob.Test, local oob.Key, my oob.BWReport) (oob.BWReport, error) {
	var remote oob.BWReport
	bounded := !(c.cfg.Role == oob.Server && t.ServerIdles())
	if t.ExchangesReports() {
		if _, err := c.HandShake(ctx, local, bounded); err != nil {
			return remote, err
		}
		bounded = true
		var err error
		if remote, err = c.ExchangeBWReports(ctx, my); err != nil {
			return remote, err
		}
	}
	if !t.ClosesWithExchange() {
		return remote, nil
	}
	_, err := c.HandShake(ctx, local, bounded)
	return remote, err
}
