package rdmacm

import (
	"net/netip"

	"github.com/rxed/rxed/pkg/wire/mad"
)

// cntRejSrcMismatch counts the requests refused because rdma_cm's header
// names another source address than the one they came from (Counters).
const cntRejSrcMismatch = "rej_src_mismatch"

// fromHeaderSource reports whether a request's rdma_cm header names as
// its source the address the request came from: grhSrc, the source GID
// of its MAD's GRH (on RoCEv2 the IP source address), which is where the
// CM sends its REP and the connection's QP every packet.
//
// Why: the header is the client's to write, and Request.Remote (what an
// application's allowlist or per-source limit looks at) comes from it. A
// legitimate client's header always names the address it sends from:
// rdma_cm writes the address its ID bound or resolved (cma_format_hdr:
// cma_src_addr) and sends from the GID that is that address
// (cma_resolve_iboe_route: rdma_ip2gid of it), and a NAT cannot make them
// differ on RoCEv2, whose ICRC covers the IP addresses. Every REQ and
// SIDR_REQ in shared/pcaps agrees (IPv4: the header's zero-padded address
// is the IPv4 source). A header naming another address is a forgery, e.g.
// a host outside an allowlist naming one inside it to get a connection
// whose REP and data come to itself.
//
// The kernel checks less: cma_ib_id_from_event's validate_net_dev only
// makes sure the header's addresses route through the interface of the
// GID the REQ arrived on and are not loopback, multicast or zero, and a
// header that fails refuses the REQ as this check does (the handler's
// -EHOSTUNREACH makes cm_destroy_id send REJ 28, consumer defined, with
// no private data; a SIDR_REQ gets a SIDR_REP with status REJECT).
//
// Both are compared unmapped, in the form the MAD agent gives GIDs (IPv4
// as 4 bytes): an IPv4 header's source is the IPv4 GID's address, and so
// is a version 6 header's IPv4-mapped one (::ffff:a.b.c.d, which the
// kernel keeps as an AF_INET6 address: cma_save_ip6_info). Such a header
// from an IPv6 source is refused here; the kernel's validate_ipv6_net_dev
// takes it when the host's IPv6 routes cover ::ffff:0:0/96 through that
// interface (a default route), refuses it otherwise.
func fromHeaderSource(hdr mad.CMAHeader, grhSrc netip.Addr) bool {
	return hdr.Src.Unmap() == grhSrc.Unmap()
}
