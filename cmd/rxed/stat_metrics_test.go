package main

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"
)

// TestStatAgainstServe (issue 15): `rxed stat` reads the client_golang
// page of a running daemon: engine counters under rdma_rxe's names (no
// _total), the daemon's counters, the session histograms' counts by
// exchange, and nothing of the process and Go collectors. The page
// itself shows a TCP and an rdma_cm session in the setup and duration
// histograms.
func TestStatAgainstServe(t *testing.T) {
	t.Parallel()
	a, b := addrPair(t)
	port, mport := reservePort(t), reservePort(t)
	_, logs, _, _ := startServe(t, "--addr", a, "-p", port, "--rdma-cm-port", "18515", "--export", "data=anon,size=1M",
		"--metrics", "127.0.0.1:"+mport, "--log-level", "debug", "--timeout", "5s")
	w := runCmd("perf", "write", "--addr", b, "-p", port, "-s", "4096", "-n", "20", "--progress", "0", a)
	requireOK(t, "perf write", w)
	r := runCmd("perf", "read", "-R", "--addr", b, "-s", "4096", "-n", "20", "--progress", "0", "--timeout", "5s", a)
	requireOK(t, "perf read -R", r)
	logs.waitFor(t, "perftest session complete", 10*time.Second)
	logs.waitFor(t, "perftest rdma_cm session complete", 10*time.Second)

	st := runCmd("stat", "--metrics", "127.0.0.1:"+mport)
	requireOK(t, "stat", st)
	for _, re := range []string{
		`(?m)^sent_pkts +[1-9][0-9]*$`,
		`(?m)^rcvd_pkts +[1-9][0-9]*$`,
		`(?m)^sessions +2$`,
		`(?m)^sessions_completed +2$`,
		`(?m)^export_bytes\{export="data",kind="anon"\} +1048576$`,
		`(?m)^session_setup_seconds_count\{exchange="tcp"\} +1$`,
		`(?m)^session_setup_seconds_count\{exchange="rdma_cm"\} +1$`,
		`(?m)^session_duration_seconds_count\{exchange="rdma_cm",result="completed"\} +1$`,
		// The IB CM's counters of the -R run, as cm_C: the REQs of its
		// control and test connections received, REPs sent, RTUs received.
		`(?m)^cm_rx_req +[1-9][0-9]*$`,
		`(?m)^cm_tx_rep +[1-9][0-9]*$`,
		`(?m)^cm_rx_rtu +[1-9][0-9]*$`,
	} {
		require.Regexp(t, re, st.stdout)
	}
	require.NotRegexp(t, `(?m)^\S*_total\b`, st.stdout, "counters are shown under their own names")
	require.NotRegexp(t, `(?m)^(go|process)_`, st.stdout)
	require.NotRegexp(t, `(?m)^sessions_failed `, st.stdout, "zero counters are hidden")
	all := runCmd("stat", "--metrics", "127.0.0.1:"+mport, "--all")
	requireOK(t, "stat --all", all)
	for _, c := range []string{"duplicate_request", "out_of_seq_request", "rcvd_seq_err", "ack_deferred", "retry_exceeded_err",
		"retry_rnr_exceeded_err", "completer_retry_err", "send_rnr_err", "link_downed", "rdma_sends", "rdma_recvs", "drop_icrc"} {
		require.Regexp(t, `(?m)^`+c+` +[0-9]+$`, all.stdout)
	}
	require.Regexp(t, `(?m)^sessions_failed +0$`, all.stdout)
	for _, c := range []string{"cm_tx_req", "cm_rx_malformed", "cm_rej_invalid_service_id", "cm_timeouts"} {
		require.Regexp(t, `(?m)^`+c+` +[0-9]+$`, all.stdout)
	}

	resp, err := http.Get("http://127.0.0.1:" + mport + "/metrics")
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	p := expfmt.NewTextParser(model.LegacyValidation)
	mfs, err := p.TextToMetricFamilies(strings.NewReader(string(body)))
	require.NoError(t, err)
	setup := histograms(t, mfs["rxed_session_setup_seconds"])
	for _, x := range []string{"tcp", "rdma_cm"} {
		h := setup[`exchange="`+x+`"`]
		require.NotNil(t, h, x)
		require.Equal(t, uint64(1), h.GetSampleCount(), x)
		require.Greater(t, h.GetSampleSum(), 0.0, x)
		require.Less(t, h.GetSampleSum(), 30.0, x)
	}
	dur := histograms(t, mfs["rxed_session_duration_seconds"])
	require.Equal(t, uint64(1), dur[`exchange="tcp",result="completed"`].GetSampleCount())
	require.GreaterOrEqual(t, dur[`exchange="tcp",result="completed"`].GetSampleSum(), setup[`exchange="tcp"`].GetSampleSum())
}

