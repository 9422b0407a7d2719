package cm

import "github.com/rxed/rxed/pkg/wire/mad"

// Counter names besides the per-message rx_, tx_, tx_retries_ and rx_dup_
// families.
const (
	// Drops of received MADs.
	cntMalformed   = "rx_malformed"           // truncated, wrong length, a field out of range
	cntBadHeader   = "rx_bad_header"          // not base version 1, class CM, class version 2, method SEND
	cntUnknownAttr = "rx_unknown_attr"        // ClassPortInfo, LAP, APR (not on RoCE, as cm.c), undefined
	cntUnknownComm = "rx_unknown_comm_id"     // no ID has the comm IDs the message names
	cntWrongState  = "rx_wrong_state"         // the ID exists but the message is not expected now
	cntBadDREQQPN  = "rx_dreq_bad_qpn"        // DREQ naming another QPN than ours (cm.c drops it)
	cntTxErrors    = "tx_errors"              // Config.Send failed
	cntRejNoListen = "rej_invalid_service_id" // REJ 8 / SIDR_REP unsupported sent: no listener
	cntRejStale    = "rej_stale_conn"         // REJ 10 sent
	cntRejNoRes    = "rej_no_resources"       // REJ 3 sent: MaxHalfOpen reached
	// A REQ's ID destroyed in REQ_RCVD without a REJ (ID.DestroyNoReject:
	// rdma_cm's full backlog), its retransmission to be taken as new.
	cntREQDropped = "req_dropped"
	// A REP retransmission not sent: its REQs' budget and the spare
	// allowance were spent (reflect.go).
	cntREPRetriesLimited = "rep_retries_limited"
	cntTimeouts          = "timeouts" // REQ, REP, DREQ or SIDR_REQ unanswered after all retries
	cntTimewaitExit      = "timewait_exits"
	// A passive ID established by ID.Established (the QP's COMM_EST)
	// before its RTU arrived.
	cntCommEst = "comm_est"
)

// msgName names a CM attribute for counters and logs.
func msgName(attr uint16) string {
	switch attr {
	case mad.AttrREQ:
		return "req"
	case mad.AttrMRA:
		return "mra"
	case mad.AttrREJ:
		return "rej"
	case mad.AttrREP:
		return "rep"
	case mad.AttrRTU:
		return "rtu"
	case mad.AttrDREQ:
		return "dreq"
	case mad.AttrDREP:
		return "drep"
	case mad.AttrSIDRREQ:
		return "sidr_req"
	case mad.AttrSIDRREP:
		return "sidr_rep"
	case mad.AttrLAP:
		return "lap"
	case mad.AttrAPR:
		return "apr"
	case mad.AttrClassPortInfo:
		return "class_port_info"
	}
	return "other"
}
