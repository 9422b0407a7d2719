package oob

import (
	"fmt"
	"io"
	"strings"
)

// InlineWarning is what perftest 4.5 prints first, followed by a
// ResultLine, in read and atomic tests on a device it does not know (rxe).
const InlineWarning = "Device not recognized to implement inline feature. Disabling it\n"

// ResultLine is perftest's RESULT_LINE: 87 dashes and a newline.
const ResultLine = "---------------------------------------------------------------------------------------\n"

// Result table headers (RESULT_FMT, RESULT_FMT_G, RESULT_FMT_LAT,
// RESULT_FMT_LAT_DUR), without the newline.
const (
	BWHeader          = " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]"
	BWHeaderGbits     = " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]"
	LatHeader         = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] "
	LatDurationHeader = " #bytes        #iterations       t_avg[usec]    tps average"
)

// TestInfo is what perftest's banner (ctx_print_test_info) shows. Lines
// perftest prints only in some modes follow the same conditions here.
type TestInfo struct {
	Test       Test
	AtomicType string // with VerbAtomic: "CMP_AND_SWAP" or "FETCH_AND_ADD"
	Server     bool   // the side started without a peer address
	Device     string
	DualPort   bool
	NumQPs     int
	Transport  string // "" prints "IB", as for every RDMA device including rxe
	Connection string // "RC", "UC", "UD"
	UseSRQ     bool
	// PCIeRelaxOrder and WRAPI are the "PCIe relax order" and "ibv_wr* API"
	// lines (perftest 4.5 on rxe: ON and OFF; ib_write_lat: OFF and OFF).
	PCIeRelaxOrder bool
	WRAPI          bool
	PostList       int    // "Post List" line when > 1
	TxDepth        int    // printed by the client
	RxDepth        int    // printed by a send test's server
	CQMod          int    // bandwidth tests
	MTU            int    // ibv_mtu enum actually used (after negotiation)
	LinkType       string // "" prints "Ethernet"
	GIDIndex       int    // negative: line omitted (perftest's -1)
	InlineSize     int    // "Max inline data" (not for read/atomic tests)
	OutReads       int    // "Outstand reads" (read/atomic tests)
	RDMACM         bool   // "rdma_cm QPs" and "Data ex. method"
}

func onOff(b bool) string {
	if b {
		return "ON"
	}
	return "OFF"
}

// WriteWaitingForClient prints the server's greeting, shown before it
// accepts a client.
func WriteWaitingForClient(w io.Writer) error {
	_, err := io.WriteString(w, "\n************************************\n* Waiting for client to connect... *\n************************************\n")
	return err
}

// WriteTestInfo prints perftest's banner, from the opening to the closing
// RESULT_LINE.
func WriteTestInfo(w io.Writer, ti TestInfo) error {
	var b strings.Builder
	b.WriteString(ResultLine)
	b.WriteString("                    ")
	b.WriteString(ti.Test.Verb.String() + " ")
	if ti.Test.Verb == VerbAtomic {
		b.WriteString(ti.AtomicType + " ")
	}
	if ti.Test.Latency {
		b.WriteString("Latency ")
	} else {
		if ti.PostList > 1 {
			b.WriteString("Post List ")
		}
		b.WriteString("BW ")
	}
	b.WriteString("Test\n")
	transport := ti.Transport
	if transport == "" {
		transport = "IB"
	}
	fmt.Fprintf(&b, " Dual-port       : %s\t\tDevice         : %s\n", onOff(ti.DualPort), ti.Device)
	fmt.Fprintf(&b, " Number of qps   : %d\t\tTransport type : %s\n", ti.NumQPs, transport)
	fmt.Fprintf(&b, " Connection type : %s\t\tUsing SRQ      : %s\n", ti.Connection, onOff(ti.UseSRQ))
	fmt.Fprintf(&b, " PCIe relax order: %s\n", onOff(ti.PCIeRelaxOrder))
	fmt.Fprintf(&b, " ibv_wr* API     : %s\n", onOff(ti.WRAPI))
	if !ti.Server {
		fmt.Fprintf(&b, " TX depth        : %d\n", ti.TxDepth)
	}
	if ti.PostList > 1 {
		fmt.Fprintf(&b, " Post List       : %d\n", ti.PostList)
	}
	if ti.Test.Verb == VerbSend && ti.Server {
		fmt.Fprintf(&b, " RX depth        : %d\n", ti.RxDepth)
	}
	if !ti.Test.Latency {
		fmt.Fprintf(&b, " CQ Moderation   : %d\n", ti.CQMod)
	}
	fmt.Fprintf(&b, " Mtu             : %d[B]\n", MTUBytes(ti.MTU))
	link := ti.LinkType
	if link == "" {
		link = "Ethernet"
	}
	fmt.Fprintf(&b, " Link type       : %s\n", link)
	if ti.GIDIndex >= 0 {
		fmt.Fprintf(&b, " GID index       : %d\n", ti.GIDIndex)
	}
	if ti.Test.Verb != VerbRead && ti.Test.Verb != VerbAtomic {
		fmt.Fprintf(&b, " Max inline data : %d[B]\n", ti.InlineSize)
	} else {
		fmt.Fprintf(&b, " Outstand reads  : %d\n", ti.OutReads)
	}
	fmt.Fprintf(&b, " rdma_cm QPs\t : %s\n", onOff(ti.RDMACM))
	if ti.RDMACM {
		b.WriteString(" Data ex. method : rdma_cm\n")
	} else {
		b.WriteString(" Data ex. method : Ethernet\n")
	}
	b.WriteString(ResultLine)
	_, err := io.WriteString(w, b.String())
	return err
}

