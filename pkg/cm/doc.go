// Package cm is the InfiniBand Communication Manager (IBA Vol 1 ch. 12) as
// a pure, deterministic state machine that behaves like Linux's
// drivers/infiniband/core/cm.c driven by rdma_cm (cma.c). It has no
// sockets: every MAD received on QP 1 goes to Manager.HandleMADTraffic
// (with the traffic class it arrived with; HandleMAD without), every MAD
// it sends leaves through Config.Send, and time comes from Config.Clock.
//
// # States
//
// Active side: Connect sends the REQ (REQ_SENT; an MRA moves it to
// MRA_REQ_RCVD). The REP gives EventREP in MRA_REP_SENT (rdma_cm arms a
// delayed MRA, sent only if the REP is retransmitted before we answer);
// SendRTU moves to ESTABLISHED (ConnectParams.AutoRTU does it before the
// event). A duplicate REP in ESTABLISHED is answered with the RTU again.
//
// Passive side: a REQ matching a Listener creates an ID in REQ_RCVD and
// gives EventREQ; once the handler has returned (or when the consumer
// calls PrepareMRA) the ID waits in MRA_REQ_SENT (the delayed MRA again,
// as cma_ib_req_handler arms it after its handler). A REJ carries what
// cm_format_rej puts in it for the state it leaves from: local comm ID 0
// from REQ_RCVD (a REQ refused inside the handler), ours from every other
// state; "REQ rejected" from REQ_RCVD and MRA_REQ_SENT, "REP" from
// REP_RCVD and MRA_REP_SENT, "other" otherwise. Accept sends the REP
// (REP_SENT, MRA_REP_RCVD after an MRA) until the RTU or Established
// (ib_cm_notify COMM_EST) moves it to ESTABLISHED (a DREQ overtaking a
// lost RTU does too: EventEstablished, then EventDREQ); Reject sends a REJ.
// DestroyNoReject in REQ_RCVD (rdma_cm's full backlog: cm_destroy_id with
// -ENOMEM) sends none and forgets the REQ, so its retransmission is a new
// request that may find room. A
// REQ is checked in cm_match_req's order: a duplicate (same peer comm ID
// and CA GUID) goes to its ID (MRA in MRA_REQ_SENT, the REP again in
// REP_SENT, REJ 10 in TIMEWAIT, dropped otherwise); a REQ reusing the
// (CA GUID, QPN) of one of our connections gets REJ 10 stale connection
// and that connection, if established, a DREQ; no listener: REJ 8 invalid
// service ID; more than Config.MaxHalfOpen passive connections between REQ
// and RTU: REJ 3 no resources. These REJs echo the REQ's TID and, as
// cm_issue_rej copies them, carry the REQ's local comm ID as remote and its
// bytes 4-7 (reserved, and the vendor ID: 0 from rdma_cm) as local.
//
// Disconnect: Disconnect sends the DREQ (DREQ_SENT) until the DREP
// (EventDisconnected) or the retries run out (EventDisconnected with
// ErrTimeout). A received DREQ is answered with a DREP at once, as rdma_cm
// does (EventDREQ); crossed DREQs both end that way; a DREQ in TIMEWAIT
// gets the DREP again, a DREQ for no ID gets one too (cm_issue_drep). Both
// sides then sit in TIMEWAIT for CMTimeout(av.timeout) and leave with
// EventTimewaitExit; the ID is then gone. After crossed DREQs the DREP to
// ours, which cm.c drops in TIMEWAIT, gives EventCrossedDREP (nothing is
// sent): the peer had our DREQ, so it cancelled its own and will retry
// none, and the side that got it owes the peer nothing more; the
// consumer that stays up only to answer a retried DREQ may go. While in timewait an ID keeps
// its (GUID, comm ID) and (GUID, QPN) entries, so a REQ reusing them is
// stale (cm.c drops them on entering timewait; IBA keeps them).
//
// Unexpected messages: a REP, RTU, DREQ, DREP, MRA or REJ that names no
// ID, or an ID in a state that does not expect it, gets what cm.c's
// handler for it gives (msg_state_test.go checks every pair): nothing,
// except a REP for an ESTABLISHED ID (the RTU again) or one in
// MRA_REP_SENT (the MRA again), and a DREQ (a DREP, also for no ID). A
// timeout REJ finds its ID by the CA GUID in its ARI area, read whatever
// the REJ's ARI length says, as cm_acquire_rejected_id reads it.
//
// SIDR: SIDRQuery sends a SIDR_REQ until a SIDR_REP (SIDRHandler); a
// SIDR_REQ matching a Listener gives EventSIDRREQ, answered by SIDRReply;
// no listener: SIDR_REP status 1 (unsupported).
//
// # Timers, as cm.c computes them
//
// A time value t stands for 4.096 us x 2^t; cm.c waits CMTimeout(t) =
// 1 << max(t-8, 0) ms. Active: the REQ and DREQ wait 2 x CMTimeout(packet
// life time) + CMTimeout(remote CM response timeout) (rdma_cm's 16 and 20:
// 4608 ms) and are sent 1 + MaxCMRetries times. Passive: the REP and DREQ
// wait CMTimeout(the REQ's local CM response timeout), as often as the
// REQ's MaxCMRetries; but until the peer answers, each REQ received pays
// for only 3 REPs and further retransmissions come from a small allowance
// shared by the Manager (reflect.go: a forged REQ must not make us a
// reflector). An MRA makes the current and later waits
// CMTimeout(service timeout) + CMTimeout(av.timeout). av.timeout is the
// packet life time + 1 (passive: the REQ's local ACK timeout), refined on
// the REP by cm_ack_timeout(target ACK delay, ...); timewait lasts
// CMTimeout(av.timeout): 512 ms with rdma_cm's values on rxe.
//
// # Goroutines
//
// See Manager: handlers run on the goroutine that caused the event, one at
// a time, in order, with no lock held, and may call any method.
package cm
