package main

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gopacket/gopacket/layers"
	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/mr"
	"github.com/rxed/rxed/pkg/oob"
	"github.com/rxed/rxed/pkg/wire"
	"github.com/rxed/rxed/pkg/wire/wirepcap"
	"github.com/stretchr/testify/require"
)

// victimAddr is a loopback address no other test uses: the third party a
// reflection attempt aims the daemon at.
const victimAddr = "127.0.0.99"

// victim listens where the daemon would send RoCE to the victim's GID
// and counts what arrives.
type victim struct {
	c     *net.UDPConn
	bytes atomic.Int64
	pkts  atomic.Int64
	done  chan struct{}
}

func listenVictim(t *testing.T, port int) *victim {
	t.Helper()
	c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(netip.MustParseAddr(victimAddr), uint16(port))))
	require.NoError(t, err, "binding the victim socket")
	v := &victim{c: c, done: make(chan struct{})}
	go func() {
		defer close(v.done)
		buf := make([]byte, 65536)
		for {
			n, _, err := c.ReadFromUDP(buf)
			if err != nil {
				return
			}
			v.bytes.Add(int64(n))
			v.pkts.Add(1)
		}
	}()
	t.Cleanup(func() { c.Close(); <-v.done })
	return v
}

// freeUDPPort returns a UDP port free on addr.
func freeUDPPort(t *testing.T, addr string) int {
	t.Helper()
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.ParseIP(addr)})
	require.NoError(t, err)
	defer c.Close()
	return c.LocalAddr().(*net.UDPAddr).Port
}

// attacker plays the reflector: a perftest-speaking client whose key
// announces the victim's GID, with an rxed engine on the victim's address
// (another UDP port) so that its READ requests pass the daemon's source
// address check while the responses go to the victim's port.
type attacker struct {
	dev *ib.Device
	pd  *ib.PD
	cq  *ib.CQ
	qp  *ib.QP
	reg *ib.MR
}

func newAttacker(t *testing.T) *attacker {
	t.Helper()
	a := &attacker{}
	var err error
	a.dev, err = ib.OpenDevice(ib.Config{Addrs: []netip.Addr{netip.MustParseAddr(victimAddr)}, Port: uint16(freeUDPPort(t, victimAddr))})
	require.NoError(t, err)
	t.Cleanup(func() { a.dev.Close() })
	a.pd, err = a.dev.AllocPD()
	require.NoError(t, err)
	a.cq, err = a.dev.CreateCQ(64)
	require.NoError(t, err)
	m, err := mr.MapAnonymous(1 << 20)
	require.NoError(t, err)
	t.Cleanup(func() { m.Close() })
	a.reg, err = a.pd.RegMR(m.Bytes(), ib.AccessLocalWrite|ib.AccessRemoteWrite, mr.WithMapping(m))
	require.NoError(t, err)
	a.qp, err = a.pd.CreateQP(ib.QPInitAttr{Type: ib.RC, SendCQ: a.cq, RecvCQ: a.cq, Cap: ib.QPCap{MaxSendWR: 64, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}})
	require.NoError(t, err)
	require.NoError(t, initQP(a.qp, ib.RC, 0, ib.AccessRemoteWrite|ib.AccessRemoteRead))
	return a
}

// exchange runs the perftest exchange up to the run (and the proof for
// an extension client). It returns the daemon's first key reply, or the
// error that refused the attempt, and the bytes it wrote over TCP before
// the daemon connected its QPs.
func (a *attacker) exchange(t *testing.T, ctx context.Context, oobAddr string, ext bool) (reply oob.Key, refusal error, sent int64) {
	t.Helper()
	cfg := &oob.SessionConfig{Options: oob.Options{Timeout: 10 * time.Second}}
	if ext {
		cfg.Ext = &oob.ExtConfig{}
	}
	sess, err := oob.DialPerftest(ctx, oobAddr, cfg)
	require.NoError(t, err)
	defer sess.CloseWithoutExchange()
	_, err = sess.Negotiate(ctx, 3)
	require.NoError(t, err)
	key := oob.Key{OutReads: 128, QPN: a.qp.Num(), PSN: 1, RKey: a.reg.RKey(), VAddr: a.reg.IOVA(),
		GID: netip.MustParseAddr(victimAddr).As16()}
	sent = oob.VersionMsgLen + 2*oob.SysDataMsgLen + oob.MTUMsgLen + 2*oob.KeyMsgLen
	if reply, err = sess.HandShake(ctx, key); err != nil {
		return oob.Key{}, err, sent
	}
	// The first barrier: the daemon connects its QP to the victim's GID.
	if _, err = sess.HandShake(ctx, key); err != nil {
		return reply, err, sent
	}
	if ext {
		// The second barrier, then the proof: we cannot read what went to
		// the victim.
		if _, err = sess.HandShake(ctx, key); err == nil {
			_, err = sess.ProveAddress(ctx, [16]byte{})
		}
	}
	return reply, err, sent
}

