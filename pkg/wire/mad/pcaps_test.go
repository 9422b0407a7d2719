package mad_test

import (
	"errors"
	"net/netip"
	"path/filepath"
	"testing"

	"github.com/rxed/rxed/internal/testenv"
	"github.com/rxed/rxed/pkg/wire"
	"github.com/rxed/rxed/pkg/wire/mad"
	"github.com/rxed/rxed/pkg/wire/wirepcap"
	"github.com/stretchr/testify/require"
)

// capturedMAD is one CM MAD of a capture, with what the frame says about
// it.
type capturedMAD struct {
	file     string
	frame    int
	src, dst netip.AddrPort
	raw      []byte // the 256 bytes
	hdr      mad.Header
	msg      mad.Message
}

// cmCaptures are the rdma_rxe captures holding CM MADs.
func cmCaptures(t *testing.T) []string {
	dir := testenv.SharedPath(t, "pcaps")
	files, err := filepath.Glob(filepath.Join(dir, "rdmacm_*.pcap"))
	require.NoError(t, err)
	files = append(files, filepath.Join(dir, "perftest_write_bw_rc_4096_rdmacm.pcap"))
	require.GreaterOrEqual(t, len(files), 10)
	return files
}

// readMADs returns every packet to QP 1 of a capture, parsed. Each must be
// a UD SEND_ONLY carrying exactly one 256-byte CM MAD with the GSI Q_Key
// from source QP 1, and must parse.
func readMADs(t *testing.T, path string) (mads []capturedMAD, roce []wirepcap.UDPFrame) {
	t.Helper()
	frames, err := wirepcap.ReadFile(path)
	require.NoError(t, err)
	var p wire.Packet
	for _, fr := range frames {
		var uf wirepcap.UDPFrame
		err := wirepcap.DissectUDP(fr.LinkType, fr.Data, &uf)
		if errors.Is(err, wirepcap.ErrNotUDP) {
			continue
		}
		require.NoError(t, err, "frame %d", fr.Number)
		if !uf.IsRoCE() {
			continue
		}
		require.NoError(t, p.Parse(uf.Payload), "frame %d", fr.Number)
		roce = append(roce, uf)
		if p.BTH.DestQP() != 1 {
			continue
		}
		require.Equal(t, wire.UDSendOnly, p.Opcode, "frame %d: QP 1 traffic is UD SEND_ONLY", fr.Number)
		require.Equal(t, uint32(0x80010000), p.DETH.QKey(), "frame %d: GSI Q_Key", fr.Number)
		require.Equal(t, uint32(1), p.DETH.SrcQP(), "frame %d: from QP 1", fr.Number)
		require.Len(t, p.Payload, mad.MADLen, "frame %d", fr.Number)
		h, m, err := mad.Parse(p.Payload)
		require.NoError(t, err, "frame %d", fr.Number)
		mads = append(mads, capturedMAD{file: filepath.Base(path), frame: fr.Number, src: uf.Src, dst: uf.Dst,
			raw: append([]byte(nil), p.Payload...), hdr: h, msg: m})
	}
	return mads, roce
}

// flowLabelSport is rdma_flow_label_to_udp_sport (include/rdma/ib_verbs.h):
// the UDP source port rxe derives from a path's flow label.
func flowLabelSport(fl uint32) uint16 {
	lo, hi := fl&0x3FFF, (fl&0xFC000)>>14
	return uint16(lo^hi) | 0xC000
}

// TestCapturedMADs: every CM MAD of the rdma_cm captures parses, re-encodes
// byte for byte, and says what the frame around it says: GIDs and rdma_cm
// addresses are the IP addresses, the service ID is the tool's port, and
// the REQ's flow label is the UDP source port of the connection's data.
func TestCapturedMADs(t *testing.T) {
	ports := map[string]uint16{
		"rdmacm_rping_v4.pcap": 7174, "rdmacm_rej_no_listener.pcap": 7174, "rdmacm_udaddy.pcap": 7174,
		"rdmacm_ucmatose.pcap": 7471, "rdmacm_ucmatose_3conn.pcap": 7471, "rdmacm_rdma_server_client.pcap": 7471,
		"rdmacm_read_bw_R.pcap": 18515, "rdmacm_send_bw_R.pcap": 18515, "perftest_write_bw_rc_4096_rdmacm.pcap": 18515,
	}
	counts := map[uint16]int{}
	flowLabels := 0
	for _, path := range cmCaptures(t) {
		file := filepath.Base(path)
		t.Run(file, func(t *testing.T) {
			mads, roce := readMADs(t, path)
			for _, c := range mads {
				counts[c.hdr.AttrID]++
				// Byte for byte, both ways of encoding.
				require.Equal(t, c.raw, mad.Append(nil, c.hdr.TID, c.msg), "frame %d", c.frame)
				require.Equal(t, c.raw, c.msg.AppendData(c.hdr.Append(nil)), "frame %d", c.frame)
				b, err := mad.Marshal(c.hdr.TID, c.msg)
				require.NoError(t, err)
				require.Equal(t, c.raw, b)
				require.Equal(t, mad.CMHeader(c.hdr.TID, c.msg), c.hdr, "frame %d: a plain CM header", c.frame)

				src, dst := netip.AddrFrom16(c.src.Addr().As16()), netip.AddrFrom16(c.dst.Addr().As16())
				switch m := c.msg.(type) {
				case *mad.REQ:
					require.Equal(t, src, m.Primary.LocalGID, "frame %d", c.frame)
					require.Equal(t, dst, m.Primary.RemoteGID, "frame %d", c.frame)
					require.Nil(t, m.Alternate, "rdma_cm sends no alternate path")
					require.Equal(t, uint16(0xFFFF), m.Primary.LocalLID, "permissive LID on RoCE")
					checkServiceID(t, m.ServiceID, mad.PortSpaceTCP, ports[file])
					checkCMAHeader(t, m.PrivateData, c)
					if checkFlowLabel(t, m, roce) {
						flowLabels++
					}
				case *mad.SIDRREQ:
					checkServiceID(t, m.ServiceID, mad.PortSpaceUDP, ports[file])
					checkCMAHeader(t, m.PrivateData, c)
				case *mad.SIDRREP:
					require.Equal(t, mad.SIDRSuccess, m.Status)
					require.Equal(t, uint32(0x01234567), m.QKey, "RDMA_UDP_QKEY")
					checkServiceID(t, m.ServiceID, mad.PortSpaceUDP, ports[file])
				case *mad.REJ:
					require.Equal(t, mad.REJInvalidServiceID, m.Reason, "rping printed error 8")
					require.Equal(t, "invalid service ID", m.Reason.String())
					require.Zero(t, m.LocalCommID, "a REJ answering a REQ that matched nothing")
					require.Equal(t, uint8(mad.REJMsgREQ), m.MessageRejected)
				}
			}
			if file == "rdmacm_mckey.pcap" {
				require.Empty(t, mads, "a RoCE multicast join sends no MAD")
				return
			}
			require.NotEmpty(t, mads)
			checkPairs(t, mads)
		})
	}
	// The captures' CM traffic, as tshark 4.0 summarises it.
	require.Equal(t, map[uint16]int{mad.AttrREQ: 13, mad.AttrREP: 12, mad.AttrRTU: 12, mad.AttrDREQ: 12, mad.AttrDREP: 12,
		mad.AttrREJ: 1, mad.AttrSIDRREQ: 1, mad.AttrSIDRREP: 1}, counts)
	require.Equal(t, 12, flowLabels, "every accepted REQ's flow label checked against its data packets")
}

