package mad

import (
	"strconv"
	"time"
)

// REJReason is a REJ's reason code (IBA table 109), with the meanings and
// names of Linux's include/rdma/ib_cm.h and cm.c.
type REJReason uint16

// REJ reasons.
const (
	REJNoQP                      REJReason = 1
	REJNoEEC                     REJReason = 2
	REJNoResources               REJReason = 3
	REJTimeout                   REJReason = 4
	REJUnsupported               REJReason = 5
	REJInvalidCommID             REJReason = 6
	REJInvalidCommInstance       REJReason = 7
	REJInvalidServiceID          REJReason = 8
	REJInvalidTransportType      REJReason = 9
	REJStaleConn                 REJReason = 10
	REJRDCNotExist               REJReason = 11
	REJInvalidGID                REJReason = 12
	REJInvalidLID                REJReason = 13
	REJInvalidSL                 REJReason = 14
	REJInvalidTrafficClass       REJReason = 15
	REJInvalidHopLimit           REJReason = 16
	REJInvalidPacketRate         REJReason = 17
	REJInvalidAltGID             REJReason = 18
	REJInvalidAltLID             REJReason = 19
	REJInvalidAltSL              REJReason = 20
	REJInvalidAltTrafficClass    REJReason = 21
	REJInvalidAltHopLimit        REJReason = 22
	REJInvalidAltPacketRate      REJReason = 23
	REJPortCMRedirect            REJReason = 24
	REJPortRedirect              REJReason = 25
	REJInvalidMTU                REJReason = 26
	REJInsufficientRespResources REJReason = 27
	REJConsumerDefined           REJReason = 28
	REJInvalidRNRRetry           REJReason = 29
	REJDupLocalCommID            REJReason = 30
	REJInvalidClassVersion       REJReason = 31
	REJInvalidFlowLabel          REJReason = 32
	REJInvalidAltFlowLabel       REJReason = 33
	REJVendorOptionNotSupported  REJReason = 35
)

// rejReasonNames are cm.c's ibcm_rej_reason_strs.
var rejReasonNames = [...]string{
	REJNoQP:                      "no QP",
	REJNoEEC:                     "no EEC",
	REJNoResources:               "no resources",
	REJTimeout:                   "timeout",
	REJUnsupported:               "unsupported",
	REJInvalidCommID:             "invalid comm ID",
	REJInvalidCommInstance:       "invalid comm instance",
	REJInvalidServiceID:          "invalid service ID",
	REJInvalidTransportType:      "invalid transport type",
	REJStaleConn:                 "stale connection",
	REJRDCNotExist:               "RDC doesn't exist",
	REJInvalidGID:                "invalid GID",
	REJInvalidLID:                "invalid LID",
	REJInvalidSL:                 "invalid SL",
	REJInvalidTrafficClass:       "invalid traffic class",
	REJInvalidHopLimit:           "invalid hop limit",
	REJInvalidPacketRate:         "invalid packet rate",
	REJInvalidAltGID:             "invalid alt GID",
	REJInvalidAltLID:             "invalid alt LID",
	REJInvalidAltSL:              "invalid alt SL",
	REJInvalidAltTrafficClass:    "invalid alt traffic class",
	REJInvalidAltHopLimit:        "invalid alt hop limit",
	REJInvalidAltPacketRate:      "invalid alt packet rate",
	REJPortCMRedirect:            "port CM redirect",
	REJPortRedirect:              "port redirect",
	REJInvalidMTU:                "invalid MTU",
	REJInsufficientRespResources: "insufficient resp resources",
	REJConsumerDefined:           "consumer defined",
	REJInvalidRNRRetry:           "invalid RNR retry",
	REJDupLocalCommID:            "duplicate local comm ID",
	REJInvalidClassVersion:       "invalid class version",
	REJInvalidFlowLabel:          "invalid flow label",
	REJInvalidAltFlowLabel:       "invalid alt flow label",
	REJVendorOptionNotSupported:  "vendor option is not supported",
}

// String returns cm.c's name for r, or "REJReason(N)" for an undefined one.
func (r REJReason) String() string {
	if int(r) < len(rejReasonNames) && rejReasonNames[r] != "" {
		return rejReasonNames[r]
	}
	return "REJReason(" + strconv.Itoa(int(r)) + ")"
}

// SIDRStatus is a SIDR_REP's status (IBA table 121).
type SIDRStatus uint8

// SIDR_REP statuses.
const (
	SIDRSuccess            SIDRStatus = 0
	SIDRUnsupported        SIDRStatus = 1 // service ID not supported
	SIDRReject             SIDRStatus = 2
	SIDRNoQP               SIDRStatus = 3
	SIDRRedirect           SIDRStatus = 4 // ClassPortInfo says where to
	SIDRUnsupportedVersion SIDRStatus = 5
)

var sidrStatusNames = [...]string{
	SIDRSuccess:            "success",
	SIDRUnsupported:        "unsupported service ID",
	SIDRReject:             "rejected",
	SIDRNoQP:               "no QP",
	SIDRRedirect:           "redirect",
	SIDRUnsupportedVersion: "unsupported version",
}

// String names s, or "SIDRStatus(N)" for an undefined status.
func (s SIDRStatus) String() string {
	if int(s) < len(sidrStatusNames) {
		return sidrStatusNames[s]
	}
	return "SIDRStatus(" + strconv.Itoa(int(s)) + ")"
}

// MaxTimeout is the largest IBA time value (a 5-bit field).
const MaxTimeout = 31

// TimeoutDuration returns the duration an IBA time value t stands for:
// 4.096 us x 2^t (t = 20, rdma_cm's CM response timeout, is about 4.3 s;
// 24, its MRA service timeout, about 68.7 s). t above MaxTimeout counts as
// MaxTimeout. (cm.c rounds to milliseconds as 1 << max(t-8, 0) ms; this is
// the exact value.)
func TimeoutDuration(t uint8) time.Duration {
	if t > MaxTimeout {
		t = MaxTimeout
	}
	return 4096 * time.Nanosecond << t
}
