//go:build linux

package transport

import (
	"errors"
	"net/netip"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The Linux implementation calls recvmmsg/sendmmsg itself on preallocated
// mmsghdr arrays instead of going through x/net's ipv4/ipv6 ReadBatch: x/net
// allocates a *net.UDPAddr (and its IP slice) for every received message,
// which would break the zero-allocation data path. The technique is the same
// (syscall.RawConn.Read/Write around a non-blocking mmsg call, so Go's
// netpoller does the waiting).

// mmsghdr is struct mmsghdr; Go pads it to the kernel's size on every
// architecture (Msghdr's alignment).
type mmsghdr struct {
	hdr unix.Msghdr
	len uint32
}

type rxBatchSys struct {
	hdrs  []mmsghdr
	iovs  []unix.Iovec
	names []unix.RawSockaddrInet6 // large enough for either family
	oob   []byte
	bufs  [][]byte
}

func newRxBatch(s *udpSocket, batchSize int) *rxBatch {
	slots := batchSize
	if s.sys.gro {
		// Each slot may carry many coalesced datagrams; fewer, larger
		// slots keep memory per socket near that of the plain case.
		slots = max(4, batchSize/4)
	}
	b := &rxBatch{sock: s, msgs: make([]rxMsg, slots)}
	y := &b.sys
	y.hdrs = make([]mmsghdr, slots)
	y.iovs = make([]unix.Iovec, slots)
	y.names = make([]unix.RawSockaddrInet6, slots)
	y.oob = make([]byte, slots*rxOOBSize)
	y.bufs = make([][]byte, slots)
	mem := make([]byte, slots*s.slotSz)
	for i := range slots {
		y.bufs[i] = mem[i*s.slotSz : (i+1)*s.slotSz : (i+1)*s.slotSz]
		y.iovs[i].Base = &y.bufs[i][0]
		y.iovs[i].SetLen(s.slotSz)
		h := &y.hdrs[i].hdr
		h.Name = (*byte)(unsafe.Pointer(&y.names[i]))
		h.Iov = &y.iovs[i]
		h.SetIovlen(1)
		h.Control = &y.oob[i*rxOOBSize]
	}
	return b
}

// readBatch blocks until the socket has data, then receives as many messages
// as are queued (up to the batch's slots) and parses them into b.msgs.
func (s *udpSocket) readBatch(b *rxBatch) (int, error) {
	s.prepareRead(b)
	if err := s.sys.rc.Read(s.sys.recvFn); err != nil {
		return 0, err
	}
	return s.finishRead(b)
}

// readBatchHooked is readBatch for a socket that pollers read too: each
// attempt to take datagrams from the kernel first calls hold, which takes
// the locks that order the socket's receivers and reports whether to go
// on (false: return 0 with the locks held, something else is to be handed
// out first); an attempt that finds nothing calls release before it waits.
// held reports whether the locks are held on return (always, unless err
// comes from waiting: the socket was closed).
func (s *udpSocket) readBatchHooked(b *rxBatch, hold func() bool, release func()) (n int, held bool, err error) {
	s.resetSlots(b)
	y := &s.sys
	y.hold, y.release, y.held = hold, release, false
	y.hookHdrs = b.sys.hdrs // rxHdrs is the pollers' too: set under the locks
	err = y.rc.Read(y.hookedFn)
	y.hold, y.release, y.hookHdrs = nil, nil, nil
	if err != nil || !y.held {
		return 0, false, err
	}
	if y.skipped {
		return 0, true, nil
	}
	n, err = s.finishRead(b)
	return n, true, err
}

// pollBatch receives into b what the kernel has queued, without waiting:
// 0 when nothing is. The caller serialises it with the socket's other
// receivers.
func (s *udpSocket) pollBatch(b *rxBatch) (int, error) {
	s.prepareRead(b)
	y := &s.sys
	y.polled = false
	if err := y.rc.Control(y.pollFn); err != nil {
		return 0, err
	}
	if !y.polled {
		return 0, nil
	}
	return s.finishRead(b)
}

// prepareRead points the receive call at b's slots, reset for the kernel.
func (s *udpSocket) prepareRead(b *rxBatch) {
	s.resetSlots(b)
	s.sys.rxHdrs = b.sys.hdrs
}

// resetSlots readies b's slots for the kernel.
func (s *udpSocket) resetSlots(b *rxBatch) {
	y := &b.sys
	for i := range y.hdrs {
		h := &y.hdrs[i].hdr
		h.Namelen = unix.SizeofSockaddrInet6
		h.SetControllen(rxOOBSize)
		h.Flags = 0
		y.hdrs[i].len = 0
	}
}

// finishRead parses what the receive call put into b.
func (s *udpSocket) finishRead(b *rxBatch) (int, error) {
	y := &b.sys
	if s.sys.rxErr != nil {
		return 0, os.NewSyscallError("recvmmsg", s.sys.rxErr)
	}
	n := s.sys.rxN
	for i := range n {
		h := &y.hdrs[i]
		m := &b.msgs[i]
		m.data = y.bufs[i][:h.len]
		m.trunc = h.hdr.Flags&unix.MSG_TRUNC != 0
		m.remote = sockaddrToAddrPort(&y.names[i])
		m.local = s.addr
		m.segSize = 0
		m.class, m.hops, m.flow = 0, 0, 0
		s.parseCmsgs(m, y.oob[i*rxOOBSize:i*rxOOBSize+int(h.hdr.Controllen)])
		if m.segSize > 0 && m.segSize < len(m.data) {
			s.conn.stats.groReceives.Add(1)
		}
	}
	return n, nil
}

// recvHooked is readBatchHooked's attempt (see there).
func (y *sockSys) recvHooked(fd uintptr) bool {
	if !y.hold() {
		y.held, y.skipped = true, true
		return true
	}
	y.rxHdrs = y.hookHdrs
	if y.recv(fd) {
		y.held, y.skipped = true, false
		return true
	}
	y.release()
	return false
}

// recvPolled is pollBatch's attempt.
func (y *sockSys) recvPolled(fd uintptr) { y.polled = y.recv(fd) }

func (y *sockSys) recv(fd uintptr) bool {
	n, done, err := mmsgCall(unix.SYS_RECVMMSG, fd, y.rxHdrs, unix.MSG_DONTWAIT)
	if done {
		y.rxN, y.rxErr = n, err
	}
	return done
}

// mmsgCall is one recvmmsg or sendmmsg on hdrs (sockCall). No headers:
// n 0.
func mmsgCall(trap uintptr, fd uintptr, hdrs []mmsghdr, flags int) (n int, done bool, err error) {
	if len(hdrs) == 0 {
		return 0, true, nil
	}
	return sockCall(trap, fd, unsafe.Pointer(&hdrs[0]), uintptr(len(hdrs)), uintptr(flags), nil, 0)
}

// sockCall is one non-blocking socket system call on fd, retried on
// EINTR; p2 and p5 are its pointer arguments (the second and fifth),
// converted in the call itself as unsafe.Pointer's rules ask. done is
// false when the socket would block (the caller waits), else n or err
// is the call's outcome.
func sockCall(trap, fd uintptr, p2 unsafe.Pointer, a3, a4 uintptr, p5 unsafe.Pointer, a6 uintptr) (n int, done bool, err error) {
	for {
		r, _, e := unix.Syscall6(trap, fd, uintptr(p2), a3, a4, uintptr(p5), a6)
		if e != unix.EINTR {
			return sockOutcome(r, e)
		}
	}
}

// sockOutcome is what a socket call that returned r and e (not EINTR)
// came to, as sockCall reports it.
func sockOutcome(r uintptr, e unix.Errno) (n int, done bool, err error) {
	switch e {
	case 0:
		return int(r), true, nil
	case unix.EAGAIN:
		return 0, false, nil
	default:
		return 0, true, e
	}
}

// rawSendMax is the largest datagram sendOne sends without telling the
// runtime it enters a system call (sockCallRaw).
const rawSendMax = 1024

// sockCallRaw is sockCall without the runtime's entersyscall and
// exitsyscall, for a non-blocking send of one short datagram: on loopback
// the call delivers it to the receiving socket and returns within a
// microsecond or two, shorter than the runtime could use a hand-off of
// the P for, and the pair costs about 30 ns a call, 1% of an 8-byte WRITE
// round trip's two sends (docs/performance.md, session R). Long sends
// (GSO runs of 64 KiB) keep sockCall: without exitsyscall's bookkeeping
// the runtime cannot hand their P to another thread, which cost a 1-QP
// 64 KiB stream a quarter of its bandwidth when every call was raw
// (session P).
func sockCallRaw(trap, fd uintptr, p2 unsafe.Pointer, a3, a4 uintptr, p5 unsafe.Pointer, a6 uintptr) (n int, done bool, err error) {
	for {
		r, _, e := unix.RawSyscall6(trap, fd, uintptr(p2), a3, a4, uintptr(p5), a6)
		if e != unix.EINTR {
			return sockOutcome(r, e)
		}
	}
}

// writeBatch sends bufs (or, when bufs is nil, dgrams) to one destination
// with sendmmsg, packing runs of equal-sized datagrams into single
// UDP_SEGMENT messages when GSO is on. A valid from (only for
// wildcard-bound sockets) sets the source address, a non-zero tr the
// TOS and TTL (traffic class and hop limit) of every datagram, as control
// messages of each message (a GSO message's segments all get them). A
// datagram the kernel refuses does not stop the others: the error
// returned is a *SendError
// naming the refused ones (their positions in bufs or dgrams) with the
// first refusal, the rest of the batch having been sent; a socket closed
// mid-batch refuses the rest, and its error is the one reported. sent and
// sentBytes count the datagrams that went (every other one was refused),
// each once: a GSO message the kernel refused is sent again one datagram
// at a time and counts as those.
func (s *udpSocket) writeBatch(bufs [][]byte, dgrams []Gather, to netip.AddrPort, from netip.Addr, tr ipTraffic) (sent int, sentBytes uint64, err error) {
	y := &s.sys
	y.txMu.Lock()
	defer y.txMu.Unlock()
	y.setName(to, s.is6)
	ifindex := y.sourceIndex(from, to.Addr())
	y.setSource(from, s.is6, ifindex)
	y.setTraffic(s.is6, tr)
	maxGSO := maxGSOBytes(s.is6)
	gso := y.gso.Load() && gsoAllowed(s.is6, to.Addr())
	src := txSource{bufs: bufs, dgrams: dgrams}
	total := src.n()
	base := 0       // position in the call of src's first datagram
	var rf refusals // the datagrams the kernel refused
	for src.n() > 0 {
		nm, used := y.pack(&src, gso, maxGSO)
		y.txOff, y.txEnd = 0, nm
		for y.txOff < y.txEnd {
			if err := y.rc.Write(y.sendFn); err != nil {
				// Closed: the rest of the call is refused, and the
				// caller hears of the close rather than of an earlier
				// refusal.
				pos := base + y.msgPos(y.txOff)
				rf.add(pos, total-pos, err)
				rf.first = err
				return sent, sentBytes, rf.err()
			}
			if y.txErr != nil {
				msgGSO := y.txSegs[y.txOff] > 1
				if !msgGSO || !gsoRefusal(y.txErr) {
					// The kernel judges each message on its own
					// (EMSGSIZE: a datagram over the path MTU, which
					// IP_PMTUDISC_DO refuses): the rest of the batch
					// still goes, as rdma_rxe's packets, each sent
					// alone, would. The first refusal is reported.
					rf.add(base+y.msgPos(y.txOff), y.txSegs[y.txOff], os.NewSyscallError("sendmmsg", y.txErr))
					y.txOff++
					continue
				}
				// The kernel or device refused segmentation offload: resend
				// the rest of this call one datagram per message (those
				// that fit the path MTU then go). EIO means the device
				// cannot do it at all (no checksum offload).
				if errors.Is(y.txErr, unix.EIO) {
					y.gso.Store(false)
					s.conn.log.Warn("transport: UDP GSO refused, disabled", "local", s.local, "err", y.txErr)
				}
				gso = false
				used = y.msgPos(y.txOff)
				break
			}
			for i := y.txOff; i < y.txOff+y.txN; i++ {
				if y.txSegs[i] > 1 {
					s.conn.stats.gsoSends.Add(1)
				}
				sent += y.txSegs[i]
				sentBytes += uint64(y.txBytes[i])
			}
			y.txOff += y.txN
		}
		src.skip(used)
		base += used
	}
	if rf.first != nil && ifindex != 0 {
		y.scopes.forget(from.WithZone("")) // perhaps on another interface by now
	}
	return sent, sentBytes, rf.err()
}

// msgPos is the position, among the datagrams packed into the current
// messages, of message m's first datagram.
func (y *sockSys) msgPos(m int) int {
	pos := 0
	for _, k := range y.txSegs[:m] {
		pos += k
	}
	return pos
}

// sourceIndex is the interface a send from a socket bound to :: leaves
// on: for a link-local destination the one that has the source address
// (scope_linux.go), else 0 (the kernel's routing decides).
func (y *sockSys) sourceIndex(from, to netip.Addr) uint32 {
	if y.scopes == nil || !from.IsValid() || !to.IsLinkLocalUnicast() {
		return 0
	}
	return y.scopes.index(from.WithZone(""))
}

// gsoRefusal reports whether err, refusing a UDP_SEGMENT message, may be
// about the segmentation, so that its datagrams are sent again one by
// one: EIO, the device cannot segment (no checksum offload); EINVAL, too
// many segments, or, on older kernels, segments longer than the path MTU
// allows; EMSGSIZE, what udp_send_skb says for the latter since a 2024
// change (backported to the stable kernels; this VM's 6.18 does). Sent
// alone, the datagrams of the run that fit the MTU (its shorter last
// one) still go.
func gsoRefusal(err error) bool {
	return errors.Is(err, unix.EIO) || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EMSGSIZE)
}