func checkServiceID(t *testing.T, id uint64, wantPS mad.PortSpace, wantPort uint16) {
	t.Helper()
	ps, port, ok := mad.SplitServiceID(id)
	require.True(t, ok, "service ID %#x", id)
	require.Equal(t, wantPS, ps)
	require.Equal(t, wantPort, port)
	require.Equal(t, id, mad.ServiceID(ps, port))
}

// checkCMAHeader: the rdma_cm header names the frame's IP addresses, and
// re-encodes to the captured bytes.
func checkCMAHeader(t *testing.T, pd []byte, c capturedMAD) {
	t.Helper()
	h, err := mad.ParseCMAHeader(pd)
	require.NoError(t, err, "frame %d", c.frame)
	require.Equal(t, uint8(4), h.IPVersion)
	require.Equal(t, c.src.Addr(), h.Src, "frame %d", c.frame)
	require.Equal(t, c.dst.Addr(), h.Dst, "frame %d", c.frame)
	require.NotZero(t, h.SrcPort)
	require.Equal(t, pd[:mad.CMAHeaderLen], h.Append(nil))
}

// checkFlowLabel: rxe derives the UDP source port of the RC QP's packets
// from the REQ's primary flow label, both ways (the passive side takes the
// path from the REQ); checked on the packets to the active QP (its host
// and QPN: QPNs are per host). This is the oracle for the flow label, which tshark
// 4.0 mis-dissects. It reports false for a connection without data
// packets (a rejected REQ).
func checkFlowLabel(t *testing.T, req *mad.REQ, roce []wirepcap.UDPFrame) bool {
	t.Helper()
	want := flowLabelSport(req.Primary.FlowLabel)
	var p wire.Packet
	n := 0
	for _, uf := range roce {
		require.NoError(t, p.Parse(uf.Payload))
		if p.BTH.DestQP() == req.LocalQPN && uf.Dst.Addr() == req.Primary.LocalGID.Unmap() && p.Opcode < wire.UDSendOnly {
			n++
			require.Equal(t, want, uf.Src.Port(), "REQ flow label %#x: UDP source port of a packet to QPN %#x", req.Primary.FlowLabel, req.LocalQPN)
		}
	}
	return n > 0
}

// checkPairs: the answers match their requests by comm ID, and REP, RTU
// and REJ reuse the REQ's TID.
func checkPairs(t *testing.T, mads []capturedMAD) {
	t.Helper()
	reqs := map[uint32]capturedMAD{}
	reps := map[uint32]*mad.REP{}
	for _, c := range mads {
		switch m := c.msg.(type) {
		case *mad.REQ:
			reqs[m.LocalCommID] = c
		case *mad.REP:
			r, ok := reqs[m.RemoteCommID]
			require.True(t, ok, "frame %d: REP for an unknown REQ", c.frame)
			require.Equal(t, r.hdr.TID, c.hdr.TID)
			reps[m.LocalCommID] = m
			req := r.msg.(*mad.REQ)
			require.Equal(t, req.InitiatorDepth, m.ResponderResources, "passive responder resources from the REQ's initiator depth")
		case *mad.RTU:
			rep, ok := reps[m.RemoteCommID]
			require.True(t, ok, "frame %d: RTU for an unknown REP", c.frame)
			require.Equal(t, rep.RemoteCommID, m.LocalCommID)
		case *mad.DREQ:
			if rep, ok := reps[m.RemoteCommID]; ok {
				require.Equal(t, rep.LocalQPN, m.RemoteQPN, "DREQ names the passive QP")
			} else {
				_, ok := reqs[m.RemoteCommID]
				require.True(t, ok, "frame %d: DREQ for an unknown connection", c.frame)
			}
		case *mad.REJ:
			r, ok := reqs[m.RemoteCommID]
			require.True(t, ok, "frame %d: REJ for an unknown REQ", c.frame)
			require.Equal(t, r.hdr.TID, c.hdr.TID)
		}
	}
}
