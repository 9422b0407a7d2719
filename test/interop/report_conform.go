//go:build linux

package interop

import (
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/rxed/rxed/pkg/conform"
)

// ConformFindings explains rxe's known deviations from IBA (FAIL or DEVIATION against the
// guest), with the kernel source that shows why. A FAIL not listed is reported as new.
var ConformFindings = map[string]string{
	"R-ACCESS-MISSING": "rdma_rxe checks the QP's access flags before the R_Key: a READ to a QP without " +
		"IB_ACCESS_REMOTE_READ (ib_write_bw's server grants only remote write) is RESPST_ERR_UNSUPPORTED_OPCODE in " +
		"rxe_resp.c check_op_valid, answered with NAK invalid request; IBA 9.7.5.2.3 / 9.7.4.1.5 names remote access " +
		"error for an access the responder's QP or memory does not grant. Recorded as DEVIATION by the scenario " +
		"(both NAKs end the request with an error; only the syndrome differs).",
	"R-SEND-OVER-PMTU": "rdma_rxe in this kernel does not check a SEND's payload against the path MTU: " +
		"rxe_resp.c check_length is a stub that returns RESPST_CHK_RKEY for every QP type, and only WRITEs get a " +
		"PMTU check (in check_rkey: R-WRITE-OVER-PMTU passes). The SEND fits ib_send_bw's receive buffer, so it " +
		"is executed and ACKed. IBA C9-92 / 9.7.5.2.4 require NAK invalid request for a packet longer than the " +
		"PMTU; later kernels replaced the stub with rxe_resp_check_length (\"See IBA C9-92\").",
	"D-UD-OVER-MTU": "rdma_rxe does not drop a UD SEND longer than the path MTU (1280 bytes at PMTU 1024): " +
		"rxe_resp.c check_length is a stub for every QP type, so the packet goes to the receive queue, does not " +
		"fit ibv_ud_pingpong's receive (-s 512 + the 40-byte GRH), and the receive completes in error: the tool " +
		"printed `Failed status local QP operation error (2) for wr_id 1` and exited, so the probe after it was " +
		"not echoed. IBA 9.6.1.2 / C9-92: such a packet is silently dropped and the QP keeps serving. (A bad " +
		"packet from the wire ends the peer's QP: a remote peer can stop a UD service with one datagram.) " +
		"First exercised against real rxe by this run: the engine's socket sets IP_PMTUDISC_DO, so the 4352-byte " +
		"probe it sent before could not leave a 1500-byte link (EMSGSIZE); it now sends PMTU+256.",
	"D-READ-PAD": "rdma_rxe executes a READ REQUEST whose PadCnt is not 0 (first run in CI at 9ee43bc, 2026-12-07): " +
		"rxe_recv.c rxe_rcv checks only that a packet is not shorter than its headers (skb->len < header_size(pkt)), " +
		"its ICRC covers payload_size(pkt) + bth_pad(pkt), the same bytes whatever PadCnt says, and the responder " +
		"checks lengths only of opcodes with a payload (6.1's check_length is a stub; later kernels' " +
		"rxe_resp_check_length looks at RXE_PAYLOAD_MASK, which a READ REQUEST lacks), so the READ is answered. " +
		"IBA 9.2 / 9.7.5.2.4: PadCnt pads a payload, and a READ REQUEST has none; such a packet is malformed " +
		"(silently dropped, or NAKed invalid request). rxed's parser drops it (wire.ErrBadPadding).",
	"D-READ-EXTRA": "rdma_rxe executes a READ REQUEST with bytes after its RETH (first run in CI at 9ee43bc, " +
		"2026-12-07), for D-READ-PAD's reasons: nothing bounds a packet's length from above, and the responder " +
		"checks lengths only of opcodes with a payload. IBA 9.4: a READ REQUEST is BTH + RETH with no payload; " +
		"9.7.5.2.4: a length error. rxed's parser drops it (wire.ErrBadLength).",
	"R-READ-OUTSTANDING": "rdma_rxe frees a READ/atomic responder resource as soon as it has answered it " +
		"(rxe_resp.c), so more READs than the announced depth are all answered; rxed does the same (docs/conform.md).",
	"D-PAD": "where the guest's kernel panicked (the console excerpt below: Debian's 6.1.0-48, 6.1.172-1, did; the " +
		"6.1.0-57 of earlier runs dropped the packet and D-PAD PASSed): a zero-byte RDMA WRITE ONLY with PadCnt 3 " +
		"dereferences NULL in rxe_mr_copy, called from rxe_responder in softirq, with the length 0xfffffffd (-3) in RCX/R12 " +
		"and RDI, the MR, NULL (CR2 0x104, a field of the MR). That reads as: the payload length (packet length minus " +
		"headers, pad and ICRC) underflows to -3, a zero-length RETH needs no R_Key so no MR was looked up, and the write " +
		"copies -3 bytes through the missing MR. Any host that can reach the peer's UDP port 4791 and knows a QPN and its " +
		"PSN window can panic it with one packet. IBA 9.6.1.1: a packet whose pad exceeds its payload is malformed and " +
		"silently dropped (rxed drops it: D-PAD PASSes against rxed). In ibv_rc_pingpong's run the packet is a zero-byte " +
		"SEND: no MR copy and no panic, but rxe ACKs it (MSN 1) as a message it accepted, where IBA drops it.",
	"Q-GHOST-ACK": "rdma_rxe compares a response's PSN only with the oldest WQE's last PSN (rxe_comp.c check_psn): a " +
		"PSN past it completes that WQE, as a coalesced ACK would, once all its packets have been sent " +
		"(wqe_state_pending), and nothing checks the PSN against the ones the requester has sent. IBA 9.7.6.1: a " +
		"response outside the outstanding PSN window is ignored. The verdict depends on timing: a ghost ACK that " +
		"arrives before rxe has sent the message's last packet finds the WQE not yet pending and is ignored (PASS, " +
		"the 6.1.0-57 runs and some 6.1.0-48 ones); one that arrives after completes the WQE without the responder " +
		"having acknowledged it (FAIL).",
	"Q-TIMEOUT-EXCEEDED": "rdma_rxe treats retry_cnt 7 as infinite: rxe_comp.c COMPST_ERROR_RETRY decrements " +
		"`if (qp->comp.retry_cnt != 7)`, as it does (rightly) for rnr_retry. IBA 9.7.6.1.3 counts retry_cnt " +
		"0-7 retries; only rnr_retry 7 means infinite. perftest and ibv_rc_pingpong use retry_cnt 7, so their " +
		"QPs never end in Retry Exceeded on rxe: the scenario saw 10 retransmissions and stopped.",
	"Q-SEQ-LIMIT-EXCEEDED": "the same retry_cnt 7 = infinite (rxe_comp.c COMPST_ERROR_RETRY): a sequence NAK at " +
		"the same PSN goes to COMPST_ERROR_RETRY, which would count it against retry_cnt (rxe refills retry_cnt " +
		"only in reset_retry_counters: on an ACK, READ response or atomic ACK that completes or advances the " +
		"oldest WQE), but with 7 nothing is counted. rxed's DEVIATION here has another cause (it refills on any " +
		"in-window response, docs/conform.md).",
	"Q-IMPLIED-LIMIT-EXCEEDED": "the same retry_cnt 7 = infinite: a later READ's response while an earlier " +
		"READ is pending is COMPST_ERROR_RETRY in rxe_comp.c check_psn (before any reset_retry_counters), so rxe " +
		"would count it, but never with retry_cnt 7.",
	"Q-RETRY-REPORTED": "a consequence of retry_cnt 7 = infinite (Q-TIMEOUT-EXCEEDED): with nothing answered, " +
		"rxe's QP retransmits forever and the tool never reports the Retry Exceeded error; the harness kills it.",
}