// histograms indexes a histogram family's series by their labels.
func histograms(t *testing.T, mf *dto.MetricFamily) map[string]*dto.Histogram {
	t.Helper()
	require.NotNil(t, mf)
	require.Equal(t, dto.MetricType_HISTOGRAM, mf.GetType())
	out := map[string]*dto.Histogram{}
	for _, m := range mf.GetMetric() {
		out[strings.Trim(labelString(m.GetLabel()), "{}")] = m.GetHistogram()
	}
	return out
}

// TestStatParseBadPages: pages that are not rxed's, or not Prometheus
// text, are refused with a reason rather than shown as zeros.
func TestStatParseBadPages(t *testing.T) {
	for page, want := range map[string]string{
		"":                                   "no rxed_ metric",
		"go_goroutines 7\n":                  "no rxed_ metric",
		"<html><body>hello</body></html>\n":  "not a Prometheus metrics page",
		"rxed_sent_pkts_total\n":             "not a Prometheus metrics page",
		"rxed_sent_pkts_total twelve\n":      "not a Prometheus metrics page",
		"# TYPE rxed_x gauge\nrxed_x -1\n":   "bad value",
		"# TYPE rxed_x gauge\nrxed_x NaN\n":  "bad value",
		"# TYPE rxed_x gauge\nrxed_x +Inf\n": "bad value",
	} {
		_, err := parseMetrics(strings.NewReader(page))
		require.ErrorContains(t, err, want, "%q", page)
	}
	m, err := parseMetrics(strings.NewReader("# TYPE rxed_rcvd_pkts_total counter\nrxed_rcvd_pkts_total 12\n" +
		"# TYPE rxed_export_bytes gauge\nrxed_export_bytes{kind=\"anon\",export=\"a\"} 4096\nrxed_legacy 3\n" +
		"# TYPE rxed_cm_rx_req_total counter\nrxed_cm_rx_req_total 2\n"))
	require.NoError(t, err)
	require.Equal(t, map[string]uint64{"rcvd_pkts": 12, `export_bytes{export="a",kind="anon"}`: 4096, "legacy": 3, "cm_rx_req": 2}, m)
}

// TestStatMetricsURL: --metrics takes a host:port or a URL; a URL without
// a path is the daemon's /metrics too. Bug (found by the tools audit,
// session AF): http://host:port/ was fetched as given and got a 404.
// And (newcomer walk, session AI) host:port/path without a scheme asked
// for host:port/path/metrics.
func TestStatMetricsURL(t *testing.T) {
	for in, want := range map[string]string{
		"127.0.0.1:9479/":                    "http://127.0.0.1:9479/metrics",
		"127.0.0.1:9479/metrics":             "http://127.0.0.1:9479/metrics",
		"127.0.0.1:9479/rxed/metrics":        "http://127.0.0.1:9479/rxed/metrics",
		"127.0.0.1:9479":                     "http://127.0.0.1:9479/metrics",
		"[::1]:9479":                         "http://[::1]:9479/metrics",
		"http://127.0.0.1:9479":              "http://127.0.0.1:9479/metrics",
		"http://127.0.0.1:9479/":             "http://127.0.0.1:9479/metrics",
		"https://example.test/":              "https://example.test/metrics",
		"http://127.0.0.1:9479/metrics":      "http://127.0.0.1:9479/metrics",
		"http://127.0.0.1:9479/rxed/metrics": "http://127.0.0.1:9479/rxed/metrics",
	} {
		require.Equal(t, want, metricsURL(in), in)
	}
}