// txSource is what writeBatch sends: whole datagrams or Gather ones.
type txSource struct {
	bufs   [][]byte
	dgrams []Gather
}

func (t *txSource) n() int {
	if t.bufs != nil {
		return len(t.bufs)
	}
	return len(t.dgrams)
}

func (t *txSource) len(i int) int {
	if t.bufs != nil {
		return len(t.bufs[i])
	}
	return t.dgrams[i].Len()
}

func (t *txSource) skip(n int) {
	if t.bufs != nil {
		t.bufs = t.bufs[n:]
	} else {
		t.dgrams = t.dgrams[n:]
	}
}

// iovecs points iovs at datagram i's pieces and returns how many it used
// (a datagram of length 0 still takes one, empty, iovec).
func (t *txSource) iovecs(i int, iovs []unix.Iovec) int {
	if t.bufs != nil {
		setIovec(&iovs[0], t.bufs[i])
		return 1
	}
	k := 0
	for _, p := range t.dgrams[i] {
		if len(p) > 0 {
			setIovec(&iovs[k], p)
			k++
		}
	}
	if k == 0 {
		setIovec(&iovs[0], nil)
		k = 1
	}
	return k
}

func setIovec(iov *unix.Iovec, b []byte) {
	iov.Base = nil
	if len(b) > 0 {
		iov.Base = &b[0]
	}
	iov.SetLen(len(b))
}

