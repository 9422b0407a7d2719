// Package mad encodes and decodes InfiniBand Communication Management
// MADs (IBA Vol 1 chapter 12) as RoCEv2 carries them, and the IP
// addressing header rdma_cm adds to them. Pure codecs: no I/O, no state.
//
// # Why this is needed on RoCE
//
// Before two RC QPs can talk, each side must learn the other's QPN,
// starting PSN and path; on InfiniBand and RoCE alike that is the CM's
// job. A CM message is a 256-byte MAD (a 24-byte common header, Header,
// and 232 bytes of attribute data) sent as a UD SEND_ONLY to the peer's
// QP 1 (the GSI QP), with DETH Q_Key 0x80010000 (IB_QP1_QKEY), source QP 1
// and P_Key 0xFFFF; there is no TCP exchange at all. rdma_rxe drops QP 1
// packets with any other Q_Key. The kernel CM answers to the address of
// the received GRH, so a receiver needs the GRH, rebuilt from the IP
// header on RoCEv2. Messages are matched on comm IDs, not on the MAD
// transaction ID (REP, RTU and MRA reuse the REQ's; DREQ gets a new one).
//
// The messages: REQ (connect request, active side) is answered by REP
// (accept) or REJ (reject), and REP by RTU (ready to use); MRA asks the
// peer to wait longer; DREQ/DREP tear down; SIDR_REQ/SIDR_REP resolve a
// service ID to a UD QPN and Q_Key. Each has a ParseXXX over the 232 data
// bytes and an AppendData; Parse and Append handle whole MADs.
//
// # GIDs on RoCE
//
// GIDs are the endpoints' IP addresses (the RoCEv2 GID table): an IPv6
// address as is, an IPv4 address in its IPv4-mapped form ::ffff:a.b.c.d.
// LIDs carry no meaning on RoCE; the kernel puts 0xFFFF (permissive) in
// both of a REQ's path LIDs. Path.LocalGID and RemoteGID are netip.Addr
// values in that 16-byte form.
//
// # What rdma_cm adds
//
// rdma_cm (Linux cma.c, librdmacm) maps IP addressing onto the CM: the
// service ID is port space << 16 | port (ServiceID, SplitServiceID; TCP
// port space 0x0106 for RC, UDP 0x0111 for UD via SIDR), and the private
// data of REQ and SIDR_REQ starts with a 36-byte header (CMAHeader) with
// the IP version, the active side's source port and both IP addresses,
// which the passive kernel checks against its listener. Careful: that
// header stores an IPv4 address in the last 4 of 16 bytes after 12 zero
// bytes, not in the ::ffff: form the GIDs use.
//
// # Conventions
//
// Parse checks lengths once and ignores reserved bits; private data comes
// back as the whole area (the wire carries no length) and is a copy, never
// an alias of the input. Append writes reserved bits as zero and pads
// private data with zeros. Fields wider than their bit field (a 24-bit QPN
// or PSN, a 5-bit timeout) or private data longer than its area are
// errors, never silently truncated: Validate and Marshal return them, and
// AppendData/Append panic on them, since encoding an unchecked message is
// a bug in the caller. Every error wraps one of the Err sentinels.
//
// Re-encoding any CM MAD of the rdma_rxe captures in ../shared/pcaps
// reproduces it byte for byte; the tests check that, and compare every
// field Wireshark dissects. The IBA 1.4 fields Linux knows (vendor IDs,
// SAP supported) are decoded rather than treated as reserved, so nothing a
// Linux peer writes is lost.
package mad
