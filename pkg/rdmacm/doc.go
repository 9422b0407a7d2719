// Package rdmacm connects RDMA queue pairs the way librdmacm and the Linux
// kernel's rdma_cm (drivers/infiniband/core/cma.c) do: by IP address and
// port, over the IB connection manager on QP 1 (pkg/cm), so that an rxed
// program and a kernel peer running rping, ucmatose, perftest -R, NVMe-oF
// or any other rdma_cm application connect to each other.
//
//	l, _ := rdmacm.Listen(dev, netip.MustParseAddrPort("10.0.0.1:7174"), nil)
//	req, _ := l.Accept(ctx)           // a REQ: the peer's address and private data
//	conn, _ := req.Accept(ctx, qp, nil) // qp (RESET) ends in RTS, REP sent, RTU (or the peer's first request) received
//
//	conn, err := rdmacm.Dial(ctx, qp, netip.MustParseAddrPort("10.0.0.1:7174"), nil)
//	var rej *rdmacm.RejectError       // errors.As(err, &rej): the peer refused (rej.Reason)
//
// # What rdma_cm adds to the IB CM
//
//   - The service ID is port space << 16 | port (RDMA_PS_TCP 0x0106 for
//     RC, RDMA_PS_UDP 0x0111 for UD via SIDR).
//   - REQ and SIDR_REQ private data start with a 36-byte header (the IP
//     version, the active side's port, both IP addresses), so a REQ carries
//     at most 56 bytes of the application's private data; REP, REJ and RTU
//     carry none of it (196, 148 and 224 bytes).
//   - The passive side picks the listener by the header's IP version and
//     destination address, as cma_match_private_data: an IPv4 listener
//     takes version 4 headers, an IPv6 one version 6, :: both (so a
//     version 6 header naming IPv4-mapped addresses, ::ffff:a.b.c.d,
//     reaches :: only, as a request between IPv4 addresses). A REQ for a
//     port nobody listens on is rejected by the CM with reason 8 (invalid
//     service ID); one whose header no listener takes, or whose
//     destination is none of the device's GIDs (cma_ib_acquire_dev), with
//     reason 28 (consumer defined), as the kernel does.
//   - The header's source address is the client's to write, so the
//     passive side refuses (REJ 28; a SIDR_REQ: SIDR_REP REJECT) a
//     request whose header names another source than the address it came
//     from, its GRH source, where the REP and the connection's packets go,
//     and counts it (rej_src_mismatch in Counters). A real rdma_cm client
//     always sends from the address its header names, so Request.Remote
//     is where the request came from and can be trusted as far as the IP
//     source can (an allowlist keyed on it stops a forged header).
//   - A REQ that finds the listener's backlog (ListenOptions.Backlog)
//     full is dropped without an answer, as the kernel's ucma and cm.c
//     drop it (-ENOMEM: no REJ, "to allow future retries"): the peer's
//     REQ retransmission is a new request, accepted if Accept has made
//     room by then. While it has room every request is queued, whatever
//     its source holds (unless ListenOptions.MaxPerSource caps that), and
//     a full backlog refuses (REJ 28) the oldest request of its heaviest
//     source to make room for a lighter one, so REQs forged from one
//     address cannot keep a real client out (listen_backlog.go).
//   - A queued REQ whose active side can no longer be waiting (the
//     REQ's own Remote CM Response Timeout, packet life time and Max CM
//     Retries, with our MRA's wait, have all run out on the CM's clock,
//     or 2 minutes have, since a forger sets those fields) is refused
//     (REJ 28, what cm.c sends when ucma destroys an unanswered request)
//     and counted req_expired when that time comes, on the CM's clock,
//     traffic or not: Accept never returns it, and it holds no place in
//     the backlog (listen_expiry.go). So is a queued SIDR_REQ once rdma_cm's
//     requester has given up (65.5 s), with SIDR_REP REJECT. The kernel
//     keeps either until the application reads it.
//
// # QP attributes, as the kernel derives them
//
// Both sides move their QP INIT -> RTR -> RTS from the REQ and REP (cm.c's
// cm_init_qp_*_attr with cma.c's overrides): INIT allows remote WRITE, and
// remote READ and atomics when the side has responder resources; RTR takes
// the path (the peer's GID), the path MTU, the peer's QPN and, as rq_psn,
// the Starting PSN of our own REQ or REP (in Linux's ib_cm a message's
// Starting PSN is the PSN its sender receives from; a side sends from the
// one in the peer's message: the rping capture shows the REQ sender's first
// SEND carrying the REP's PSN),
// max_dest_rd_atomic = our responder resources and min_rnr_timer 0 (the
// kernel's choice; ConnParam.MinRNRTimer overrides); RTS takes the peer's
// Starting PSN as sq_psn (each side draws its own at random, 24 bits), the
// local ACK timeout (packet life time + 1: 19
// with rdma_cm's RoCE packet life time 18), the retry count (the active
// side's, carried in the REQ), the RNR retry count (each side's peer
// chooses: the REQ carries the active side's, the REP the passive side's)
// and max_rd_atomic = our initiator depth. The passive side's responder
// resources default to the REQ's initiator depth and its initiator depth to
// the REQ's responder resources, as librdmacm's rdma_accept. A nil
// *ConnParam (Dial, Accept) is librdmacm's NULL conn_param: retry and RNR
// retry counts 7; a ConnParam's zero counts mean no retries. The path's
// hop limit is 64 (the route's, which cma_resolve_iboe_route puts in the
// path) and its traffic class the active side's ConnParam.TOS
// (RDMA_OPTION_ID_TOS; cma_resolve_iboe_route makes the ID's tos the
// route's traffic_class), both carried in the REQ. The passive side takes
// the traffic class from it (cm_format_paths_from_req) and the hop limit
// from its own route to the peer (cm_req_handler overwrites the REQ's with
// it), so both AVs carry the TOS and, on a default route, hop limit 64:
// the IP TOS and TTL (IPv6 traffic class and hop limit) of every packet
// of the connection. A UD service resolved by DialUD is sent to with the
// same (UDRemote.HopLimit, TrafficClass: cma_sidr_rep_handler builds the
// address handle from the dialer's own path). The CM MADs of a connection
// (REQ, RTU, DREQ, DREP, REJ and SIDR_REQ; the passive side's REP, DREP,
// DREQ, REJ) leave with the same TOS and TTL 64, as cm.c sends them on
// the cm_id's primary AV; answers built from a received MAD (a REJ to a
// REQ nobody listens for, the SIDR_REP) with the traffic class that MAD
// arrived with over IPv6 and TOS 0 over IPv4, as ib_init_ah_attr_from_wc
// reads rxe's GRH (see cm.Traffic).
//
// Deviations, chosen: loopback addresses are accepted (the kernel refuses
// them on RoCE; rxed's tests and single-host users live there); a header
// source that is not the request's GRH source is refused (the kernel's
// validate_net_dev only checks that the header's addresses route through
// the interface the request arrived on: a forged neighbour passes); the passive
// path MTU is the smaller of the REQ's and the local port's; the active
// path MTU is the port's active MTU capped by what the local interface
// carries (iboe_get_mtu: 1024 on an Ethernet link of 1500 bytes).
//
// # Goroutines
//
// Every function and method here is safe for concurrent use. One CM agent
// per device (a MAD agent on QP 1 and a cm.Manager) is created on first use
// and closed with the device, so that a REQ for a port nobody listens on
// still gets its REJ.
//
// # Contexts
//
// A wait that its ctx ends (Dial, Request.Accept, Listener.Accept, DialUD,
// Conn.Disconnect) returns ctx's error, with the cause its canceller gave
// (context.Cause) when there is one: errors.Is finds context.Canceled or
// context.DeadlineExceeded, and the cause.
package rdmacm
