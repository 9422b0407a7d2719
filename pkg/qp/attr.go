package qp

import (
	"math/bits"
	"net/netip"
	"strconv"
	"strings"

	"github.com/rxed/rxed/pkg/mr"
)

// AttrMask selects the Attr fields a modify or query applies to. The bits
// have the values of enum ibv_qp_attr_mask.
type AttrMask uint32

// Attribute mask bits (IBV_QP_*).
const (
	AttrState            AttrMask = 1 << 0  // IBV_QP_STATE
	AttrCurState         AttrMask = 1 << 1  // IBV_QP_CUR_STATE
	AttrEnSQDAsyncNotify AttrMask = 1 << 2  // IBV_QP_EN_SQD_ASYNC_NOTIFY
	AttrAccessFlags      AttrMask = 1 << 3  // IBV_QP_ACCESS_FLAGS
	AttrPKeyIndex        AttrMask = 1 << 4  // IBV_QP_PKEY_INDEX
	AttrPort             AttrMask = 1 << 5  // IBV_QP_PORT
	AttrQKey             AttrMask = 1 << 6  // IBV_QP_QKEY
	AttrAV               AttrMask = 1 << 7  // IBV_QP_AV
	AttrPathMTU          AttrMask = 1 << 8  // IBV_QP_PATH_MTU
	AttrTimeout          AttrMask = 1 << 9  // IBV_QP_TIMEOUT
	AttrRetryCnt         AttrMask = 1 << 10 // IBV_QP_RETRY_CNT
	AttrRNRRetry         AttrMask = 1 << 11 // IBV_QP_RNR_RETRY
	AttrRQPSN            AttrMask = 1 << 12 // IBV_QP_RQ_PSN
	AttrMaxQPRdAtomic    AttrMask = 1 << 13 // IBV_QP_MAX_QP_RD_ATOMIC
	AttrAltPath          AttrMask = 1 << 14 // IBV_QP_ALT_PATH
	AttrMinRNRTimer      AttrMask = 1 << 15 // IBV_QP_MIN_RNR_TIMER
	AttrSQPSN            AttrMask = 1 << 16 // IBV_QP_SQ_PSN
	AttrMaxDestRdAtomic  AttrMask = 1 << 17 // IBV_QP_MAX_DEST_RD_ATOMIC
	AttrPathMigState     AttrMask = 1 << 18 // IBV_QP_PATH_MIG_STATE
	AttrCap              AttrMask = 1 << 19 // IBV_QP_CAP
	AttrDestQPN          AttrMask = 1 << 20 // IBV_QP_DEST_QPN
	AttrRateLimit        AttrMask = 1 << 25 // IBV_QP_RATE_LIMIT

	// AttrAll is every bit defined above.
	AttrAll = AttrState | AttrCurState | AttrEnSQDAsyncNotify | AttrAccessFlags |
		AttrPKeyIndex | AttrPort | AttrQKey | AttrAV | AttrPathMTU | AttrTimeout |
		AttrRetryCnt | AttrRNRRetry | AttrRQPSN | AttrMaxQPRdAtomic | AttrAltPath |
		AttrMinRNRTimer | AttrSQPSN | AttrMaxDestRdAtomic | AttrPathMigState |
		AttrCap | AttrDestQPN | AttrRateLimit
)

var attrNames = map[AttrMask]string{
	AttrState:            "IBV_QP_STATE",
	AttrCurState:         "IBV_QP_CUR_STATE",
	AttrEnSQDAsyncNotify: "IBV_QP_EN_SQD_ASYNC_NOTIFY",
	AttrAccessFlags:      "IBV_QP_ACCESS_FLAGS",
	AttrPKeyIndex:        "IBV_QP_PKEY_INDEX",
	AttrPort:             "IBV_QP_PORT",
	AttrQKey:             "IBV_QP_QKEY",
	AttrAV:               "IBV_QP_AV",
	AttrPathMTU:          "IBV_QP_PATH_MTU",
	AttrTimeout:          "IBV_QP_TIMEOUT",
	AttrRetryCnt:         "IBV_QP_RETRY_CNT",
	AttrRNRRetry:         "IBV_QP_RNR_RETRY",
	AttrRQPSN:            "IBV_QP_RQ_PSN",
	AttrMaxQPRdAtomic:    "IBV_QP_MAX_QP_RD_ATOMIC",
	AttrAltPath:          "IBV_QP_ALT_PATH",
	AttrMinRNRTimer:      "IBV_QP_MIN_RNR_TIMER",
	AttrSQPSN:            "IBV_QP_SQ_PSN",
	AttrMaxDestRdAtomic:  "IBV_QP_MAX_DEST_RD_ATOMIC",
	AttrPathMigState:     "IBV_QP_PATH_MIG_STATE",
	AttrCap:              "IBV_QP_CAP",
	AttrDestQPN:          "IBV_QP_DEST_QPN",
	AttrRateLimit:        "IBV_QP_RATE_LIMIT",
}

