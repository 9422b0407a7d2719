package mad_test

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rxed/rxed/internal/testenv"
	"github.com/rxed/rxed/pkg/wire/mad"
	"github.com/stretchr/testify/require"
)

// This file runs Wireshark's dissector (tshark) as an independent oracle
// for every CM MAD of the rdma_cm captures, the way
// internal/decode/tshark_oracle_test.go does for the transport headers.
//
// tshark 4.0 limits: it does not dissect SIDR_REQ/SIDR_REP at all (they are
// checked against hand-read bytes in sidr_test.go and pcaps_test.go), and
// it mis-dissects the REQ's flow label and packet rate (it shows rping's
// "c5 b9 f0 00" as flow label 0xc5b, reserved 3, rate 5, where IBA and
// Linux's ibta_vol1_c12.h say flow label 0xc5b9f, rate 0). Those two fields
// are checked against rxe's own behaviour instead: pcaps_test.go's
// checkFlowLabel derives the UDP source port of each connection's data
// packets from the flow label.

// tsharkFields is one frame as tshark shows it: every field's values in
// document order, by field name.
type tsharkFields map[string][]string

// tsharkBinary returns tshark's path; without it the oracle fails under
// CI and skips elsewhere.
func tsharkBinary(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("tshark")
	testenv.Need(t, err == nil, "tshark not found (%v): the Wireshark cross-check of the captured CM MADs cannot run; "+
		"install it with scripts/ci-deps.sh (as root) or `apt-get install tshark`", err)
	return bin
}

// runTshark dissects the CM MADs of file, by frame number.
func runTshark(t *testing.T, bin, file string) map[int]tsharkFields {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, bin, "-n", "-r", file, "--disable-protocol", "rpcordma",
		"-Y", "infiniband.mad", "-T", "json", "-J", "frame infiniband")
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	require.NoError(t, cmd.Run(), "tshark %s: %s", file, stderr.String())
	frames, err := parseTsharkJSON(&stdout)
	require.NoError(t, err, "tshark %s: unreadable JSON", file)
	return frames
}

// parseTsharkJSON reads tshark's -T json output, which repeats keys within
// an object (so it cannot be unmarshalled into maps).
func parseTsharkJSON(r *bytes.Buffer) (map[int]tsharkFields, error) {
	dec := json.NewDecoder(r)
	out := map[int]tsharkFields{}
	var cur tsharkFields
	var walk func(key string, depth int) error
	walk = func(key string, depth int) error {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		switch v := tok.(type) {
		case json.Delim:
			if v == '{' && depth == 1 { // one packet
				cur = tsharkFields{}
			}
			for dec.More() {
				k := key
				if v == '{' {
					kt, err := dec.Token()
					if err != nil {
						return err
					}
					k = kt.(string)
				}
				if err := walk(k, depth+1); err != nil {
					return err
				}
			}
			if _, err := dec.Token(); err != nil { // the closing delimiter
				return err
			}
			if v == '{' && depth == 1 {
				n, err := strconv.Atoi(first(cur, "frame.number"))
				if err != nil {
					return fmt.Errorf("packet without frame.number: %v", err)
				}
				out[n] = cur
			}
		case string:
			if cur != nil {
				cur[key] = append(cur[key], v)
			}
		}
		return nil
	}
	return out, walk("", 0)
}