// flood is the rest of the attack against a daemon that answered: 16
// READs of 1 MiB whose responses all go to the victim. It returns when
// the victim has received nothing new for a while.
func (a *attacker) flood(t *testing.T, reply oob.Key, daemon string, udpPort int, v *victim) {
	av := ib.AddrVector{DGID: netip.MustParseAddr(daemon), SGIDIndex: 0, PortNum: 1, DestPort: uint16(udpPort)}
	_, err := connectQP(a.pd, a.qp, ib.RC, qpPath{av: av, mtu: ib.MTU4096, destQPN: reply.QPN, rqPSN: reply.PSN, sqPSN: 1,
		timeout: 14, maxDestRdAtom: 16, maxRdAtomic: 16})
	require.NoError(t, err)
	for i := range 16 {
		require.NoError(t, a.qp.PostSend(ib.SendWR{ID: uint64(i), Opcode: ib.WRRDMARead, Flags: ib.SendSignaled,
			SGL: []ib.SGE{{Addr: a.reg.IOVA(), Length: 1 << 20, LKey: a.reg.LKey()}}, RemoteAddr: reply.VAddr, RKey: reply.RKey}))
	}
	for last := int64(-1); last != v.bytes.Load(); {
		last = v.bytes.Load()
		time.Sleep(500 * time.Millisecond)
	}
}

// TestServeRefusesReflection: a perftest client that announces a third
// party's GID (127.0.0.99) is refused before any key reply (no rkey, no
// QP connected), and the third party receives nothing. Before the fix
// the daemon answered with the export's rkey and connected its QP to the
// victim, and the READs that followed flooded it.
func TestServeRefusesReflection(t *testing.T) {
	t.Parallel()
	a, _ := addrPair(t)
	port := reservePort(t)
	udpPort := freeUDPPort(t, a)
	v := listenVictim(t, udpPort)
	d, logs, _, _ := startServe(t, "--addr", a, "--port", strconv.Itoa(udpPort), "-p", port, "--export", "data=anon,size=16M", "--timeout", "5s")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	atk := newAttacker(t)
	reply, err, sent := atk.exchange(t, ctx, "127.0.0.1:"+port, false)
	if err == nil {
		atk.flood(t, reply, a, udpPort, v)
		t.Errorf("the daemon answered a key announcing a third party's GID (rkey %#x): the victim received %d bytes in %d packets for %d bytes of exchange",
			reply.RKey, v.bytes.Load(), v.pkts.Load(), sent)
		return
	}
	require.ErrorIs(t, err, oob.ErrClosed)
	logs.waitFor(t, "unverified GID", 10*time.Second)
	// No QP was ever connected: the engine has sent nothing at all.
	require.Zero(t, d.Device().Counters()["sent_pkts"], "the daemon sent RoCE packets")
	require.Zero(t, v.bytes.Load(), "the victim received %d bytes", v.bytes.Load())
	require.Contains(t, d.Metrics(), "rxed_sessions_refused_gid_total 1")
}

// TestServeGIDProofBoundsAmplification: an rxed client (which may prove a
// GID other than its TCP address) announcing a third party's GID gets no
// rkey in the key replies, is refused at the proof, and the victim
// receives at most AmplificationFactor times what the client sent: the
// nonce and its retransmissions.
func TestServeGIDProofBoundsAmplification(t *testing.T) {
	t.Parallel()
	a, _ := addrPair(t)
	port := reservePort(t)
	udpPort := freeUDPPort(t, a)
	v := listenVictim(t, udpPort)
	d, logs, _, _ := startServe(t, "--addr", a, "--port", strconv.Itoa(udpPort), "-p", port, "--export", "data=anon,size=16M",
		"--timeout", "5s", "--qp-timeout", "8")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	reply, err, sent := newAttacker(t).exchange(t, ctx, "127.0.0.1:"+port, true)
	require.Zero(t, reply.RKey, "the export's rkey went out before the GID was proved")
	require.ErrorIs(t, err, oob.ErrRefused)
	require.ErrorContains(t, err, "announced GID")
	logs.waitFor(t, "perftest session failed", 10*time.Second)
	got := v.bytes.Load()
	t.Logf("victim received %d bytes in %d packets; the client sent %d bytes over TCP", got, v.pkts.Load(), sent)
	require.LessOrEqual(t, got, 3*sent, "more than 3x amplification towards an unproved address")
	require.Contains(t, d.Metrics(), "rxed_sessions_refused_gid_total 1")
}

