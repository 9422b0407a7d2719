//go:build linux

package interop

import (
	"net/netip"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
)

func readTestdata(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile("testdata/" + name)
	require.NoError(t, err)
	return string(b)
}

func TestParsePerfBandwidth(t *testing.T) {
	row, ok := ParsePerf(readTestdata(t, "write_bw_client.txt"))
	require.True(t, ok)
	require.Equal(t, PerfRow{"#bytes": 4096, "#iterations": 200, "BW peak[MB/sec]": 8.62,
		"BW average[MB/sec]": 7.59, "MsgRate[Mpps]": 0.001943}, row)
	require.Equal(t, "7.59 MiB/s", row.Metric(PerfBW))
}

func TestParsePerfLatency(t *testing.T) {
	row, ok := ParsePerf(readTestdata(t, "read_lat_client.txt"))
	require.True(t, ok)
	require.Len(t, row, 9)
	require.InDelta(t, 811.71, row["t_typical[usec]"], 1e-9)
	require.InDelta(t, 1825.40, row["t_avg[usec]"], 1e-9)
	require.InDelta(t, 8158.29, row["99.9% percentile[usec]"], 1e-9)
	require.Equal(t, "811.7 µs typ, 1825.4 µs avg", row.Metric(PerfLat))
	require.Empty(t, row.Metric(PerfBW))
}

func TestParsePerfWithoutTable(t *testing.T) {
	// ib_read_lat's server prints the connection details but no results
	_, ok := ParsePerf(readTestdata(t, "read_lat_server.txt"))
	require.False(t, ok)
	for _, s := range []string{
		"",
		" #bytes     #iterations    BW peak[MB/sec]\n---------\n 4096 200 1.0\n",
		" #bytes     #iterations    BW peak[MB/sec]\n 4096 200 x.y\n",
		" #bytes     #iterations    BW peak[MB/sec]\n",
	} {
		_, ok := ParsePerf(s)
		require.False(t, ok, "%q", s)
	}
	// rxed perf's progress line (stderr) can land between the header and the row
	row, ok := ParsePerf(" #bytes  #iterations  BW peak[MB/sec]  BW average[MB/sec]  MsgRate[Mpps]\n" +
		"rxed perf: ib_write_bw size 65536: 50 iterations in 2.4 s, 1.29 MB/sec\n 65536  50  1.29  1.29  0.000021\n---\n")
	require.True(t, ok)
	require.Equal(t, "1.29 MiB/s", row.Metric(PerfBW))
	row, ok = ParsePerf(" #bytes  #iterations  BW peak[Gb/sec]  BW average[Gb/sec]  MsgRate[Mpps]\n\n 65536  50  0.17  0.16  0.000305\n")
	require.True(t, ok)
	require.Equal(t, "0.160 Gbit/s", row.Metric(PerfBW))
}

func TestParsePingpong(t *testing.T) {
	r, ok := ParsePingpong(readTestdata(t, "ud_pingpong_server.txt"))
	require.True(t, ok)
	require.Equal(t, PingpongResult{Bytes: 40960, Mbits: 4.32, Iters: 20, UsecPerIter: 3792.50}, r)
	require.Equal(t, "4.32 Mbit/s, 3792 µs/iter", r.Metric())
	_, ok = ParsePingpong("40960 bytes in 0.08 seconds = 4.32 Mbit/sec\n")
	require.False(t, ok, "the iterations line is missing")
	_, ok = ParsePingpong("Failed status transport retry counter exceeded (12) for wr_id 2\n")
	require.False(t, ok)
}

func TestParseHWCounters(t *testing.T) {
	c := ParseHWCounters("sent_pkts:64\nrcvd_pkts:63\n\ngarbage\nsend_err: 1\nbad:x\ndmesg_lines:412\n")
	require.Equal(t, Counters{"sent_pkts": 64, "rcvd_pkts": 63, "send_err": 1, "dmesg_lines": 412}, c)
}

func TestParseRxedCounters(t *testing.T) {
	c, err := ParseRxedCounters([]byte(`{"sent_pkts": 10, "rcvd_pkts": 12, "drop_icrc": 0}`))
	require.NoError(t, err)
	require.Equal(t, Counters{"sent_pkts": 10, "rcvd_pkts": 12, "drop_icrc": 0}, c)
	for _, bad := range []string{``, `[]`, `{"a": -1}`, `{"a": 1.5}`, `{"a": "1"}`, `{"a": 1} {"b": 2}`, `{"a": 1`} {
		_, err := ParseRxedCounters([]byte(bad))
		require.Error(t, err, "%q", bad)
	}
}

func TestDelta(t *testing.T) {
	d := Delta(Counters{"a": 5, "b": 10}, Counters{"a": 7, "b": 3, "c": 4})
	require.Equal(t, Counters{"a": 2, "b": 3, "c": 4}, d)
	require.Equal(t, "a=2 b=3 c=4", d.String())
	require.Equal(t, "(all zero)", Counters{"a": 0}.String())
}