// Has reports whether every bit of b is set in m.
func (m AttrMask) Has(b AttrMask) bool { return m&b == b }

// String lists the set bits by their libibverbs names joined with "|",
// lowest bit first; unknown bits are shown in hexadecimal. The empty mask
// is "0".
func (m AttrMask) String() string {
	if m == 0 {
		return "0"
	}
	var sb strings.Builder
	for rest := m; rest != 0; {
		bit := AttrMask(1) << bits.TrailingZeros32(uint32(rest))
		rest &^= bit
		if sb.Len() > 0 {
			sb.WriteByte('|')
		}
		if name, ok := attrNames[bit]; ok {
			sb.WriteString(name)
		} else {
			sb.WriteString("0x")
			sb.WriteString(strconv.FormatUint(uint64(bit), 16))
		}
	}
	return sb.String()
}

// MigState is the path migration state, numbered like enum ibv_mig_state.
type MigState int

// Path migration states.
const (
	Migrated MigState = 0 // IBV_MIG_MIGRATED
	Rearm    MigState = 1 // IBV_MIG_REARM
	Armed    MigState = 2 // IBV_MIG_ARMED
)

// Cap holds a QP's queue sizes, like struct ibv_qp_cap.
type Cap struct {
	MaxSendWR     uint32 // send queue depth
	MaxRecvWR     uint32 // receive queue depth (0 with an SRQ)
	MaxSendSGE    uint32 // scatter/gather entries per send WR
	MaxRecvSGE    uint32 // scatter/gather entries per receive WR
	MaxInlineData uint32 // bytes of inline data per send WR
}

// AddrVector is the path to a peer, like struct ibv_ah_attr with its GRH.
// On RoCEv2 the GIDs are IP addresses: DGID holds the peer's address
// (IPv4 as IPv4 or as IPv4-mapped IPv6, both are accepted) and SGIDIndex
// picks our source address from the port's GID table.
type AddrVector struct {
	DGID         netip.Addr // destination GID / IP address
	FlowLabel    uint32     // IPv6 flow label (20 bits)
	SGIDIndex    uint8      // index into the local GID table
	HopLimit     uint8      // IPv6 hop limit / IPv4 TTL; 0 means the default (64)
	TrafficClass uint8      // IPv6 traffic class / IPv4 TOS (DSCP and ECN)
	SL           uint8      // service level (4 bits); carried, not used on RoCE
	StaticRate   uint8      // enum ibv_rate; carried, not enforced
	PortNum      uint8      // local port, 1
	// SrcPort is the UDP source port to send from; 0 lets the engine derive
	// it from the QPNs as rxe does (entropy for ECMP). rxe itself ignores it.
	SrcPort uint16
	// DestPort is the peer's UDP port; 0 means the RoCEv2 port 4791. Only
	// useful to run several engines on one host (tests, loopback demos):
	// a real rxe peer always listens on 4791.
	DestPort uint16
	// PinSrcPort makes an RC or UC QP accept packets only from UDP source
	// port DestPort (4791 when 0), and drop the rest as drop_address. An
	// rxed engine sends every packet from the port it receives on, so
	// between rxed peers a forger must then also hit the right source
	// port, not only the source address and PSN. Off by default and only
	// for rxed peers: rdma_rxe and RoCE NICs send from a port derived from
	// the QPNs (0xC000 | hash), which a pinned QP would drop. UD and the
	// requester side ignore it.
	PinSrcPort bool
}