var verdictOrder = []conform.Verdict{conform.Pass, conform.Fail, conform.Deviation, conform.Skip, conform.Error}

// ConformSummary counts the runs that broke (not the verdicts).
func ConformSummary(rs []ConformResult) (ok, broken int) {
	for _, r := range rs {
		if r.OK() {
			ok++
		} else {
			broken++
		}
	}
	return ok, broken
}

func role(r ConformRun) string {
	if r.Serve {
		return "requester (guest client, `--serve`)"
	}
	return "responder (guest server)"
}

// WriteConformReport writes CONFORMANCE.md: the verdict counts per tool, coverage, rxe's
// findings with their packets, every verdict with its evidence, and breakages of the runs.
func WriteConformReport(w io.Writer, info RunInfo, rs []ConformResult) {
	fmt.Fprintf(w, "# rdma_rxe conformance (`rxed conform` against the guest's tools)\n\n")
	fmt.Fprintf(w, "Generated by `make interop` (test/interop, `conform.go`): `rxed conform` on the host (10.78.0.1) against "+
		"the rdma_rxe guest's **unmodified** tools: as responder its servers (one fresh server per scenario, run in a loop), "+
		"as requester (`--serve`) its clients. docs/conform.md says what each verdict means. A FAIL here is rxe's behaviour "+
		"(a finding), not a failure of the CI step; the step fails only when a conform run itself breaks "+
		"(hang, panic, bad exit, a missing record, an ERROR verdict).\n\n")
	fmt.Fprintf(w, "The packet listings are `rxed decode` of the engine's own captures (`--pcap-dir`): raw IP with the IP "+
		"header the engine's UDP socket implies. The ICRC covers the IPv4 ID, which the socket does not see, so rxe's "+
		"packets show `icrc=bad` there; that is the capture, not rxe. The ICRC path itself is exercised: every "+
		"packet the engine sealed (DF set, IP_PMTUDISC_DO) was accepted by rxe, and D-ICRC's corrupted one was dropped.\n\n")
	fmt.Fprintf(w, "- started %s, accel %s, guest kernel %s\n", info.Started.UTC().Format("2006-01-02T15:04:05Z"), info.Accel, info.Kernel)
	if info.Note != "" {
		fmt.Fprintf(w, "- %s\n", info.Note)
	}
	ok, broken := ConformSummary(rs)
	var total float64
	for _, r := range rs {
		total += r.Elapsed.Seconds()
	}
	fmt.Fprintf(w, "- %d conform runs, %d held, %d broke; %.0f s in all\n", len(rs), ok, broken, total)
	var panics []string
	for _, r := range rs {
		for _, p := range r.Panics {
			panics = append(panics, p.Scenario+" in "+r.Run.Name)
		}
	}
	if len(panics) > 0 {
		fmt.Fprintf(w, "- **the guest's kernel panicked %d times** (%s): each time the harness rebooted the guest and "+
			"the run went on from the next scenario; the finding shows the console\n", len(panics), strings.Join(panics, ", "))
	}
	fmt.Fprintln(w)

	fmt.Fprintln(w, "| run | peer's role | scenarios | PASS | FAIL | DEVIATION | SKIP | ERROR | time | run itself |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|---|---|---|---|")
	sum := map[conform.Verdict]int{}
	for _, r := range rs {
		n := r.Counts()
		st := "ok"
		if !r.OK() {
			st = "**broke**"
		}
		fmt.Fprintf(w, "| %s | %s | %d |", r.Run.Name, role(r.Run), len(r.Records))
		for _, v := range verdictOrder {
			fmt.Fprintf(w, " %d |", n[v])
			sum[v] += n[v]
		}
		fmt.Fprintf(w, " %.0f s | %s |\n", r.Elapsed.Seconds(), st)
	}
	fmt.Fprintf(w, "| **all** | | %d |", sum[conform.Pass]+sum[conform.Fail]+sum[conform.Deviation]+sum[conform.Skip]+sum[conform.Error])
	for _, v := range verdictOrder {
		fmt.Fprintf(w, " %d |", sum[v])
	}
	fmt.Fprintf(w, " %.0f s | |\n\n", total)

	writeCoverage(w, rs)
	writeFindings(w, rs)
	writeBreakages(w, rs)

	fmt.Fprintf(w, "## Every verdict\n")
	for _, r := range rs {
		fmt.Fprintf(w, "\n### %s\n\n", r.Run.Name)
		fmt.Fprintf(w, "- guest: `%s`\n- host: `%s`\n", r.GuestCmd, r.Cmd)
		fmt.Fprintf(w, "- guest rxe0 hw_counters delta: %s\n", r.PeerDelta)
		if r.KernelLog != "" {
			fmt.Fprintf(w, "- guest kernel log: %s\n", r.KernelLog)
		}
		for _, n := range r.Notes {
			fmt.Fprintf(w, "- note: %s\n", n)
		}
		writeConformDown(w, r.Down)
		fmt.Fprintf(w, "- captures: `%s/ID.pcap`, ladders: `%s.report.html`\n\n", r.PcapDir, r.LogPrefix)
		fmt.Fprintln(w, "| ID | verdict | time | evidence |")
		fmt.Fprintln(w, "|---|---|---|---|")
		for _, x := range r.Records {
			v := x.Verdict.String()
			if x.Verdict == conform.Fail || x.Verdict == conform.Error {
				v = "**" + v + "**"
			}
			fmt.Fprintf(w, "| %s | %s | %.1f s | %s |\n", x.ID, v, x.Elapsed.Seconds(), mdCell(x.Evidence))
		}
	}
}

