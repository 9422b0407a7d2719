package daemon

import (
	"context"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"
)

func TestMetricName(t *testing.T) {
	require.Equal(t, "rxed_sent_pkts_total", MetricName("sent_pkts"))
	require.Equal(t, "rxed_drop_bad_icrc_total", MetricName("drop_bad-icrc"))
	require.Equal(t, "rxed_a_b_c_total", MetricName("a.b c"))
}

func TestCounterName(t *testing.T) {
	for _, c := range []string{"sent_pkts", "retry_rnr_exceeded_err", "drop_icrc", "sessions_failed"} {
		got, ok := CounterName(MetricName(c))
		require.True(t, ok, c)
		require.Equal(t, c, got)
	}
	for _, m := range []string{"go_goroutines", "rxed_sessions_active", "rxed__total", "sent_pkts_total"} {
		_, ok := CounterName(m)
		require.False(t, ok, m)
	}
}

// startMetricsDaemon runs a daemon with /metrics on an ephemeral port and
// returns it with the page's URL; each of more adjusts its Config first.
func startMetricsDaemon(t *testing.T, addr string, more ...func(*Config)) (*Daemon, string) {
	t.Helper()
	cfg := Config{Addrs: addrs(t, addr), Exports: []ExportSpec{{Name: "scratch", Kind: ExportAnon, Size: 8192}},
		MetricsAddr: "127.0.0.1:0"}
	for _, f := range more {
		f(&cfg)
	}
	d, err := New(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	return d, "http://" + d.MetricsAddr().String() + "/metrics"
}

func get(t *testing.T, method, url string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp, string(b)
}

// TestMetricsPage (issue 15): /metrics is client_golang's page: it
// parses as the text format, every engine counter is there as a counter
// rxed_<name>_total whose HELP names rdma_rxe's counter where rxe has
// one, the daemon's counters and gauges and the session histograms are
// there, and so are the process and Go collectors. It passes
// client_golang's linter.
func TestMetricsPage(t *testing.T) {
	d, url := startMetricsDaemon(t, "127.0.3.250")
	resp, body := get(t, http.MethodGet, url)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Contains(t, resp.Header.Get("Content-Type"), "text/plain")
	p := expfmt.NewTextParser(model.LegacyValidation)
	mfs, err := p.TextToMetricFamilies(strings.NewReader(body))
	require.NoError(t, err)

	counters := d.Device().Counters()
	require.Contains(t, counters, "sent_pkts")
	for c := range counters {
		mf := mfs[MetricName(c)]
		require.NotNil(t, mf, "engine counter %s missing from the page", c)
		require.Equal(t, dto.MetricType_COUNTER, mf.GetType(), c)
		require.NotContains(t, counterHelpText(c), "see the engine's documentation", "counter %s has no description in counterHelp", c)
		require.Contains(t, mf.GetHelp(), " "+c+":", c)
		if rxeCounters[c] {
			require.True(t, strings.HasPrefix(mf.GetHelp(), "rdma_rxe counter "+c+":"), "%s: %q", c, mf.GetHelp())
		}
	}
	for c := range rxeCounters {
		require.Contains(t, counters, c, "rdma_rxe's %s is not an engine counter", c)
	}
	for name, typ := range map[string]dto.MetricType{
		"rxed_sessions_active":             dto.MetricType_GAUGE,
		"rxed_session_qps":                 dto.MetricType_GAUGE,
		"rxed_sessions_total":              dto.MetricType_COUNTER,
		"rxed_sessions_completed_total":    dto.MetricType_COUNTER,
		"rxed_sessions_refused_busy_total": dto.MetricType_COUNTER,
		"rxed_read_cap_drops_total":        dto.MetricType_COUNTER,
		"rxed_export_bytes":                dto.MetricType_GAUGE,
		"rxed_session_setup_seconds":       dto.MetricType_HISTOGRAM,
		"rxed_session_duration_seconds":    dto.MetricType_HISTOGRAM,
		"process_cpu_seconds_total":        dto.MetricType_COUNTER,
		"process_resident_memory_bytes":    dto.MetricType_GAUGE,
		"go_goroutines":                    dto.MetricType_GAUGE,
		"go_gc_duration_seconds":           dto.MetricType_SUMMARY,
	} {
		require.Contains(t, mfs, name)
		require.Equal(t, typ, mfs[name].GetType(), name)
	}
	require.Contains(t, body, `rxed_export_bytes{export="scratch",kind="anon"} 8192`)
	require.Contains(t, body, `rxed_session_setup_seconds_count{exchange="rdma_cm"} 0`)
	require.Contains(t, body, `rxed_session_duration_seconds_count{exchange="tcp",result="failed"} 0`)
	// Metrics() is the same page.
	require.Contains(t, d.Metrics(), "# TYPE rxed_sent_pkts_total counter\n")

	problems, err := testutil.GatherAndLint(d.registry)
	require.NoError(t, err)
	for _, pr := range problems {
		if strings.HasPrefix(pr.Metric, "rxed_") {
			t.Errorf("lint: %s: %s", pr.Metric, pr.Text)
		}
	}
}

// TestMetricsCountersReadAtScrape: the engine's counters are read when
// the page is gathered, not copied: a packet the engine counts shows on
// the next scrape.
func TestMetricsCountersReadAtScrape(t *testing.T) {
	d, _ := startMetricsDaemon(t, "127.0.3.249")
	before := d.Device().Counters()["drop_length"]
	require.Equal(t, float64(before), scrape(t, d, MetricName("drop_length")))
	// A datagram too short for any header: drop_length.
	sendUDP(t, "127.0.3.249", d.Device().UDPPort(), []byte{1, 2, 3})
	deadline := time.Now().Add(10 * time.Second)
	for d.Device().Counters()["drop_length"] == before {
		require.True(t, time.Now().Before(deadline), "the engine never counted the runt datagram")
		time.Sleep(5 * time.Millisecond)
	}
	require.Equal(t, float64(before+1), scrape(t, d, MetricName("drop_length")))
}

// scrape returns the value of the unlabelled counter or gauge name on
// the daemon's page.
func scrape(t *testing.T, d *Daemon, name string) float64 {
	t.Helper()
	p := expfmt.NewTextParser(model.LegacyValidation)
	mfs, err := p.TextToMetricFamilies(strings.NewReader(d.Metrics()))
	require.NoError(t, err)
	require.Contains(t, mfs, name)
	m := mfs[name].GetMetric()
	require.Len(t, m, 1, name)
	if c := m[0].GetCounter(); c != nil {
		return c.GetValue()
	}
	return m[0].GetGauge().GetValue()
}

func sendUDP(t *testing.T, addr string, port uint16, b []byte) {
	t.Helper()
	c, err := net.Dial("udp", net.JoinHostPort(addr, strconv.Itoa(int(port))))
	require.NoError(t, err)
	defer c.Close()
	_, err = c.Write(b)
	require.NoError(t, err)
}

// TestMetricsBadRequests: only GET and HEAD of /metrics are answered.
func TestMetricsBadRequests(t *testing.T) {
	_, url := startMetricsDaemon(t, "127.0.3.248")
	for _, m := range []string{http.MethodPost, http.MethodPut, http.MethodDelete} {
		resp, _ := get(t, m, url)
		require.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode, m)
		require.Equal(t, "GET, HEAD", resp.Header.Get("Allow"), m)
	}
	resp, body := get(t, http.MethodHead, url)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Empty(t, body)
	for _, path := range []string{"/", "/metric", "/metrics/x", "/debug/pprof/"} {
		resp, _ := get(t, http.MethodGet, strings.TrimSuffix(url, "/metrics")+path)
		require.Equal(t, http.StatusNotFound, resp.StatusCode, path)
	}
}

