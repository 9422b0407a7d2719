package cm

// Traffic is the GRH traffic class and hop limit of the address handle a
// MAD is sent with, which rdma_rxe puts in the IP header as the IPv4
// TOS and TTL (IPv6 traffic class and hop limit). Config.Send gets it
// with every MAD.
//
// cm.c sends two kinds of MADs (cm_alloc_msg, cm_alloc_response_msg):
//
//   - A connection's own (REQ, REP, RTU, DREQ, DREP, REJ, SIDR_REQ and
//     their retransmissions) go out on its cm_id's primary AV. The active
//     side builds it from its path (cm_init_av_by_path), whose traffic
//     class rdma_cm makes the ID's TOS on RoCE; the passive side from the
//     REQ's primary path (cm_format_paths_from_req), its traffic class as
//     the REQ says and its hop limit the route's (cm_req_handler replaces
//     the REQ's with the one of the AV it first built from the work
//     completion). ID.traffic.
//   - An answer that needs no AV of a connection (cm_issue_rej, a
//     duplicate's MRA, REJ or RTU, cm_issue_drep, a DREP in timewait, the
//     SIDR_REP, whose ID has only the AV cm_init_av_for_response made) goes
//     out on an AH built from the received MAD (ib_init_ah_attr_from_wc):
//     hop limit the route's, traffic class the GRH's version_tclass_flow
//     (bits 20-27). rxe fills a GSI receive's GRH as a UD one's
//     (build_rdma_network_hdr in rxe_resp.c): over IPv6 the received IPv6
//     header, so that is the traffic class the MAD came with; over IPv4
//     20 zero bytes and then the IPv4 header, so it is 0 whatever TOS
//     the MAD came with: replyTraffic, from the class HandleMADTraffic
//     was given. (The AH's flow label, the GRH's too, does not reach the
//     wire: rxe sends flow label 0.)
type Traffic struct {
	TrafficClass uint8
	// HopLimit 0 is the sender's default (RouteHopLimit).
	HopLimit uint8
}

// RouteHopLimit is the hop limit of a route (ip4_dst_hoplimit, Linux's
// default TTL), which rdma_addr_find_l2_eth_by_grh gives an AH built
// from a work completion, and rdma_cm the paths it resolves on RoCE.
const RouteHopLimit = 64

// replyTraffic is the Traffic of an answer built from the received MAD
// r (see Traffic): the route's hop limit, and the traffic class r
// arrived with from an IPv6 peer, 0 from an IPv4 one (in either GID
// form).
func (r rx) replyTraffic() Traffic {
	t := Traffic{HopLimit: RouteHopLimit}
	if !r.src.Unmap().Is4() {
		t.TrafficClass = r.class
	}
	return t
}