// peerPort is the UDP port the peer receives on, and with PinSrcPort the
// one its packets must come from.
func (av *AddrVector) peerPort() uint16 {
	if av.DestPort == 0 {
		return 4791
	}
	return av.DestPort
}

// Attr holds QP attributes, field for field like struct ibv_qp_attr. Which
// fields a modify uses is given by an AttrMask.
type Attr struct {
	State        State    // qp_state: the state to move to (AttrState)
	CurState     State    // cur_qp_state: the state the caller believes the QP is in (AttrCurState)
	PathMTU      MTU      // path_mtu (AttrPathMTU)
	PathMigState MigState // path_mig_state (AttrPathMigState)
	QKey         uint32   // qkey (AttrQKey)
	RQPSN        PSN      // rq_psn: first PSN expected from the peer (AttrRQPSN); Modify keeps the low 24 bits
	SQPSN        PSN      // sq_psn: first PSN we send (AttrSQPSN); Modify keeps the low 24 bits
	DestQPN      uint32   // dest_qp_num: the peer's QPN, 24 bits (AttrDestQPN)
	// AccessFlags is qp_access_flags: which remote operations the responder
	// allows (AttrAccessFlags), in pkg/mr's Access type, the one type of
	// IBV_ACCESS_* flags for regions, windows and QPs.
	AccessFlags      mr.Access
	Cap              Cap        // cap (AttrCap)
	AV               AddrVector // ah_attr: primary path (AttrAV)
	AltAV            AddrVector // alt_ah_attr: alternate path (AttrAltPath)
	PKeyIndex        uint16     // pkey_index (AttrPKeyIndex)
	AltPKeyIndex     uint16     // alt_pkey_index (AttrAltPath)
	EnSQDAsyncNotify bool       // en_sqd_async_notify (AttrEnSQDAsyncNotify)
	SQDraining       bool       // sq_draining: query only
	MaxRdAtomic      uint8      // max_rd_atomic: outstanding RDMA reads/atomics we initiate (AttrMaxQPRdAtomic)
	MaxDestRdAtomic  uint8      // max_dest_rd_atomic: outstanding RDMA reads/atomics we accept (AttrMaxDestRdAtomic)
	MinRNRTimer      uint8      // min_rnr_timer: RNR NAK timer code 0-31 (AttrMinRNRTimer)
	PortNum          uint8      // port_num (AttrPort)
	Timeout          uint8      // timeout: local ACK timeout 4.096us * 2^Timeout, 0 = infinite (AttrTimeout)
	RetryCnt         uint8      // retry_cnt: 0-7 (AttrRetryCnt)
	RNRRetry         uint8      // rnr_retry: 0-6, 7 = infinite (AttrRNRRetry)
	AltPortNum       uint8      // alt_port_num (AttrAltPath)
	AltTimeout       uint8      // alt_timeout (AttrAltPath)
	RateLimit        uint32     // rate_limit in kbps (AttrRateLimit)
}

// Access flag bits a QP's AccessFlags may hold: pkg/mr's flags (the same
// constants, not copies) under the names this package's code uses.
const (
	AccessLocalWrite      = mr.LocalWrite      // IBV_ACCESS_LOCAL_WRITE
	AccessRemoteWrite     = mr.RemoteWrite     // IBV_ACCESS_REMOTE_WRITE
	AccessRemoteRead      = mr.RemoteRead      // IBV_ACCESS_REMOTE_READ
	AccessRemoteAtomic    = mr.RemoteAtomic    // IBV_ACCESS_REMOTE_ATOMIC
	AccessFlushGlobal     = mr.FlushGlobal     // IBV_ACCESS_FLUSH_GLOBAL
	AccessFlushPersistent = mr.FlushPersistent // IBV_ACCESS_FLUSH_PERSISTENT
)

// roundUpPow2 is the kernel's roundup_pow_of_two for a read/atomic depth,
// 0 kept as 0 (rxe_qp_from_attr). CheckModify holds a depth to 128
// (RXE_MAX_QP_RD_ATOM), so the result fits.
func roundUpPow2(n uint8) uint8 {
	if n <= 1 {
		return n
	}
	return uint8(1 << bits.Len8(n-1))
}
