package main

import (
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/oob"
)

func init() {
	register(&command{
		name:    "devinfo",
		summary: "show the device like ibv_devinfo: GID table, MTU, port state, limits (-v)",
		run:     runDevinfo,
	})
}

func runDevinfo(args []string, stdout, stderr io.Writer) int {
	var ef engineFlags
	fs := flag.NewFlagSet("devinfo", flag.ContinueOnError)
	ef.register(fs, false)
	verbose := fs.Bool("v", false, "also print the device limits (ibv_devinfo -v)")
	fs.String("d", "rxed0", "device name (accepted for compatibility)")
	rest, code, ok := parseArgs(fs, args, stderr)
	if !ok {
		return code
	}
	if len(rest) > 0 {
		fmt.Fprintf(stderr, "rxed devinfo: unexpected argument %q\n", rest[0])
		return 2
	}
	if err := ef.check(); err != nil {
		fmt.Fprintf(stderr, "rxed devinfo: %v\n", err)
		return 2
	}
	// An ephemeral port: devinfo must work next to a daemon that holds
	// the configured one. The port shown is the configured one.
	dev, err := ib.OpenDevice(ib.Config{Addrs: ef.addrs, EphemeralPort: true})
	if err != nil {
		return fail(stderr, "devinfo", engineOpenError("the device", ef.addrs.String(), 0, err))
	}
	defer dev.Close()
	writeDevinfo(stdout, dev, uint16(ef.port), *verbose)
	return 0
}

// guidString formats a GUID as ibv_devinfo does: four groups of 4 hex
// digits.
func guidString(g uint64) string {
	return fmt.Sprintf("%04x:%04x:%04x:%04x", g>>48, g>>32&0xffff, g>>16&0xffff, g&0xffff)
}

func writeDevinfo(w io.Writer, dev *ib.Device, udpPort uint16, verbose bool) {
	a := dev.QueryDevice()
	p, _ := dev.QueryPort(1)
	var b strings.Builder
	fmt.Fprintf(&b, "hca_id:\t%s\n", dev.Name())
	fmt.Fprintf(&b, "\ttransport:\t\t\tInfiniBand (0)\n")
	fmt.Fprintf(&b, "\tfw_ver:\t\t\t\t%s\n", a.FwVer)
	fmt.Fprintf(&b, "\tnode_guid:\t\t\t%s\n", guidString(a.NodeGUID))
	fmt.Fprintf(&b, "\tsys_image_guid:\t\t\t%s\n", guidString(a.SysImageGUID))
	fmt.Fprintf(&b, "\tvendor_id:\t\t\t0x%06x\n", a.VendorID)
	fmt.Fprintf(&b, "\tvendor_part_id:\t\t\t%d\n", a.VendorPartID)
	fmt.Fprintf(&b, "\thw_ver:\t\t\t\t0x%X\n", a.HwVer)
	fmt.Fprintf(&b, "\tphys_port_cnt:\t\t\t%d\n", a.PhysPortCnt)
	if verbose {
		lim := []struct {
			name string
			v    any
		}{
			{"max_mr_size", fmt.Sprintf("0x%x", a.MaxMRSize)}, {"page_size_cap", fmt.Sprintf("0x%x", a.PageSizeCap)},
			{"max_qp", a.MaxQP}, {"max_qp_wr", a.MaxQPWR}, {"device_cap_flags", capFlags(a.DeviceCapFlags)},
			{"max_sge", a.MaxSGE}, {"max_sge_rd", a.MaxSGERd},
			{"max_cq", a.MaxCQ}, {"max_cqe", a.MaxCQE}, {"max_mr", a.MaxMR}, {"max_pd", a.MaxPD},
			{"max_qp_rd_atom", a.MaxQPRdAtom}, {"max_qp_init_rd_atom", a.MaxQPInitRdAtom},
			{"max_res_rd_atom", a.MaxResRdAtom}, {"atomic_cap", atomicCap(a.AtomicCap)}, {"max_mw", a.MaxMW},
			{"max_mcast_grp", a.MaxMcastGrp}, {"max_mcast_qp_attach", a.MaxMcastQPAttach},
			{"max_total_mcast_qp_attach", a.MaxTotalMcastQPAttach},
			{"max_srq", a.MaxSRQ}, {"max_srq_wr", a.MaxSRQWR}, {"max_srq_sge", a.MaxSRQSGE},
			{"max_pkeys", a.MaxPKeys}, {"local_ca_ack_delay", a.LocalCAAckDelay},
			{"max_inline_data", a.MaxInlineData}, {"max_msg_size", fmt.Sprintf("0x%x", a.MaxMsgSize)},
			{"max_fast_reg_page_list_len", a.MaxFastRegPageList},
		}
		for _, l := range lim {
			tabs := "\t\t\t"
			if len(l.name) >= 15 {
				tabs = "\t\t"
			}
			if len(l.name) >= 23 {
				tabs = "\t"
			}
			fmt.Fprintf(&b, "\t%s:%s%v\n", l.name, tabs, l.v)
		}
	}
	fmt.Fprintf(&b, "\t\tport:\t1\n")
	state := "PORT_DOWN"
	if p.State == ib.PortActive {
		state = "PORT_ACTIVE"
	}
	fmt.Fprintf(&b, "\t\t\tstate:\t\t\t%s (%d)\n", state, p.State)
	fmt.Fprintf(&b, "\t\t\tmax_mtu:\t\t%d (%d)\n", p.MaxMTU.Bytes(), int(p.MaxMTU))
	fmt.Fprintf(&b, "\t\t\tactive_mtu:\t\t%d (%d)\n", p.ActiveMTU.Bytes(), int(p.ActiveMTU))
	fmt.Fprintf(&b, "\t\t\tsm_lid:\t\t\t0\n\t\t\tport_lid:\t\t0\n\t\t\tport_lmc:\t\t0x00\n")
	fmt.Fprintf(&b, "\t\t\tlink_layer:\t\t%s\n", p.LinkLayer)
	fmt.Fprintf(&b, "\t\t\tudp_port:\t\t%d\n", udpPort)
	if verbose {
		fmt.Fprintf(&b, "\t\t\tmax_msg_sz:\t\t0x%x\n\t\t\tgid_tbl_len:\t\t%d\n\t\t\tpkey_tbl_len:\t\t%d\n", p.MaxMsgSz, p.GIDTblLen, p.PKeyTblLen)
	}
	for i, g := range dev.GIDs() {
		fmt.Fprintf(&b, "\t\t\tGID[%3d]:\t\t%s, RoCE v2\n", i, oob.FormatGID(g.As16()))
	}
	_, _ = io.WriteString(w, b.String())
}