func mdCell(s string) string {
	return strings.NewReplacer("|", "\\|", "\n", " ").Replace(s)
}

func writeCoverage(w io.Writer, rs []ConformResult) {
	ran := map[string]bool{}
	for _, r := range rs {
		for _, x := range r.Records {
			if x.Verdict != conform.Skip || !strings.Contains(x.Evidence, "cannot reach") {
				ran[x.ID] = true
			}
		}
	}
	var missing []string
	for _, s := range conform.All() {
		if !ran[s.ID] {
			missing = append(missing, s.ID)
		}
	}
	fmt.Fprintf(w, "Coverage: %d of %d scenarios ran at least once", len(conform.All())-len(missing), len(conform.All()))
	if len(missing) > 0 {
		fmt.Fprintf(w, "; not run: %s", strings.Join(missing, ", "))
	}
	fmt.Fprintf(w, ".\n\n")
}

// writeFindings lists every FAIL and DEVIATION once per scenario (with the runs that gave it),
// its explanation and the packets of the first run that gave it.
func writeFindings(w io.Writer, rs []ConformResult) {
	type finding struct {
		rec     conform.Result
		runs    []string
		decoded string
		panic   string // the first console excerpt of a kernel panic it caused
	}
	byID := map[string]*finding{}
	var ids []string
	for _, r := range rs {
		for _, x := range r.Records {
			if x.Verdict != conform.Fail && x.Verdict != conform.Deviation {
				continue
			}
			f := byID[x.ID]
			if f == nil {
				f = &finding{rec: x, decoded: r.Decoded[x.ID]}
				byID[x.ID] = f
				ids = append(ids, x.ID)
			}
			f.runs = append(f.runs, fmt.Sprintf("%s: %s", r.Run.Name, x.Verdict))
			for _, p := range r.Panics {
				if p.Scenario == x.ID && f.panic == "" {
					f.panic = p.Excerpt
				}
			}
		}
	}
	sort.Strings(ids)
	fmt.Fprintf(w, "## Findings: where rxe deviates from IBA (%d)\n", len(ids))
	if len(ids) == 0 {
		fmt.Fprintf(w, "\nNone: every scenario that ran PASSed or was SKIPped.\n\n")
		return
	}
	for _, id := range ids {
		f := byID[id]
		fmt.Fprintf(w, "\n### %s: %s\n\n", id, f.rec.Title)
		fmt.Fprintf(w, "- verdict: %s\n", strings.Join(f.runs, "; "))
		fmt.Fprintf(w, "- rule: %s\n", f.rec.Rule)
		fmt.Fprintf(w, "- evidence: %s\n", oneLineMD(f.rec.Evidence))
		if why := ConformFindings[id]; why != "" {
			fmt.Fprintf(w, "- analysis: %s\n", why)
		} else {
			fmt.Fprintf(w, "- analysis: **new, not yet analysed** (add it to ConformFindings in test/interop/report_conform.go)\n")
		}
		if f.panic != "" {
			fmt.Fprintf(w, "\n```\n# the guest's serial console: its kernel panicked\n%s\n```\n", f.panic)
		}
		if f.decoded != "" {
			fmt.Fprintf(w, "\n```\n# rxed decode %s.pcap (first lines)\n%s\n```\n", id, head(f.decoded, 24))
		}
	}
	fmt.Fprintln(w)
}

