//go:build linux

package interop

import (
	"fmt"
	"strings"
	"time"
)

// This file holds the rdma_cm cells: librdmacm's example programs (rping, ucmatose, udaddy from
// rdmacm-utils) against rxed's (rxed rping, cmatose, udaddy). They have no TCP exchange: the
// connection is set up with CM MADs on QP1, so a cell carries its own four command lines (both
// roles of both implementations) and is run by runCM (runner_rdmacm.go).

// CMProg is one of librdmacm's example programs.
type CMProg int

const (
	// Rping: RC, the client SENDs adverts, the server RDMA READs and WRITEs; the client sends
	// the DREQ.
	Rping CMProg = iota
	// Ucmatose: RC, -c connections, SENDs both ways; the server sends the DREQs.
	Ucmatose
	// Udaddy: UD resolved by SIDR, SEND_WITH_IMMs both ways; no DREQ.
	Udaddy
)

func (p CMProg) String() string {
	return [...]string{"rping", "ucmatose", "udaddy"}[p]
}

// Role is a side of an rdma_cm connection.
type Role int

const (
	// Server is the passive side (rdma_listen).
	Server Role = iota
	// Client is the active side (rdma_connect / SIDR).
	Client
)

func (r Role) String() string {
	if r == Server {
		return "server"
	}
	return "client"
}

// CMStep is one client run against the cell's server. Steps run one after the other.
type CMStep struct {
	// WrongPort connects to the port above the server's, where nobody listens: the passive
	// side's CM must answer REJ reason 8 (invalid service ID) and the client report it and
	// fail; the server is not disturbed.
	WrongPort bool
}

// CMSpec makes a Cell an rdma_cm cell.
//
// Templates are expanded by RenderCM. Placeholders:
//
//	{rxed}     path of the rxed binary
//	{addr}     the end's own address (the cell's family: IPv4 or IPv6)
//	{srvaddr}  the server's address (client templates)
//	{port}     rdma_cm port (unique per run; WrongPort steps get {port}+1)
//	{counters} file rxed writes its counters to, as JSON, when it exits
//	{pcap}     file rxed records its traffic to (the harness reads the CM MADs from it)
type CMSpec struct {
	Prog                   CMProg
	RxeServer, RxeClient   string // the rdma_rxe guest's commands (rdmacm-utils)
	RxedServer, RxedClient string // rxed's commands
	Steps                  []CMStep
	// Persistent: the server (rping -P) keeps serving after the clients; the harness checks it
	// is still running after the last one and stops it. rxed's is given --clients instead and
	// must exit 0 by itself, so this applies only to the rxe server.
	Persistent bool
	// Pings is rping's -C, Size its -S (for the ping-line checks); ClientV / ServerV: that
	// side runs with -v and must print every ping.
	Pings, Size      int
	ClientV, ServerV bool
	// Conns and Msgs are ucmatose's/udaddy's -c and -C.
	Conns, Msgs int
	// Port fixes the rdma_cm port (udaddy: rdmacm-utils' udaddy has no port option and always
	// uses 7174); 0 gives each run a fresh one.
	Port int
}

// ExpectCM returns the CM messages each role sends in a cell run: per successful connection
// (rping, ucmatose) REQ and RTU from the client, REP from the server, and the DREQ from the
// side that disconnects first (rping: the client after its -C pings; ucmatose: the server after
// its transfers) with the DREP from the other; per UD resolution (udaddy) SIDR_REQ and
// SIDR_REP; per WrongPort step a REQ and the REJ. The librdmacm captures in
// /work/shared/pcaps (rdmacm_rping_v4, rdmacm_ucmatose*, rdmacm_udaddy, rdmacm_rej_no_listener)
// show exactly these.
func (s *CMSpec) ExpectCM() map[Role]CMCount {
	e := map[Role]CMCount{Server: {}, Client: {}}
	for _, st := range s.Steps {
		if st.WrongPort {
			e[Client][AttrREQ]++
			e[Server][AttrREJ]++
			continue
		}
		conns := max(s.Conns, 1)
		if s.Prog == Udaddy {
			e[Client][AttrSIDRREQ] += conns
			e[Server][AttrSIDRREP] += conns
			continue
		}
		e[Client][AttrREQ] += conns
		e[Server][AttrREP] += conns
		e[Client][AttrRTU] += conns
		dreq, drep := Client, Server
		if s.Prog == Ucmatose {
			dreq, drep = Server, Client
		}
		e[dreq][AttrDREQ] += conns
		e[drep][AttrDREP] += conns
	}
	return e
}

// RenderCM expands an rdma_cm template.
func RenderCM(tmpl string, v CMVars) string {
	r := strings.NewReplacer(
		"{rxed}", v.Rxed,
		"{addr}", v.Addr,
		"{srvaddr}", v.SrvAddr,
		"{port}", fmt.Sprint(v.Port),
		"{counters}", v.Counters,
		"{pcap}", v.Pcap,
	)
	return strings.Join(strings.Fields(r.Replace(tmpl)), " ")
}

