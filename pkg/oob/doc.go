// Package oob implements the out-of-band TCP exchanges of the RDMA tools
// rxed mirrors, byte for byte, and their console output.
//
// Two protocols are covered:
//
//   - ibv_rc_pingpong / ibv_uc_pingpong / ibv_ud_pingpong (rdma-core): one
//     52-byte ASCII address each way and a "done" from the client
//     (PingpongDest, DialPingpong, ListenPingpong).
//   - perftest 4.5 (ib_write_bw, ib_read_lat, ...) without rdma_cm: version,
//     system data and MTU negotiation, 108-byte key messages used both for
//     addresses and as barriers, bandwidth report exchange and the closing
//     "done" (Session, DialPerftest, ListenPerftest, Test).
//
// Every exchange is bounded: each step has a deadline (Options.Timeout) and
// honours its context, and every failure is one line naming the peer and the
// step, e.g. "oob: peer 10.0.0.1:18515 sent 40 bytes, want 52 (pingpong
// address): connection closed".
//
// The formatting half (WriteTestInfo, WriteBWResult, WriteLatencyResult,
// WritePingpongSummary, ...) reproduces the tools' printf formats, so rxed's
// output can be diffed against the real tools'. It does no I/O of its own
// beyond the io.Writer it is given.
//
// The RDMA side is not here: callers move their QPs through RTR/RTS in the
// callbacks (or between the calls) this package documents.
package oob