// TestSessionHistograms: a session's setup and duration are observed on
// the daemon's clock, by exchange and result.
func TestSessionHistograms(t *testing.T) {
	// The engine's receive path reads the clock too: an atomic one.
	var nowNs atomic.Int64
	nowNs.Store(time.Unix(1000, 0).UnixNano())
	advance := func(d time.Duration) { nowNs.Add(int64(d)) }
	d, err := New(Config{Addrs: addrs(t, "127.0.3.247"), Now: func() time.Time { return time.Unix(0, nowNs.Load()) }})
	require.NoError(t, err)
	defer d.release()
	s := &session{exchange: exchangeRDMACM, traffic: &sessionTraffic{}}
	require.True(t, d.reg.admit(s))
	release := make(chan struct{})
	ended := make(chan struct{})
	d.runSession(s, "test session", "peer", func(context.Context) error {
		advance(250 * time.Millisecond)
		d.established(s)
		<-release
		advance(90 * time.Second)
		return nil
	})
	go func() { d.wg.Wait(); close(ended) }()
	close(release)
	<-ended
	m := d.Metrics()
	require.Contains(t, m, `rxed_session_setup_seconds_sum{exchange="rdma_cm"} 0.25`+"\n")
	require.Contains(t, m, `rxed_session_setup_seconds_bucket{exchange="rdma_cm",le="0.1"} 0`+"\n")
	require.Contains(t, m, `rxed_session_setup_seconds_bucket{exchange="rdma_cm",le="0.25"} 1`+"\n")
	require.Contains(t, m, `rxed_session_setup_seconds_count{exchange="tcp"} 0`+"\n")
	require.Contains(t, m, `rxed_session_duration_seconds_sum{exchange="rdma_cm",result="completed"} 90.25`+"\n")
	require.Contains(t, m, `rxed_session_duration_seconds_count{exchange="rdma_cm",result="failed"} 0`+"\n")
	require.Contains(t, m, "rxed_sessions_completed_total 1\n")
}