// capFlagNames are ibv_devinfo's names of the device_cap_flags bits, in
// the order it prints them (libibverbs/examples/devinfo.c,
// print_device_cap_flags); pkg/ib names the bits rxe sets.
var capFlagNames = []struct {
	bit  uint64
	name string
}{
	{1 << 0, "RESIZE_MAX_WR"}, {ib.DeviceBadPKeyCntr, "BAD_PKEY_CNTR"}, {ib.DeviceBadQKeyCntr, "BAD_QKEY_CNTR"}, {1 << 3, "RAW_MULTI"},
	{ib.DeviceAutoPathMig, "AUTO_PATH_MIG"}, {ib.DeviceChangePhyPort, "CHANGE_PHY_PORT"}, {ib.DeviceUDAVPortEnforce, "UD_AV_PORT_ENFORCE"},
	{1 << 7, "CURR_QP_STATE_MOD"}, {1 << 8, "SHUTDOWN_PORT"}, {1 << 9, "INIT_TYPE"},
	{ib.DevicePortActiveEvent, "PORT_ACTIVE_EVENT"}, {ib.DeviceSysImageGUID, "SYS_IMAGE_GUID"}, {ib.DeviceRCRNRNAKGen, "RC_RNR_NAK_GEN"},
	{ib.DeviceSRQResize, "SRQ_RESIZE"}, {1 << 14, "N_NOTIFY_CQ"}, {ib.DeviceMemWindow, "MEM_WINDOW"}, {1 << 18, "UD_IP_CSUM"},
	{1 << 20, "XRC"}, {ib.DeviceMemMgtExtensions, "MEM_MGT_EXTENSIONS"}, {ib.DeviceMemWindowType2A, "MEM_WINDOW_TYPE_2A"},
	{ib.DeviceMemWindowType2B, "MEM_WINDOW_TYPE_2B"}, {1 << 25, "RC_IP_CSUM"}, {1 << 26, "RAW_IP_CSUM"},
	{1 << 29, "MANAGED_FLOW_STEERING"},
}

// capFlags is ibv_devinfo -v's device_cap_flags value: the 32-bit word,
// then a line per bit it knows and one for the rest.
func capFlags(f uint64) string {
	var b strings.Builder
	fmt.Fprintf(&b, "0x%08x", uint32(f))
	known := uint64(0)
	for _, c := range capFlagNames {
		known |= c.bit
		if f&c.bit != 0 {
			b.WriteString("\n\t\t\t\t\t" + c.name)
		}
	}
	if rest := uint32(f &^ known); rest != 0 {
		fmt.Fprintf(&b, "\n\t\t\t\t\tUnknown flags: 0x%08x", rest)
	}
	return b.String()
}

func atomicCap(c int) string {
	if c == 1 {
		return "ATOMIC_HCA (1)"
	}
	return fmt.Sprintf("ATOMIC_NONE (%d)", c)
}