func oneLineMD(s string) string { return strings.ReplaceAll(s, "\n", " ") }

func head(s string, n int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(l) > n {
		return strings.Join(l[:n], "\n") + fmt.Sprintf("\n... (%d more)", len(l)-n)
	}
	return strings.Join(l, "\n")
}

func writeBreakages(w io.Writer, rs []ConformResult) {
	_, broken := ConformSummary(rs)
	if broken == 0 {
		return
	}
	fmt.Fprintf(w, "## Runs that broke (these fail the CI step)\n")
	for _, r := range rs {
		if r.OK() {
			continue
		}
		fmt.Fprintf(w, "\n### %s\n\n", r.Run.Name)
		for _, p := range r.Problems {
			fmt.Fprintf(w, "- %s\n", oneLineMD(p))
		}
		fmt.Fprintf(w, "\n```\n# rxed conform stderr (last lines)\n%s\n```\n", tail(r.Stderr, 10))
	}
	fmt.Fprintln(w)
}

// writeConformDown lists the guests found down after a conform run's try, with why
// (RunConformRecovering).
func writeConformDown(w io.Writer, down []GuestDown) {
	for _, g := range down {
		fmt.Fprintf(w, "- guest %d went down: %s", g.VM, g.Short())
		if g.Console != "" {
			fmt.Fprintf(w, " (console kept: `%s`)", g.Console)
		}
		if g.Reboot != "" {
			fmt.Fprintf(w, "; **the reboot failed**: %s", g.Reboot)
		}
		fmt.Fprintln(w)
	}
}
