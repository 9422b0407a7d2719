package mad_test

import (
	"fmt"
	"net/netip"

	"github.com/rxed/rxed/pkg/wire/mad"
)

// A REQ as rdma_cm sends it: the service ID names the TCP port space and
// port, and the private data starts with the rdma_cm IP header.
func Example() {
	src, dst := netip.MustParseAddr("10.77.0.12"), netip.MustParseAddr("10.77.0.11")
	pd := mad.CMAHeader{IPVersion: 4, SrcPort: 59719, Src: src, Dst: dst}.Append(nil)
	req := &mad.REQ{
		LocalCommID: 0x4caf495a, ServiceID: mad.ServiceID(mad.PortSpaceTCP, 7174), LocalQPN: 0x2b,
		ResponderResources: 1, InitiatorDepth: 1, StartingPSN: 0x4d3d35, PKey: 0xffff, PathMTU: 3,
		RemoteCMResponseTimeout: 20, LocalCMResponseTimeout: 20, RetryCount: 7, RNRRetryCount: 7, MaxCMRetries: 15,
		Primary:     mad.Path{LocalLID: 0xffff, RemoteLID: 0xffff, LocalGID: src, RemoteGID: dst, HopLimit: 64, LocalACKTimeout: 19},
		PrivateData: pd,
	}
	b, err := mad.Marshal(2<<32|0x4caf495a, req)
	if err != nil {
		panic(err)
	}
	h, m, err := mad.Parse(b)
	if err != nil {
		panic(err)
	}
	got := m.(*mad.REQ)
	ps, port, _ := mad.SplitServiceID(got.ServiceID)
	cma, _ := mad.ParseCMAHeader(got.PrivateData)
	fmt.Printf("%d bytes, TID %#x, attribute %#04x\n", len(b), h.TID, h.AttrID)
	fmt.Printf("%v port %d, QPN %#x, GID %v\n", ps, port, got.LocalQPN, got.Primary.LocalGID)
	fmt.Printf("rdma_cm: IPv%d %v:%d -> %v\n", cma.IPVersion, cma.Src, cma.SrcPort, cma.Dst)
	fmt.Println(mad.TimeoutDuration(got.RemoteCMResponseTimeout))
	// Output:
	// 256 bytes, TID 0x24caf495a, attribute 0x0010
	// RDMA_PS_TCP port 7174, QPN 0x2b, GID ::ffff:10.77.0.12
	// rdma_cm: IPv4 10.77.0.12:59719 -> 10.77.0.11
	// 4.294967296s
}
