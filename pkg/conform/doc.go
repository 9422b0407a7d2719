// Package conform is a RoCEv2 conformance engine: it tests a peer's wire
// behaviour against the InfiniBand Architecture rules through the peer's
// own, unmodified tools.
//
// The peer creates its QP with a standard tool (an ib_write_bw, ib_read_bw,
// ib_atomic_bw or ib_send_bw server, an ibv_rc_pingpong or ibv_ud_pingpong
// server). The engine plays that tool's client over the tool's out-of-band
// TCP exchange (pkg/oob) and so learns the peer's QPN, PSN, rkey and buffer
// address. From then on it does not behave like the tool: it crafts every
// packet itself with pkg/wire on its own UDP socket (Headers, Flow.Seal),
// with full control of every field (PSN, opcode sequence, AckReq, keys,
// lengths, pad, ICRC, P_Key, destination QP), observes what the peer sends
// back (ACK/NAK syndromes and MSN, READ responses, atomic acknowledgements,
// retransmissions and their timing) and judges it against one rule.
//
// With Config.Serve the roles swap: the engine plays the tool's server, the
// peer's client connects, and the engine withholds, duplicates, forges or
// NAKs the acknowledgements its requests get.
//
// A Scenario is one such script: an ID, the IBA rule it checks, what the
// rule expects, the tools that can reach it and a run function. Run gives
// each scenario a fresh connection and a deadline; its Result is PASS,
// FAIL, DEVIATION (IBA allows a choice and the peer made another than the
// one the scenario names), SKIP (the peer's tool cannot reach the case) or
// ERROR (the scenario could not run: the exchange failed, the peer
// vanished), with one line of evidence naming the deciding packets and the
// whole packet trace (Trace) for ladder diagrams and captures.
//
// Nothing here uses rxed's own RoCE engine (pkg/roce, pkg/ib): the side
// under the engine's control is only pkg/wire and a UDP socket, so a
// verdict never depends on rxed's protocol code.
package conform
