package qp

import "sync/atomic"

// Counters are the protocol counters of one device, named and counted like
// rdma_rxe's hw_counters (rxe_hw_counters.c) so operators can compare the
// two side by side. Every field is updated atomically; a Counters is
// shared by all QPs of a device.
type Counters struct {
	SentPkts             atomic.Uint64 // sent_pkts: packets handed to the transport
	RcvdPkts             atomic.Uint64 // rcvd_pkts: packets accepted by the receive checks
	DuplicateRequest     atomic.Uint64 // duplicate_request: responder saw a PSN it already executed
	OutOfSeqRequest      atomic.Uint64 // out_of_seq_request: responder saw a PSN gap
	RcvdRNRErr           atomic.Uint64 // rcvd_rnr_err: requester got an RNR NAK
	SendRNRErr           atomic.Uint64 // send_rnr_err: responder sent an RNR NAK
	RcvdSeqErr           atomic.Uint64 // rcvd_seq_err: requester got a PSN sequence NAK
	AckDeferred          atomic.Uint64 // ack_deferred: responder withheld an ACK (no AckReq)
	RetryExceededErr     atomic.Uint64 // retry_exceeded_err: retry_cnt ran out
	RetryRNRExceededErr  atomic.Uint64 // retry_rnr_exceeded_err: rnr_retry ran out
	CompleterRetryErr    atomic.Uint64 // completer_retry_err: requester restarted from an older PSN
	SendErr              atomic.Uint64 // send_err: the transport refused a packet
	LinkDowned           atomic.Uint64 // link_downed: the port went down
	RDMASends            atomic.Uint64 // rdma_sends: SEND messages started by the requester
	RDMARecvs            atomic.Uint64 // rdma_recvs: SEND messages completed by the responder
	CNPRcvd              atomic.Uint64 // cnp_rcvd: congestion notification packets received
	RetransmitTimeouts   atomic.Uint64 // retransmit_timeouts: retransmit timer expiries with work outstanding
	ImpliedNAKs          atomic.Uint64 // implied_naks: ACKs that skipped an unanswered READ/atomic
	ResponderResourceHit atomic.Uint64 // replayed_responses: READ/atomic responses replayed for a duplicate
	ReplaysLimited       atomic.Uint64 // replays_limited: duplicate READs not replayed (too many without progress)
	NAKsLimited          atomic.Uint64 // naks_limited: PSN sequence NAKs not sent (per-QP rate limit)
	GhostResponses       atomic.Uint64 // ghost_responses: responses for PSNs never sent, ignored
	FastRetransmits      atomic.Uint64 // fast_retransmits: go-back-N on the requester's own round-trip timeout (recovery.go)
	ReadResponseGaps     atomic.Uint64 // read_response_gaps: gaps in a READ's responses, re-requested at once
	ReadRepliesKept      atomic.Uint64 // read_replies_kept: later READs' whole replies placed behind a gap, not asked for again
}

// CounterNames lists the rxe counter names in rxe's order, followed by
// the ones this implementation adds.
var CounterNames = []string{
	"sent_pkts", "rcvd_pkts", "duplicate_request", "out_of_seq_request",
	"rcvd_rnr_err", "send_rnr_err", "rcvd_seq_err", "ack_deferred",
	"retry_exceeded_err", "retry_rnr_exceeded_err", "completer_retry_err",
	"send_err", "link_downed", "rdma_sends", "rdma_recvs",
	"cnp_rcvd", "retransmit_timeouts", "implied_naks", "replayed_responses",
	"replays_limited", "naks_limited", "ghost_responses",
	"fast_retransmits", "read_response_gaps", "read_replies_kept",
}

// Snapshot returns every counter by name (see CounterNames).
func (c *Counters) Snapshot() map[string]uint64 {
	// In CounterNames order.
	fields := [...]*atomic.Uint64{
		&c.SentPkts, &c.RcvdPkts, &c.DuplicateRequest, &c.OutOfSeqRequest,
		&c.RcvdRNRErr, &c.SendRNRErr, &c.RcvdSeqErr, &c.AckDeferred,
		&c.RetryExceededErr, &c.RetryRNRExceededErr, &c.CompleterRetryErr,
		&c.SendErr, &c.LinkDowned, &c.RDMASends, &c.RDMARecvs,
		&c.CNPRcvd, &c.RetransmitTimeouts, &c.ImpliedNAKs, &c.ResponderResourceHit,
		&c.ReplaysLimited, &c.NAKsLimited, &c.GhostResponses,
		&c.FastRetransmits, &c.ReadResponseGaps, &c.ReadRepliesKept,
	}
	m := make(map[string]uint64, len(fields))
	for i, f := range fields {
		m[CounterNames[i]] = f.Load()
	}
	return m
}