// allocTx makes the send side's arrays for batches of up to n datagrams:
// a message each at most, every datagram in up to len(Gather{}) pieces.
func (y *sockSys) allocTx(n int) {
	y.txHdrs = make([]mmsghdr, n)
	y.txIovs = make([]unix.Iovec, len(Gather{})*n)
	y.txSegs = make([]int, n)
	y.txBytes = make([]int, n)
	y.txOOB = make([]byte, n*txOOBSpace)
}

// pack fills the tx mmsghdrs from src and returns the number of messages
// and of datagrams they carry.
func (y *sockSys) pack(src *txSource, gso bool, maxGSO int) (msgs, used int) {
	const maxPieces = len(Gather{})
	k := 0 // next iovec
	total := src.n()
	for used < total && msgs < len(y.txHdrs) && k+maxPieces <= len(y.txIovs) {
		seg := src.len(used)
		cnt := 1
		if gso {
			cnt = gsoRun(src, used, (len(y.txIovs)-k)/maxPieces, maxGSO)
		}
		niov, nb := 0, 0
		for j := range cnt {
			niov += src.iovecs(used+j, y.txIovs[k+niov:])
			nb += src.len(used + j)
		}
		h := &y.txHdrs[msgs].hdr
		h.Name = (*byte)(unsafe.Pointer(&y.txName))
		h.Namelen = y.txNameN
		h.Iov = &y.txIovs[k]
		h.SetIovlen(niov)
		h.Flags = 0
		oob := y.txOOB[msgs*txOOBSpace : (msgs+1)*txOOBSpace]
		ol := copy(oob, y.txSrc)
		ol += copy(oob[ol:], y.txTraf)
		if cnt > 1 {
			ol += putSegmentCmsg(oob[ol:], seg)
		}
		if ol > 0 {
			h.Control = &oob[0]
			h.SetControllen(ol)
		} else {
			h.Control = nil
			h.SetControllen(0)
		}
		y.txSegs[msgs], y.txBytes[msgs] = cnt, nb
		k += niov
		used += cnt
		msgs++
	}
	return msgs, used
}

