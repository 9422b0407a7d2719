package e2e

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gopacket/gopacket/layers"
	"github.com/rxed/rxed/internal/testenv"
	"github.com/rxed/rxed/pkg/qp"
	"github.com/rxed/rxed/pkg/roce"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/rxed/rxed/pkg/wire"
	"github.com/rxed/rxed/pkg/wire/wirepcap"
	"github.com/stretchr/testify/require"
)

// injectConn is a transport.Conn whose received datagrams are whatever the
// test injects; what the engine sends is counted and discarded.
type injectConn struct {
	local  netip.AddrPort
	in     chan injected
	closed chan struct{}
	once   sync.Once
	mu     sync.Mutex
	sent   int
}

type injected struct {
	data []byte
	ep   transport.Endpoint
}

func newInjectConn(local netip.AddrPort) *injectConn {
	return &injectConn{local: local, in: make(chan injected, 16), closed: make(chan struct{})}
}

func (c *injectConn) Receive(bufs [][]byte, sizes []int, eps []transport.Endpoint) (int, error) {
	select {
	case p := <-c.in:
		sizes[0] = copy(bufs[0], p.data)
		eps[0] = p.ep
		return 1, nil
	case <-c.closed:
		return 0, net.ErrClosed
	}
}

func (c *injectConn) Send(bufs [][]byte, ep transport.Endpoint) error {
	c.mu.Lock()
	c.sent += len(bufs)
	c.mu.Unlock()
	return nil
}

func (c *injectConn) BatchSize() int               { return 8 }
func (c *injectConn) LocalAddrs() []netip.AddrPort { return []netip.AddrPort{c.local} }
func (c *injectConn) Close() error {
	c.once.Do(func() { close(c.closed) })
	return nil
}

func (c *injectConn) sentCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.sent
}

type conformanceEntry struct {
	Index   int    `json:"index"`
	Name    string `json:"name"`
	Verdict string `json:"verdict"`
	Base    string `json:"base"`
}

func readJSONL(t *testing.T, path string) []conformanceEntry {
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	var out []conformanceEntry
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		var e conformanceEntry
		require.NoError(t, json.Unmarshal(sc.Bytes(), &e))
		out = append(out, e)
	}
	require.NoError(t, sc.Err())
	return out
}

type dissected struct {
	payload   []byte
	src, dst  netip.AddrPort
	truncated bool
}

func dissectAll(t *testing.T, path string) []dissected {
	frames, err := wirepcap.ReadFile(path)
	require.NoError(t, err)
	out := make([]dissected, len(frames))
	for i, fr := range frames {
		var u wirepcap.UDPFrame
		if err := wirepcap.DissectUDP(layers.LinkType(fr.LinkType), fr.Data, &u); err != nil && !errors.Is(err, wirepcap.ErrTruncatedFrame) {
			t.Fatalf("frame %d: %v", i+1, err)
		}
		out[i] = dissected{payload: append([]byte(nil), u.Payload...), src: u.Src, dst: u.Dst, truncated: u.Truncated}
	}
	return out
}

// TestInvalidConformanceFramesDropped injects every frame of the
// conformance corpus's invalid.pcap into a live engine set up so that the
// frame reaches the deepest check it can (a QP with the frame's number,
// type and peer address, in RTS; for UD the frame's Q_Key), and checks
// that it is dropped under the reason rdma_rxe's check order gives, that
// nothing is sent in reply, no completion appears and the QP's attributes
// do not change.
func TestInvalidConformanceFramesDropped(t *testing.T) {
	conformanceDir := testenv.SharedPath(t, "conformance")
	invalid := readJSONL(t, conformanceDir+"/invalid.jsonl")
	invFrames := dissectAll(t, conformanceDir+"/invalid.pcap")
	require.Len(t, invFrames, len(invalid))
	valid := readJSONL(t, conformanceDir+"/valid.jsonl")
	validFrames := dissectAll(t, conformanceDir+"/valid.pcap")
	byName := map[string]dissected{}
	for i, v := range valid {
		byName[v.Name] = validFrames[i]
	}
	counted := map[string]int{}
	for i, inv := range invalid {
		fr := invFrames[i]
		t.Run(inv.Name, func(t *testing.T) {
			setup := fr
			if b, ok := byName[inv.Base]; ok {
				setup = b // configure from the intact frame the defect was made in
			}
			want := expectedDrop(t, inv, fr)
			got := injectOne(t, setup, fr, want)
			require.Equal(t, want, got, "verdict %s", inv.Verdict)
			counted[got]++
		})
	}
	t.Logf("drop reasons: %v", counted)
}