// TestServePerftestGIDRules: a perftest client whose GID is the address
// it connects from gets the rkey at once; one whose GID is not is
// refused, unless serve runs with --allow-unverified-gid.
func TestServePerftestGIDRules(t *testing.T) {
	t.Parallel()
	a, b := addrPair(t)
	port, port2 := reservePort(t), reservePort(t)
	_, _, _, _ = startServe(t, "--addr", a, "-p", port, "--export", "data=anon,size=64K", "--timeout", "5s")
	_, _, _, _ = startServe(t, "--addr", a, "--port", strconv.Itoa(freeUDPPort(t, a)), "-p", port2, "--export", "data=anon,size=64K",
		"--timeout", "5s", "--allow-unverified-gid")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	exchange := func(oobPort, from, gid string) (oob.Key, error) {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
		c, err := d.DialContext(ctx, "tcp", net.JoinHostPort(a, oobPort))
		require.NoError(t, err)
		s := oob.NewSession(c, oob.Client, &oob.SessionConfig{Options: oob.Options{Timeout: 5 * time.Second}})
		defer s.CloseWithoutExchange()
		_, err = s.Negotiate(ctx, 3)
		require.NoError(t, err)
		return s.HandShake(ctx, oob.Key{OutReads: 1, QPN: 0x123, PSN: 1, RKey: 1, VAddr: 0x1000, GID: netip.MustParseAddr(gid).As16()})
	}
	k, err := exchange(port, b, b)
	require.NoError(t, err, "GID == TCP address")
	require.NotZero(t, k.RKey)
	_, err = exchange(port, b, "10.1.2.3")
	require.ErrorIs(t, err, oob.ErrClosed, "GID != TCP address")
	k, err = exchange(port2, b, "10.1.2.3")
	require.NoError(t, err, "--allow-unverified-gid")
	require.NotZero(t, k.RKey)
}

// TestServeBudgets: --max-read refuses READs longer than the cap (the
// client's READ fails, the daemon sends none of it) and --session-bytes
// stops a session's responses at its budget; READs within both run.
// The daemon's --pcap shows the refused READ requests arriving and no
// more sent to any peer QP than its session's budget: the capture once
// recorded every response the budget dropped as sent (the recorder sat
// outside the daemon's accounting).
func TestServeBudgets(t *testing.T) {
	t.Parallel()
	a, b := addrPair(t)
	port := reservePort(t)
	capture := tempPath(t, "serve.pcap")
	d, _, stop, done := startServe(t, "--addr", a, "-p", port, "--export", "data=anon,size=1M", "--max-read", "4K", "--session-bytes", "1M",
		"--pcap", capture)
	perf := func(size, n string) result {
		return runCmd("perf", "read", "--addr", b, "-p", port, "-s", size, "-n", n, "--timeout", "5s", "--qp-timeout", "10", "--progress", "0", a)
	}
	requireOK(t, "READs of 4 KiB, 100 KiB in all", perf("4096", "25"))
	r := perf("8192", "5")
	require.NotEqual(t, 0, r.code, "a READ longer than --max-read")
	require.Contains(t, d.Metrics(), "rxed_read_cap_drops_total ")
	require.NotContains(t, d.Metrics(), "rxed_read_cap_drops_total 0\n")
	r = perf("4096", "1000")
	require.NotEqual(t, 0, r.code, "4 MB of READ responses against a 1 MiB budget")
	require.NotContains(t, d.Metrics(), "rxed_budget_drops_total 0\n")

	stop()
	require.NoError(t, <-done)
	sent, refused := captureBudgetView(t, capture, netip.MustParseAddr(a))
	require.Positive(t, refused, "the READ requests past --max-read arrived: the capture must show them")
	most := int64(0)
	for qpn, n := range sent {
		require.LessOrEqual(t, n, int64(1<<20), "bytes recorded as sent to QP %#x against its session's 1 MiB", qpn)
		most = max(most, n)
	}
	// The 4 MB session's responses are recorded up to its budget, short
	// of it by less than two responses.
	require.Greater(t, most, int64(1<<20-8192), "the most recorded as sent to one QP: %v", sent)
}

// captureBudgetView reads a daemon's capture: the UDP payload bytes it
// sent from self to each destination QP, and how many READ requests
// longer than 4 KiB it received.
func captureBudgetView(t *testing.T, path string, self netip.Addr) (sent map[uint32]int64, bigReads int) {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	frames, err := wirepcap.NewReader(f)
	require.NoError(t, err)
	sent = map[uint32]int64{}
	for {
		fr, err := frames.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		var u wirepcap.UDPFrame
		require.NoError(t, wirepcap.DissectUDP(layers.LinkType(fr.LinkType), fr.Data, &u))
		var p wire.Packet
		require.NoError(t, p.Parse(u.Payload), "frame %d", fr.Number)
		switch {
		case u.Src.Addr() == self:
			sent[p.BTH.DestQP()] += int64(len(u.Payload))
		case p.Opcode == wire.RCReadRequest && p.RETH.DMALen() > 4096:
			bigReads++
		}
	}
	return sent, bigReads
}
