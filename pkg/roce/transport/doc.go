// Package transport moves RoCEv2 datagrams (UDP payloads: BTH … ICRC) between
// a RoCE engine and the network.
//
// The design is batch-first, after wireguard-go's conn package: one call moves
// many datagrams so that system-call and wake-up costs are shared by a batch.
// Implementations of Conn:
//
//   - OpenUDP: UDP sockets, one per local address (recvmmsg/sendmmsg, UDP
//     GSO/GRO, IP_PKTINFO on Linux; plain net.UDPConn elsewhere).
//   - MemNetwork.Listen: in-process delivery between several Conns, no
//     sockets, deterministic.
//   - NewFaulty: a wrapper injecting loss, duplication, reordering,
//     corruption and delay, reproducibly from a seed.
//   - NewPcapRecorder: a wrapper writing every datagram to a pcap stream as
//     an Ethernet/IP/UDP frame whose IP header is the one the kernel sends.
//
// # Facts the Linux implementation rests on
//
// The ICRC covers the IP header except TOS/TTL/checksum (IPv4) or traffic
// class/flow label/hop limit (IPv6), so the sender must know the header the
// kernel will write. From an unconnected socket with IP_PMTUDISC_DO, Linux
// writes IPv4 ID 0 and DF (TestKernelSendsPredictableIPv4Header captures it
// on lo). UDP GSO breaks that for IPv4: segmentation numbers the segments'
// IDs 0, 1, 2, … (TestGSOSegmentIPv4IDs shows it on a tap device in a
// private network namespace), so IPv4 GSO is used only towards loopback
// addresses, where the message reaches the receiving socket unsegmented.
// IPv6 has no ID, and GSO is used for every IPv6 destination.
//
// rdma_rxe sends UDP checksum 0, which IPv6 forbids, so the IPv6 sockets set
// UDP_NO_CHECK6_RX. They do not set UDP_NO_CHECK6_TX: rdma_rxe's own socket
// accepts real checksums, every other IPv6 stack requires them, and the
// kernel refuses GSO on a socket without transmit checksums. The ICRC masks
// the field either way.
//
// golang.org/x/net's ipv4/ipv6 ReadBatch allocates a *net.UDPAddr per
// received message (BenchmarkXNetBatch: 2 allocations per datagram), so the
// Linux code calls recvmmsg/sendmmsg itself through syscall.RawConn, on
// preallocated mmsghdr arrays: no allocation per datagram in steady state.
package transport
