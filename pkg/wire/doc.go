// Package wire encodes and decodes RoCEv2 packets (InfiniBand transport
// headers over UDP port 4791) exactly as Linux's rdma_rxe does: the opcode
// table, typed byte-slice views of every transport header (BTH, RETH, AETH,
// AtomicETH, AtomicAckETH, DETH, ImmDt, IETH, FETH, CNP), a zero-copy
// Packet parser, a zero-allocation builder (Headers) and the ICRC.
//
// Nothing here does I/O or allocates per packet. Views alias the caller's
// buffer; Parse validates lengths once so accessors need no checks.
//
// # ICRC on the receive side
//
// The ICRC covers the IP header, but a program reading a UDP socket never
// sees it. Every covered field is known from the socket (addresses, ports,
// lengths) or masked (TOS, TTL, checksums, IPv6 traffic class, flow label,
// hop limit) except two IPv4 fields: Identification and the DF flag.
// rdma_rxe fills the ID from the kernel's per-destination counter, so it is
// effectively unknown. Flow.Verify exploits the linearity of CRC-32 over
// GF(2): it computes the ICRC with ID 0 and DF set, and solves for the 16
// ID bits that explain the difference, leaving a 16-bit residual check. If
// that fails it tries DF clear (rxe and Linux always set DF, but nothing
// forbids a peer from clearing it). The verifier therefore gives about 15
// bits of protection against random corruption (false accept probability
// 2^-16 per hypothesis, two hypotheses), not CRC-32's 32, and it cannot
// see corruption confined to the IPv4 ID. Unlike CRC-32 it does not catch
// every single-bit error: TestVerifyStrength, on a 1 KiB WRITE, accepts 1
// of 8440 single-bit flips and 5 of 200000 random multi-byte corruptions
// (2^-15 predicts 6). The solved ID is returned so a caller can tighten the
// check, and the engine does (pkg/roce, ipv4id.go): rxed peers always seal
// with ID 0 and rdma_rxe's IDs follow a per-destination counter, so it
// admits only IDs a peer can send. Measured over 2^26 random corruptions
// of a 64-byte SEND (TestIPv4CorruptionFalseAcceptRate): the ICRC alone
// accepts 2.7e-5; with the ID check, 0 from an rxed peer (expected about
// 4e-10), 5.8e-7 from an rdma_rxe peer (its window is about 1300 of 65536
// IDs), 9.8e-7 right after a rejected packet. UDP checksums (rxe sends 0)
// and Ethernet FCS protect the same bytes on real links.
// IPv6 has no unknown covered field: Verify is a
// full 32-bit check there. A receive path that sees the real IP header
// (raw sockets, pcap) should use VerifyICRC instead.
//
// # ICRC on the send side
//
// Flow.Seal computes the ICRC for the header Linux puts on a datagram from
// an unconnected UDP socket with IP_PMTUDISC_DO: IPv4 ID 0 and DF (a
// connect()ed socket would get a per-socket ID and break the ICRC), so a
// kernel rxe peer, which checks against the real header, accepts it.
//
// # ICRC speed
//
// Small packets run slicing-by-8 over the masked headers, read straight
// from the input a word at a time, then the rest. From 256 bytes of payload
// on, where the CPU has AVX-512 with VPCLMULQDQ (amd64, without the purego
// build tag), the masked headers and the start of the payload make one
// 64-byte block and a carry-less-multiply pass of our own (icrc_fold_amd64.s)
// folds it and the payload together, four 512-bit accumulators abreast.
// Handing the payload to hash/crc32 after the headers' register instead
// made the vector pass wait for a chain of table lookups, and hash/crc32's
// own pass runs one accumulator: a 4 KiB packet's ICRC took 86 ns against
// hash/crc32's 65 over the same bytes; the one pass takes 50. Everywhere
// else the table path runs, and the tests run both where both can.
package wire