// expectedDrop is the corpus verdict mapped to the engine's counters, with
// rxe's check order applied: address and P_Key checks come before the
// ICRC, so a flipped IP address or a P_Key that no longer matches is
// dropped for that reason first.
func expectedDrop(t *testing.T, inv conformanceEntry, fr dissected) string {
	if fr.truncated {
		// The capture holds less than the UDP length claims; a socket
		// would deliver nothing. Injected as captured, the engine judges
		// the bytes it got, as the codec does.
		var p wire.Packet
		switch err := p.Parse(fr.payload); {
		case errors.Is(err, wire.ErrTruncated):
			return "drop_length"
		case errors.Is(err, wire.ErrBadOpcode):
			return "drop_bad_opcode"
		case err != nil:
			return "drop_header"
		}
	}
	switch inv.Verdict {
	case "truncated":
		return "drop_length"
	case "bad_opcode":
		return "drop_bad_opcode"
	case "bad_version", "bad_padding", "bad_length":
		return "drop_header"
	case "bad_icrc":
		switch {
		case strings.Contains(inv.Name, "ip_src"), strings.Contains(inv.Name, "ip_dst"):
			return "drop_address"
		case strings.Contains(inv.Name, "ip_flags_df"):
			// The defect is only in the IPv4 DF bit, which a UDP socket
			// never shows: the datagram is bit for bit the intact one.
			// rxe sees the IP header and drops it; an engine behind a
			// socket cannot, and must treat it as the intact packet.
			return "accepted"
		}
		// rxe checks the P_Key (only 0xFFFF exists) before the ICRC.
		if pk := binary.BigEndian.Uint16(fr.payload[2:]); pk&0x7FFF != 0x7FFF {
			return "drop_pkey"
		}
		return "drop_icrc"
	}
	t.Fatalf("unknown verdict %q", inv.Verdict)
	return ""
}

