package daemon

import (
	"context"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/rdmacm"
)

// TestMetricsCMCounters: the IB CM's counters are on /metrics as
// rxed_cm_C_total, read at scrape time: zero before anyone connects, and
// after an rdma_cm connection to the daemon's --rdma-cm-port (over
// loopback UDP, the client a device of its own) the REQ received and the
// REP sent are counted.
func TestMetricsCMCounters(t *testing.T) {
	const cmPort = 18515
	srvIP, cliIP := netip.MustParseAddr("127.0.3.240"), netip.MustParseAddr("127.0.3.241")
	d, url := startMetricsDaemon(t, srvIP.String(), func(c *Config) {
		c.RDMACMPort, c.StepTimeout = cmPort, 2*time.Second
	})

	cmCounter := func(body, c string) (float64, bool) {
		t.Helper()
		p := expfmt.NewTextParser(model.LegacyValidation)
		mfs, err := p.TextToMetricFamilies(strings.NewReader(body))
		require.NoError(t, err)
		mf := mfs[MetricName(CMCounterPrefix+c)]
		if mf == nil {
			return 0, false
		}
		require.Equal(t, dto.MetricType_COUNTER, mf.GetType(), c)
		require.Len(t, mf.GetMetric(), 1, c)
		return mf.GetMetric()[0].GetCounter().GetValue(), true
	}
	resp, body := get(t, http.MethodGet, url)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	for _, c := range []string{"rx_req", "tx_rep", "rx_rtu"} {
		v, ok := cmCounter(body, c)
		require.True(t, ok, "%s is served before it counts", c)
		require.Zero(t, v, "%s before any connection", c)
	}
	require.Contains(t, body, "# HELP rxed_cm_rx_req_total IB CM counter rx_req: REQ MADs received")

	cli, err := ib.OpenDevice(ib.Config{Addrs: []netip.Addr{cliIP}, Port: d.Device().UDPPort()})
	require.NoError(t, err)
	t.Cleanup(func() { _ = cli.Close() })
	pd, err := cli.AllocPD()
	require.NoError(t, err)
	cq, err := cli.CreateCQ(16)
	require.NoError(t, err)
	q, err := pd.CreateQP(ib.QPInitAttr{Type: ib.RC, SendCQ: cq, RecvCQ: cq,
		Cap: ib.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
	require.NoError(t, err)
	dctx, dcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer dcancel()
	// The daemon accepts the control connection at once (REP); that the
	// client then says nothing fails the session later, not the REP.
	conn, err := rdmacm.Dial(dctx, q, netip.AddrPortFrom(srvIP, cmPort), nil)
	require.NoError(t, err)
	defer func() { _ = conn.Disconnect(dctx) }()

	// The daemon counted its REP before sending it, and the RTU arrives
	// after the client's Dial returned: wait for that one.
	_, body = get(t, http.MethodGet, url)
	for _, c := range []string{"rx_req", "tx_rep"} {
		v, _ := cmCounter(body, c)
		require.GreaterOrEqual(t, v, 1.0, c)
	}
	v, _ := cmCounter(body, "tx_req")
	require.Zero(t, v, "the daemon sent no REQ")
	deadline := time.Now().Add(10 * time.Second)
	for {
		if v, _ := cmCounter(d.Metrics(), "rx_rtu"); v >= 1 {
			break
		}
		require.True(t, time.Now().Before(deadline), "the daemon never counted the client's RTU")
		time.Sleep(5 * time.Millisecond)
	}
	// The client's own side, for comparison: what it sent the daemon got.
	require.GreaterOrEqual(t, rdmacm.Counters(cli)["tx_req"], uint64(1))
	require.GreaterOrEqual(t, rdmacm.Counters(cli)["rx_rep"], uint64(1))
}

// TestMetricsCMHelp: every CM counter pkg/cm has a name for gets a HELP
// saying what it counts (the per-message families a generated one), and
// its metric name is a valid Prometheus name that CounterName maps back
// to cm_C.
func TestMetricsCMHelp(t *testing.T) {
	for _, c := range cmKnownCounters() {
		h := cmCounterHelpText(c)
		require.True(t, strings.HasPrefix(h, "IB CM counter "+c+": "), "%s: %q", c, h)
		require.NotContains(t, h, "see pkg/cm", "%s has no description", c)
		name := MetricName(CMCounterPrefix + c)
		require.True(t, model.LegacyValidation.IsValidMetricName(name), name)
		back, ok := CounterName(name)
		require.True(t, ok, name)
		require.Equal(t, CMCounterPrefix+c, back)
	}
	require.Equal(t, "IB CM counter rx_dup_req: REQ MADs received again (a retransmission of one already handled) (cm.c's cm_rx_duplicates/req).",
		cmCounterHelpText("rx_dup_req"))
	require.Equal(t, "IB CM counter tx_retries_dreq: DREQ MADs resent after their response timeout (cm.c's cm_tx_retries/dreq).",
		cmCounterHelpText("tx_retries_dreq"))
	require.Equal(t, "IB CM counter rej_stale_conn: REJs with reason 10 (stale connection) sent.", cmCounterHelpText("rej_stale_conn"))
	// A name pkg/cm may add later, or a family member of no known message.
	require.Equal(t, "IB CM counter rx_lap: see pkg/cm's counters.go.", cmCounterHelpText("rx_lap"))
	require.Equal(t, "IB CM counter new_thing: see pkg/cm's counters.go.", cmCounterHelpText("new_thing"))
}

// TestMetricsCMCollector: without a running connection manager the
// collector serves nothing; with one it serves every known counter (zero
// until counted) and any other the manager has, and the registry's
// linter finds nothing to say.
func TestMetricsCMCollector(t *testing.T) {
	var counts map[string]uint64
	c := &cmCollector{counters: func() map[string]uint64 { return counts }, known: map[string]*prometheus.Desc{}}
	for _, name := range cmKnownCounters() {
		c.known[name] = cmDesc(name)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	require.Equal(t, 0, testutil.CollectAndCount(c), "no manager, no CM metrics")

	counts = map[string]uint64{"rx_req": 3, "tx_rep": 2, "rx_lap": 1}
	require.Equal(t, len(cmKnownCounters())+1, testutil.CollectAndCount(c))
	mfs, err := reg.Gather()
	require.NoError(t, err)
	got := map[string]float64{}
	for _, mf := range mfs {
		require.Equal(t, dto.MetricType_COUNTER, mf.GetType(), mf.GetName())
		got[mf.GetName()] = mf.GetMetric()[0].GetCounter().GetValue()
	}
	require.Equal(t, 3.0, got["rxed_cm_rx_req_total"])
	require.Equal(t, 2.0, got["rxed_cm_tx_rep_total"])
	require.Equal(t, 1.0, got["rxed_cm_rx_lap_total"], "a counter the daemon has no name for is served too")
	require.Contains(t, got, "rxed_cm_timewait_exits_total")
	require.Zero(t, got["rxed_cm_timewait_exits_total"])
	problems, err := testutil.GatherAndLint(reg)
	require.NoError(t, err)
	require.Empty(t, problems)

	// A device with no connection manager: the daemon's collector reads
	// rdmacm.Counters, which is nil for it.
	dev, err := ib.OpenDevice(ib.Config{Addrs: []netip.Addr{netip.MustParseAddr("127.0.3.242")}, EphemeralPort: true})
	require.NoError(t, err)
	defer dev.Close()
	require.Equal(t, 0, testutil.CollectAndCount(newCMCollector(dev)))
}