// WriteAddress prints one side's QP information (ctx_print_pingpong_data):
// " local address: LID 0000 QPN 0x001b PSN 0xaca162 RKey 0x000c08 VAddr
// 0x0055ef4ebd2000" (OUT only for read tests, RKey/VAddr for read and write
// tests) and, with withGID, the " GID: 00:...:255:255:10:77:00:12" line
// (decimal bytes, as perftest prints them).
func WriteAddress(w io.Writer, remote bool, verb Verb, k Key, withGID bool) error {
	side := "local"
	if remote {
		side = "remote"
	}
	var b strings.Builder
	fmt.Fprintf(&b, " %s address: LID %s QPN %s PSN %s", side,
		cHexAlt(uint64(k.LID), 4), cHexAlt(uint64(k.QPN), 6), cHexAlt(uint64(k.PSN), 6))
	if verb == VerbRead {
		fmt.Fprintf(&b, " OUT %s", cHexAlt(uint64(k.OutReads), 4))
	}
	if verb == VerbRead || verb == VerbWrite {
		fmt.Fprintf(&b, " RKey %s VAddr %s", cHexAlt(uint64(k.RKey), 8), cHexAlt(k.VAddr, 16))
	}
	b.WriteByte('\n')
	if withGID {
		b.WriteString(" GID: ")
		for i, g := range k.GID {
			if i > 0 {
				b.WriteByte(':')
			}
			fmt.Fprintf(&b, "%02d", g)
		}
		b.WriteByte('\n')
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// WriteBWHeader prints the RESULT_LINE and the bandwidth table header
// perftest shows before the run (--report_gbits selects Gb/sec).
func WriteBWHeader(w io.Writer, gbits bool) error {
	h := BWHeader
	if gbits {
		h = BWHeaderGbits
	}
	_, err := io.WriteString(w, ResultLine+h+"\n")
	return err
}

// WriteBWResult prints one bandwidth result row (print_full_bw_report). With
// a remote report (bidirectional runs) the figures are summed. In Gb/sec
// mode an average below 0.1 switches to six decimals, as perftest does.
func WriteBWResult(w io.Writer, r BWReport, remote *BWReport, gbits bool) error {
	peak, avg, rate := r.BWPeak, r.BWAvg, r.MsgRateAvg
	if remote != nil {
		peak += remote.BWPeak
		avg += remote.BWAvg
		rate += remote.MsgRateAvg
	}
	var line string
	if gbits && r.BWAvg < 0.1 {
		line = fmt.Sprintf(" %-7d    %d           %s            %s            %s\n",
			r.Size, r.Iters, cFloat(peak, 7, 6, true), cFloat(avg, 7, 6, true), cFloat(rate, 7, 6, true))
	} else {
		line = fmt.Sprintf(" %-7d    %-10d       %s            %s\t\t   %s\n",
			r.Size, r.Iters, cFloat(peak, 7, 2, true), cFloat(avg, 7, 2, true), cFloat(rate, 7, 6, true))
	}
	_, err := io.WriteString(w, line)
	return err
}

// WriteLatencyHeader prints the RESULT_LINE and the latency table header
// (the duration variant for -D runs).
func WriteLatencyHeader(w io.Writer, duration bool) error {
	h := LatHeader
	if duration {
		h = LatDurationHeader
	}
	_, err := io.WriteString(w, ResultLine+h+"\n")
	return err
}

// WriteLatencyResult prints one latency row (REPORT_FMT_LAT) for a run of
// iters iterations of size bytes.
func WriteLatencyResult(w io.Writer, size uint64, iters int, st LatencyStats) error {
	f := func(v float64) string { return cFloat(v, 7, 2, true) }
	_, err := fmt.Fprintf(w, " %-7d %d          %s        %s      %s  \t       %s     \t%s\t\t%s \t\t%s\n",
		size, iters, f(st.Min), f(st.Max), f(st.Typical), f(st.Avg), f(st.Stdev), f(st.P99), f(st.P999))
	return err
}

// WriteLatencyDurationResult prints the row of a -D latency run
// (REPORT_FMT_LAT_DUR): average latency in usec and transactions per second.
func WriteLatencyDurationResult(w io.Writer, size uint64, iters int, avgUsec, tps float64) error {
	_, err := fmt.Fprintf(w, " %-7d       %d            %s        %s\n",
		size, iters, cFloat(avgUsec, 7, 2, true), cFloat(tps, 7, 2, true))
	return err
}