// injectOne builds an engine that would accept setup, injects fr, and
// returns the one drop counter that moved.
func injectOne(t *testing.T, setup, fr dissected, want string) string {
	local := setup.dst
	if !local.IsValid() {
		local = netip.MustParseAddrPort("10.0.0.2:4791")
	}
	conn := newInjectConn(local)
	e, err := roce.New(roce.Config{Conn: conn, Workers: 1})
	require.NoError(t, err)
	defer e.Close()
	pd, err := e.Memory().AllocPD()
	require.NoError(t, err)
	scq, _ := qp.NewCQ(16)
	rcq, _ := qp.NewCQ(16)
	var q *qp.QP
	var before qp.Attr
	if len(setup.payload) >= wire.BTHLen {
		bth := wire.BTH(setup.payload[:wire.BTHLen])
		op := bth.Opcode()
		typ := qp.RC
		switch op.Info().Transport {
		case wire.TransportUC:
			typ = qp.UC
		case wire.TransportUD:
			typ = qp.UD
		}
		if num := bth.DestQP(); num > 1 && op.Info().Transport != wire.TransportCNP && op.Info().Supported {
			q, err = e.CreateQP(qp.Config{Num: num, Type: typ, PD: pd, SendCQ: scq, RecvCQ: rcq,
				Cap: qp.Cap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
			require.NoError(t, err)
			var qkey uint32
			if typ == qp.UD && len(setup.payload) >= wire.BTHLen+wire.DETHLen {
				qkey = wire.DETH(setup.payload[wire.BTHLen:]).QKey()
			}
			modifyToRTS(t, e, q, typ, setup.src.Addr(), qkey, qp.PSN(bth.PSN()))
			before, err = e.QueryQP(q)
			require.NoError(t, err)
		}
	}
	baseline := e.Counters()
	conn.in <- injected{data: fr.payload, ep: transport.Endpoint{Local: fr.dst, Remote: fr.src}}
	if want == "accepted" {
		require.Eventually(t, func() bool { return e.Counters()["rcvd_pkts"] == baseline["rcvd_pkts"]+1 }, 5*time.Second, time.Millisecond)
		for k, v := range e.Counters() {
			if strings.HasPrefix(k, "drop_") {
				require.Equal(t, baseline[k], v, "counter %s", k)
			}
		}
		return want
	}
	var moved string
	require.Eventually(t, func() bool {
		now := e.Counters()
		for k, v := range now {
			if strings.HasPrefix(k, "drop_") && v != baseline[k] {
				moved = k
				return true
			}
		}
		return false
	}, 5*time.Second, time.Millisecond)
	// Nothing else happened: exactly one drop, nothing accepted or sent.
	now := e.Counters()
	for k, v := range now {
		if k != moved {
			require.Equal(t, baseline[k], v, "counter %s", k)
		}
	}
	require.Equal(t, baseline[moved]+1, now[moved])
	require.Zero(t, conn.sentCount(), "a dropped packet must not be answered")
	if q != nil {
		after, err := e.QueryQP(q)
		require.NoError(t, err)
		require.Equal(t, before, after, "QP attributes changed")
		require.Equal(t, qp.RTS, q.State())
		require.Zero(t, scq.Len()+rcq.Len())
	}
	return moved
}

func modifyToRTS(t *testing.T, e *roce.Engine, q *qp.QP, typ qp.Type, peer netip.Addr, qkey uint32, psn qp.PSN) {
	acc := qp.AccessRemoteWrite | qp.AccessRemoteRead | qp.AccessRemoteAtomic
	if typ == qp.UD {
		require.NoError(t, e.ModifyQP(q, &qp.Attr{State: qp.Init, PortNum: 1, QKey: qkey}, qp.AttrState|qp.AttrPKeyIndex|qp.AttrPort|qp.AttrQKey))
		require.NoError(t, e.ModifyQP(q, &qp.Attr{State: qp.RTR}, qp.AttrState))
		require.NoError(t, e.ModifyQP(q, &qp.Attr{State: qp.RTS, SQPSN: psn}, qp.AttrState|qp.AttrSQPSN))
		return
	}
	require.NoError(t, e.ModifyQP(q, &qp.Attr{State: qp.Init, PortNum: 1, AccessFlags: acc}, qp.AttrState|qp.AttrPKeyIndex|qp.AttrPort|qp.AttrAccessFlags))
	mask := qp.AttrState | qp.AttrAV | qp.AttrPathMTU | qp.AttrDestQPN | qp.AttrRQPSN
	if typ == qp.RC {
		mask |= qp.AttrMaxDestRdAtomic | qp.AttrMinRNRTimer
	}
	require.NoError(t, e.ModifyQP(q, &qp.Attr{State: qp.RTR, AV: qp.AddrVector{DGID: peer}, PathMTU: qp.MTU4096,
		DestQPN: 0x99, RQPSN: psn, MaxDestRdAtomic: 4, MinRNRTimer: 1}, mask))
	mask = qp.AttrState | qp.AttrSQPSN
	if typ == qp.RC {
		mask |= qp.AttrTimeout | qp.AttrRetryCnt | qp.AttrRNRRetry | qp.AttrMaxQPRdAtomic
	}
	require.NoError(t, e.ModifyQP(q, &qp.Attr{State: qp.RTS, SQPSN: psn, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxRdAtomic: 4}, mask))
}

// TestValidCNPCounted injects the corpus's CNPs (one of them captured from
// a ConnectX-4 Lx) and checks they are counted as cnp_rcvd, not dropped.
func TestValidCNPCounted(t *testing.T) {
	conformanceDir := testenv.SharedPath(t, "conformance")
	valid := readJSONL(t, conformanceDir+"/valid.jsonl")
	frames := dissectAll(t, conformanceDir+"/valid.pcap")
	n := 0
	for i := range valid {
		fr := frames[i]
		if len(fr.payload) < wire.BTHLen || wire.BTH(fr.payload).Opcode() != wire.CNP {
			continue
		}
		n++
		conn := newInjectConn(fr.dst)
		e, err := roce.New(roce.Config{Conn: conn, Workers: 1})
		require.NoError(t, err)
		conn.in <- injected{data: fr.payload, ep: transport.Endpoint{Local: fr.dst, Remote: fr.src}}
		require.Eventually(t, func() bool { return e.Counters()["cnp_rcvd"] == 1 }, 5*time.Second, time.Millisecond, "frame %s", valid[i].Name)
		for k, v := range e.Counters() {
			if strings.HasPrefix(k, "drop_") {
				require.Zero(t, v, "%s: %s", valid[i].Name, k)
			}
		}
		require.NoError(t, e.Close())
	}
	require.NotZero(t, n)
}