// CMVars are the values substituted into a CMSpec template.
type CMVars struct {
	Rxed, Addr, SrvAddr string
	Port                int
	Counters, Pcap      string
}

// rxed's engine flags in every rdma_cm command: its address, counters and capture.
const cmRxedFlags = "--addr {addr} --counters-out {counters} --pcap {pcap}"

// rpingSpec is an rping cell: -C pings of -S size, flags extra for both sides.
func rpingSpec(pings, size int, clientV, serverV bool, steps []CMStep) *CMSpec {
	v := func(on bool) string {
		if on {
			return "-v"
		}
		return ""
	}
	common := fmt.Sprintf("-p {port} -C %d -S %d -V", pings, size)
	return &CMSpec{
		Prog: Rping,
		// -d: rxed prints "rdma_listen" once it listens (the harness waits for it)
		RxeServer:  "rping -s -a {addr} " + common + " " + v(serverV),
		RxeClient:  "rping -c -a {srvaddr} -I {addr} " + common + " " + v(clientV),
		RxedServer: "{rxed} rping -s -d -a {addr} " + common + " " + v(serverV) + " " + cmRxedFlags,
		RxedClient: "{rxed} rping -c -a {srvaddr} -I {addr} " + common + " " + v(clientV) + " " + cmRxedFlags,
		Steps:      steps, Pings: pings, Size: size, ClientV: clientV, ServerV: serverV,
	}
}

// rdmacmCells are the rdma_cm cells (MTU 1024, the default link).
func rdmacmCells() []Cell {
	one := []CMStep{{}}
	cell := func(name string, ipv6 bool, s *CMSpec) Cell {
		return Cell{Name: name, Tool: s.Prog.String(), Size: max(s.Size, 1), Iters: max(s.Pings, s.Msgs, 1), MTU: 1024,
			IPv6: ipv6, CM: s, Timeout: 90 * time.Second}
	}
	var cells []Cell
	cells = append(cells,
		cell("rdmacm/rping/ipv4/C10", false, rpingSpec(10, 64, true, true, one)),
		cell("rdmacm/rping/ipv6/C10", true, rpingSpec(10, 64, true, true, one)),
		// 500 pings, the client validates each (-V), the server prints each READ (-v)
		cell("rdmacm/rping/C500", false, rpingSpec(500, 64, false, true, one)),
	)
	// -P: one server, two clients in a row (rxed's server exits after --clients 2)
	p := rpingSpec(5, 64, true, true, []CMStep{{}, {}})
	p.RxeServer = strings.Replace(p.RxeServer, "rping -s", "rping -s -P", 1)
	p.RxedServer = strings.Replace(p.RxedServer, "rping -s", "rping -s -P --clients 2", 1)
	p.Persistent = true
	cells = append(cells, cell("rdmacm/rping/persistent2", false, p))
	// REJ: a client to a port nobody listens on (reason 8, invalid service ID), then one to the
	// server's port, which must still work
	cells = append(cells, cell("rdmacm/rping/rej8", false, rpingSpec(1, 64, true, true, []CMStep{{WrongPort: true}, {}})))
	for _, conns := range []int{1, 8} {
		flags := fmt.Sprintf("-p {port} -c %d -C 10 -S 100", conns)
		cells = append(cells, cell(fmt.Sprintf("rdmacm/ucmatose/c%d", conns), false, &CMSpec{
			Prog:       Ucmatose,
			RxeServer:  "ucmatose -b {addr} " + flags,
			RxeClient:  "ucmatose -s {srvaddr} -b {addr} " + flags,
			RxedServer: "{rxed} cmatose -b {addr} " + flags + " " + cmRxedFlags,
			RxedClient: "{rxed} cmatose -s {srvaddr} -b {addr} " + flags + " " + cmRxedFlags,
			Steps:      one, Conns: conns, Msgs: 10, Size: 100,
		}))
	}
	cells = append(cells, cell("rdmacm/udaddy/C10", false, &CMSpec{
		Prog:       Udaddy,
		RxeServer:  "udaddy -b {addr} -C 10 -S 100",
		RxeClient:  "udaddy -s {srvaddr} -b {addr} -C 10 -S 100",
		RxedServer: "{rxed} udaddy -b {addr} -p {port} -C 10 -S 100 " + cmRxedFlags,
		RxedClient: "{rxed} udaddy -s {srvaddr} -b {addr} -p {port} -C 10 -S 100 " + cmRxedFlags,
		Steps:      one, Conns: 1, Msgs: 10, Size: 100, Port: 7174,
	}))
	return cells
}