func TestCheckRxeCounters(t *testing.T) {
	clean := Counters{"sent_pkts": 100, "rcvd_pkts": 100, "ack_deferred": 3, "rdma_sends": 20}
	p, n := CheckRxeCounters(clean, false, true)
	require.Empty(t, p)
	require.Empty(t, n)

	retried := Counters{"duplicate_request": 2, "completer_retry_err": 1}
	p, n = CheckRxeCounters(retried, false, false)
	require.Empty(t, p)
	require.Equal(t, []string{"duplicate_request +2", "completer_retry_err +1"}, n)
	p, _ = CheckRxeCounters(retried, false, true)
	require.Equal(t, []string{"duplicate_request +2", "completer_retry_err +1"}, p, "strict without loss fails")
	p, n = CheckRxeCounters(retried, true, true)
	require.Empty(t, p, "loss makes recovery expected even in strict mode")
	require.Len(t, n, 2)

	for _, hard := range rxeHardErrors {
		p, _ := CheckRxeCounters(Counters{hard: 1}, true, false)
		require.Equal(t, []string{hard + " +1"}, p)
	}
}

func TestCheckRxedCounters(t *testing.T) {
	p, n := CheckRxedCounters(Counters{"drop_icrc": 0, "drop_no_qp": 0, "sent_pkts": 5}, false, true, 0)
	require.Empty(t, p)
	require.Empty(t, n)
	p, n = CheckRxedCounters(Counters{"drop_icrc": 3, "drop_no_qp": 0, "send_err": 1, "duplicate_request": 4}, true, false, 0)
	require.Equal(t, []string{"rxed drop_icrc=3", "rxed send_err +1"}, p)
	require.Equal(t, []string{"rxed duplicate_request +4"}, n)
}

// The CI run at b4ffae3 failed write_lat_R/2B (rxed client, TCG guest): rxed fast-retransmitted
// 9 WRITEs the slow guest had not yet ACKed, the guest answered each duplicate
// (duplicate_request +9), and one answer reached rxed's QP after rdma_disconnect had moved it to
// ERR: drop_state=1, and guest sent_pkts 234 against rxed rcvd_pkts 233. Outside strict mode
// such late answers, up to the peer's duplicates, are notes; anything beyond them, any other
// drop, and any late answer in strict mode still fail.
func TestLateAnswersToDuplicatesAreForgivenOutsideStrictMode(t *testing.T) {
	guest := Counters{"duplicate_request": 9, "sent_pkts": 234}
	rxed := Counters{"drop_state": 1, "rcvd_pkts": 233, "fast_retransmits": 9}

	late := LateAnswers(guest, false)
	require.Equal(t, uint64(9), late)
	p, n := CheckRxedCounters(rxed, false, false, late)
	require.Empty(t, p)
	require.Equal(t, []string{"rxed drop_state=1 (answers to 9 duplicate requests may come late)"}, n)
	require.Empty(t, CheckDelivery("guest", guest, "rxed", rxed, Retransmissions(guest)+late))

	require.Zero(t, LateAnswers(guest, true), "strict mode forgives nothing")
	p, _ = CheckRxedCounters(rxed, false, true, LateAnswers(guest, true))
	require.Equal(t, []string{"rxed drop_state=1"}, p)
	require.NotEmpty(t, CheckDelivery("guest", guest, "rxed", rxed, LateAnswers(guest, true)))

	p, _ = CheckRxedCounters(Counters{"drop_state": 10}, false, false, late)
	require.Equal(t, []string{"rxed drop_state=10"}, p, "more drops than duplicates answered")
	p, _ = CheckRxedCounters(Counters{"drop_qp": 1, "drop_icrc": 1}, false, false, late)
	require.Equal(t, []string{"rxed drop_icrc=1", "rxed drop_qp=1"}, p, "only drop_state is a late answer's drop")
	require.NotEmpty(t, CheckDelivery("guest", guest, "rxed", Counters{"rcvd_pkts": 224}, late),
		"10 missing, 9 forgiven")
}