func first(f tsharkFields, key string) string {
	if v := f[key]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// expect is one field tshark must show with a given value: a number, a
// byte string or an address.
type expect struct {
	key   string
	num   uint64
	bytes []byte
	addr  netip.Addr
	kind  byte // 'n', 'b', 'a'
}

func n(key string, v uint64) expect      { return expect{key: key, num: v, kind: 'n'} }
func bs(key string, v []byte) expect     { return expect{key: key, bytes: v, kind: 'b'} }
func ad(key string, v netip.Addr) expect { return expect{key: key, addr: v, kind: 'a'} }
func bit(key string, v bool) expect      { return n(key, map[bool]uint64{false: 0, true: 1}[v]) }
func gidExpect(key string, g netip.Addr) expect {
	if g.Is4In6() {
		return ad(key+"_ipv4", g.Unmap())
	}
	return ad(key, g)
}

func (e expect) check(t *testing.T, frame int, f tsharkFields) {
	t.Helper()
	v, ok := f[e.key]
	require.True(t, ok, "frame %d: tshark shows no %s", frame, e.key)
	s := v[0]
	switch e.kind {
	case 'n':
		var got uint64
		var err error
		if h, ok := strings.CutPrefix(s, "0x"); ok {
			got, err = strconv.ParseUint(h, 16, 64)
		} else {
			got, err = strconv.ParseUint(s, 10, 64)
		}
		require.NoError(t, err, "frame %d %s=%q", frame, e.key, s)
		require.Equal(t, e.num, got, "frame %d %s=%q", frame, e.key, s)
	case 'b':
		got, err := hex.DecodeString(strings.ReplaceAll(s, ":", ""))
		require.NoError(t, err, "frame %d %s", frame, e.key)
		require.Equal(t, e.bytes, got, "frame %d %s", frame, e.key)
	case 'a':
		got, err := netip.ParseAddr(s)
		require.NoError(t, err, "frame %d %s=%q", frame, e.key, s)
		require.Equal(t, e.addr, got, "frame %d %s", frame, e.key)
	}
}

// expectations lists what tshark must show for a parsed MAD.
func expectations(t *testing.T, c capturedMAD) []expect {
	h := c.hdr
	es := []expect{
		n("infiniband.mad.baseversion", uint64(h.BaseVersion)), n("infiniband.mad.mgmtclass", uint64(h.MgmtClass)),
		n("infiniband.mad.classversion", uint64(h.ClassVersion)), n("infiniband.mad.method", uint64(h.Method)),
		n("infiniband.mad.status", uint64(h.Status)), n("infiniband.mad.classspecific", uint64(h.ClassSpecific)),
		n("infiniband.mad.transactionid", h.TID), n("infiniband.mad.attributeid", uint64(h.AttrID)),
		n("infiniband.mad.attributemodifier", uint64(h.AttrMod)),
	}
	switch m := c.msg.(type) {
	case *mad.REQ:
		const p = "infiniband.cm.req"
		es = append(es, n(p, uint64(m.LocalCommID)), n(p+".serviceid", m.ServiceID),
			n(p+".localcaguid", m.LocalCAGUID), n(p+".localqkey", uint64(m.LocalQKey)),
			n(p+".localqpn", uint64(m.LocalQPN)), n(p+".responderres", uint64(m.ResponderResources)),
			n(p+".localeecn", uint64(m.LocalEECN)), n(p+".initdepth", uint64(m.InitiatorDepth)),
			n(p+".remoteeecn", uint64(m.RemoteEECN)), n(p+".remoteresptout", uint64(m.RemoteCMResponseTimeout)),
			n(p+".transpsvctype", uint64(m.TransportType)), bit(p+".e2eflowctrl", m.EndToEndFlowControl),
			n(p+".startpsn", uint64(m.StartingPSN)), n(p+".localresptout", uint64(m.LocalCMResponseTimeout)),
			n(p+".retrcount", uint64(m.RetryCount)), n(p+".pkey", uint64(m.PKey)), n(p+".pppmtu", uint64(m.PathMTU)),
			bit(p+".rdcexist", m.RDCExists), n(p+".rnrretrcount", uint64(m.RNRRetryCount)),
			n(p+".maxcmretr", uint64(m.MaxCMRetries)), bit(p+".srq", m.SRQ), n(p+".ext_transport", uint64(m.ExtendedTransport)),
			n(p+".prim_locallid", uint64(m.Primary.LocalLID)), n(p+".prim_remotelid", uint64(m.Primary.RemoteLID)),
			gidExpect(p+".prim_localgid", m.Primary.LocalGID), gidExpect(p+".prim_remotegid", m.Primary.RemoteGID),
			n(p+".prim_tfcclass", uint64(m.Primary.TrafficClass)), n(p+".prim_hoplim", uint64(m.Primary.HopLimit)),
			n(p+".prim_sl", uint64(m.Primary.SL)), bit(p+".prim_subnetlocal", m.Primary.SubnetLocal),
			n(p+".prim_localacktout", uint64(m.Primary.LocalACKTimeout)),
		)
		require.Nil(t, m.Alternate)
		es = append(es, n(p+".alt_locallid", 0), n(p+".alt_remotelid", 0), bs(p+".alt_localgid", make([]byte, 16)),
			bs(p+".alt_remotegid", make([]byte, 16)), n(p+".alt_flowlabel", 0), n(p+".alt_pktrate", 0),
			n(p+".alt_hoplim", 0), n(p+".alt_localacktout", 0))
		cma, err := mad.ParseCMAHeader(m.PrivateData)
		require.NoError(t, err)
		es = append(es, n(p+".ip_cm.majv", uint64(cma.CMAVersion>>4)), n(p+".ip_cm.minv", uint64(cma.CMAVersion&0xF)),
			n(p+".ip_cm.ipv", uint64(cma.IPVersion)), n(p+".ip_cm.sport", uint64(cma.SrcPort)),
			ad(p+".ip_cm.sip4", cma.Src), ad(p+".ip_cm.dip4", cma.Dst),
			bs(p+".ip_cm.private", m.PrivateData[mad.CMAHeaderLen:]))
	case *mad.REP:
		const p = "infiniband.cm.rep"
		es = append(es, n(p, uint64(m.LocalCommID)), n(p+".remotecommid", uint64(m.RemoteCommID)),
			n(p+".localqkey", uint64(m.LocalQKey)), n(p+".localqpn", uint64(m.LocalQPN)),
			n(p+".localeecn", uint64(m.LocalEECN)), n(p+".startpsn", uint64(m.StartingPSN)),
			n(p+".respres", uint64(m.ResponderResources)), n(p+".initdepth", uint64(m.InitiatorDepth)),
			n(p+".tgtackdelay", uint64(m.TargetACKDelay)), n(p+".failoveracc", uint64(m.FailoverAccepted)),
			bit(p+".e2eflowctrl", m.EndToEndFlowControl), n(p+".rnrretrcount", uint64(m.RNRRetryCount)),
			bit(p+".srq", m.SRQ), n(p+".localcaguid", m.LocalCAGUID), bs(p+".private", m.PrivateData))
	case *mad.RTU:
		const p = "infiniband.cm.rtu"
		es = append(es, n(p+".localcommid", uint64(m.LocalCommID)), n(p+".remotecommid", uint64(m.RemoteCommID)),
			bs(p+".private", m.PrivateData))
	case *mad.DREQ:
		const p = "infiniband.cm.dreq"
		es = append(es, n(p+".localcommid", uint64(m.LocalCommID)), n(p+".remotecommid", uint64(m.RemoteCommID)),
			n("infiniband.cm.req.remoteqpneecn", uint64(m.RemoteQPN)), bs(p+".private", m.PrivateData))
	case *mad.DREP:
		const p = "infiniband.cm.drsp"
		es = append(es, n(p+".localcommid", uint64(m.LocalCommID)), n(p+".remotecommid", uint64(m.RemoteCommID)),
			bs(p+".private", m.PrivateData))
	case *mad.REJ:
		const p = "infiniband.cm.rej"
		ari := make([]byte, mad.REJARILen)
		copy(ari, m.ARI)
		es = append(es, n(p+".localcommid", uint64(m.LocalCommID)), n(p+".remotecommid", uint64(m.RemoteCommID)),
			n(p+".msgrej", uint64(m.MessageRejected)), n(p+".rejinfolen", uint64(len(m.ARI))),
			n(p+".reason", uint64(m.Reason)), bs(p+".ari", ari), bs(p+".private", m.PrivateData))
	default:
		return nil // SIDR: not dissected by tshark 4.0
	}
	return es
}

// TestTsharkOracle compares every CM field tshark shows for each captured
// MAD with this package's parse of it.
func TestTsharkOracle(t *testing.T) {
	bin := tsharkBinary(t)
	checked := map[uint16]int{}
	for _, path := range cmCaptures(t) {
		t.Run(filepath.Base(path), func(t *testing.T) {
			mads, _ := readMADs(t, path)
			ts := runTshark(t, bin, path)
			require.Len(t, ts, len(mads), "tshark sees as many MADs as we do")
			for _, c := range mads {
				f, ok := ts[c.frame]
				require.True(t, ok, "frame %d: tshark shows no MAD", c.frame)
				// The MAD bytes tshark dissected are the ones parsed.
				bs("infiniband.mad", c.raw).check(t, c.frame, f)
				es := expectations(t, c)
				if es == nil {
					continue
				}
				for _, e := range es {
					e.check(t, c.frame, f)
				}
				checked[c.hdr.AttrID]++
			}
		})
	}
	require.Equal(t, map[uint16]int{mad.AttrREQ: 13, mad.AttrREP: 12, mad.AttrRTU: 12, mad.AttrDREQ: 12,
		mad.AttrDREP: 12, mad.AttrREJ: 1}, checked)
}