func (y *sockSys) send(fd uintptr) bool {
	if y.txEnd-y.txOff == 1 {
		return y.sendOne(fd, &y.txHdrs[y.txOff].hdr)
	}
	n, done, err := mmsgCall(unix.SYS_SENDMMSG, fd, y.txHdrs[y.txOff:y.txEnd], 0)
	if done {
		y.txN, y.txErr = n, err
		if n == 0 && err == nil {
			y.txErr = unix.EIO // never seen; keeps writeBatch from spinning
		}
	}
	return done
}

// canPollSockets: a Linux socket can be read without waiting (recvmmsg
// with MSG_DONTWAIT).
const canPollSockets = true

// sendOne sends the one message of a batch with sendto when it is one
// piece without control data, else with sendmsg. Either spares the
// kernel sendmmsg's per-message work (copying and checking the mmsghdr
// array, then the message header and its iovec array for sendto), which
// a latency-bound exchange pays on every datagram: our Conn's 8-byte
// echo over loopback took 14.4-14.7 us per round trip instead of
// 14.8-15.5 (Go's net.UDPConn 11.6), and an 8-byte WRITE round trip 0.3-
// 0.4 us less at the median (docs/performance.md, session N).
func (y *sockSys) sendOne(fd uintptr, h *unix.Msghdr) bool {
	var done bool
	var err error
	if h.Iovlen == 1 && h.Controllen == 0 && h.Iov.Len <= rawSendMax {
		_, done, err = sockCallRaw(unix.SYS_SENDTO, fd, unsafe.Pointer(h.Iov.Base), uintptr(h.Iov.Len), 0,
			unsafe.Pointer(h.Name), uintptr(h.Namelen))
	} else if h.Iovlen == 1 && h.Controllen == 0 {
		_, done, err = sockCall(unix.SYS_SENDTO, fd, unsafe.Pointer(h.Iov.Base), uintptr(h.Iov.Len), 0,
			unsafe.Pointer(h.Name), uintptr(h.Namelen))
	} else {
		_, done, err = sockCall(unix.SYS_SENDMSG, fd, unsafe.Pointer(h), 0, 0, nil, 0)
	}
	if done {
		y.txN, y.txErr = 1, err
		if err != nil {
			y.txN = 0
		}
	}
	return done
}