func TestCheckDelivery(t *testing.T) {
	require.Empty(t, CheckDelivery("rxed", Counters{"sent_pkts": 64}, "guest", Counters{"rcvd_pkts": 64}, 0))
	require.Empty(t, CheckDelivery("rxed", Counters{}, "guest", Counters{"rcvd_pkts": 64}, 0), "no counter, no check")
	require.Equal(t, "rxed sent_pkts 64 but guest rcvd_pkts 60",
		CheckDelivery("rxed", Counters{"sent_pkts": 64}, "guest", Counters{"rcvd_pkts": 60}, 0))
	require.Empty(t, CheckDelivery("rxed", Counters{"sent_pkts": 64}, "guest", Counters{"rcvd_pkts": 62}, 2))
	require.NotEmpty(t, CheckDelivery("rxed", Counters{"sent_pkts": 64}, "guest", Counters{"rcvd_pkts": 61}, 2))
	require.NotEmpty(t, CheckDelivery("rxed", Counters{"sent_pkts": 60}, "guest", Counters{"rcvd_pkts": 64}, 9),
		"receiving more than was sent is never explained by slack")
	require.Equal(t, uint64(5), Retransmissions(Counters{"completer_retry_err": 2, "retransmit_timeouts": 3, "sent_pkts": 9}))
	require.Equal(t, uint64(7), Retransmissions(Counters{"retransmit_timeouts": 3, "fast_retransmits": 4}))
}

func TestParseGIDs(t *testing.T) {
	s := "0:fe80:0000:0000:0000:5054:00ff:fe78:000b\n" +
		"1:0000:0000:0000:0000:0000:ffff:0a4e:000b\n" +
		"2:fd78:0000:0000:0000:0000:0000:0000:0011\n" +
		"3:0000:0000:0000:0000:0000:0000:0000:0000\n"
	i4, i6 := ParseGIDs(s, netip.MustParseAddr("10.78.0.11"), netip.MustParseAddr("fd78::11"))
	require.Equal(t, 1, i4)
	require.Equal(t, 2, i6)
	i4, i6 = ParseGIDs(s, netip.MustParseAddr("10.78.0.12"), netip.MustParseAddr("fd78::12"))
	require.Equal(t, -1, i4)
	require.Equal(t, -1, i6)
	i4, i6 = ParseGIDs("x:y\n1:nonsense\n", netip.MustParseAddr("10.78.0.11"), netip.MustParseAddr("fd78::11"))
	require.Equal(t, -1, i4)
	require.Equal(t, -1, i6)
}

func TestBadOutput(t *testing.T) {
	require.Equal(t, "Invalid data in page 1", badOutput.FindString("20 iters in 0.1 seconds\nInvalid data in page 1\n"))
	require.Empty(t, badOutput.FindString(readTestdata(t, "write_bw_client.txt")))
	require.Empty(t, badOutput.FindString(readTestdata(t, "ud_pingpong_server.txt")))
}

func TestParseSNMP(t *testing.T) {
	s := "Ip: Forwarding DefaultTTL\nIp: 2 64\n" +
		"Udp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors InCsumErrors IgnoredMulti MemErrors\n" +
		"Udp: 5000 2 7 4000 3 0 0 0 0\n" +
		"UdpLite: InDatagrams NoPorts InErrors\nUdpLite: 0 0 9\n"
	c := ParseSNMP(s)
	require.Equal(t, uint64(5000), c["udp_InDatagrams"])
	require.Equal(t, uint64(7), c["udp_InErrors"])
	require.Equal(t, uint64(3), c["udp_RcvbufErrors"])
	require.Equal(t, uint64(10), UDPDrops(c))
	require.Empty(t, ParseSNMP("garbage\nUdp:\n"))
}

// The CI run at e3e59b3 failed rc_pingpong/mtu4096/1B (rxed server, TCG guest, the host also
// running benchmarks): rxed's ID guard rejected one of the guest's ACKs whose IPv4 ID lay past
// the window, the next packet followed it and re-anchored the window (ipv4_id_resync=1), and
// rxed's retransmit timer resent the SEND (guest duplicate_request +1). Outside strict mode a
// drop each resync accounts for is a note; more drops than resyncs, and any in strict mode,
// still fail.
func TestIPv4IDJumpsTheGuardReanchoredOnAreNotesOutsideStrictMode(t *testing.T) {
	rxed := Counters{"drop_ipv4_id": 1, "ipv4_id_resync": 1, "retransmit_timeouts": 1, "completer_retry_err": 1, "rcvd_pkts": 40}
	p, n := CheckRxedCounters(rxed, false, false, 0)
	require.Empty(t, p)
	require.Contains(t, n, "rxed drop_ipv4_id=1 (the guest's IPv4 ID counter jumped out of the window; re-anchored 1 times)")

	p, _ = CheckRxedCounters(rxed, false, true, 0)
	require.Contains(t, p, "rxed drop_ipv4_id=1", "strict mode forgives nothing")

	p, _ = CheckRxedCounters(Counters{"drop_ipv4_id": 2, "ipv4_id_resync": 1}, false, false, 0)
	require.Equal(t, []string{"rxed drop_ipv4_id=2"}, p, "a drop no resync followed")
	p, _ = CheckRxedCounters(Counters{"drop_icrc": 1, "ipv4_id_resync": 1}, false, false, 0)
	require.Equal(t, []string{"rxed drop_icrc=1"}, p, "a resync forgives only ID drops")
}
