package daemon

import (
	"bytes"
	"fmt"
	"net/http"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/common/expfmt"
)

// Metric naming. Every engine counter C (ib.Device.Counters: rdma_rxe's
// hw_counters under rxe's own names, then the ones rxed adds, then one
// drop_* per drop reason) is the Prometheus counter MetricName(C), that
// is rxed_C_total: `rdma statistic show link rxe0/1` on a kernel host
// prints sent_pkts where this page has rxed_sent_pkts_total, and the HELP
// line of each of rxe's names says "rdma_rxe counter C". CounterName is
// the way back, which `rxed stat` uses to print rxe's names. The
// daemon's own counters follow the same rule (rxed_sessions_failed_total
// is the counter sessions_failed); gauges have no suffix; histograms are
// in seconds.

// MetricPrefix starts every metric name the daemon serves (the process_
// and go_ collectors' excepted).
const MetricPrefix = "rxed_"

// CounterSuffix ends every counter's name (Prometheus's convention).
const CounterSuffix = "_total"

// MetricName is the name of the engine counter's metric: MetricPrefix,
// the counter name with every character outside [a-zA-Z0-9_] replaced by
// '_', then CounterSuffix.
func MetricName(counter string) string {
	var b strings.Builder
	b.WriteString(MetricPrefix)
	for _, r := range counter {
		if r == '_' || (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z') || (r >= '0' && r <= '9') {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	b.WriteString(CounterSuffix)
	return b.String()
}

// CounterName is MetricName's inverse: the counter a metric of this page
// counts (MetricPrefix and CounterSuffix removed), and whether the name
// has both.
func CounterName(metric string) (string, bool) {
	c, ok := strings.CutPrefix(metric, MetricPrefix)
	if !ok {
		return metric, false
	}
	c, ok = strings.CutSuffix(c, CounterSuffix)
	return c, ok && c != ""
}

// rxeCounters are the names of rdma_rxe's hw_counters
// (drivers/infiniband/sw/rxe/rxe_hw_counters.c), which the engine counts
// under the same names and with the same meaning.
var rxeCounters = map[string]bool{
	"sent_pkts": true, "rcvd_pkts": true, "duplicate_request": true, "out_of_seq_request": true,
	"rcvd_rnr_err": true, "send_rnr_err": true, "rcvd_seq_err": true, "ack_deferred": true,
	"retry_exceeded_err": true, "retry_rnr_exceeded_err": true, "completer_retry_err": true,
	"send_err": true, "link_downed": true, "rdma_sends": true, "rdma_recvs": true,
}

// counterHelp says what each engine counter counts (pkg/qp's Counters and
// DropReason, pkg/roce's Counter* constants). A counter missing here is
// still served, with a HELP naming it only.
var counterHelp = map[string]string{
	"sent_pkts":              "packets handed to the transport",
	"rcvd_pkts":              "packets accepted by the receive checks",
	"duplicate_request":      "requests the responder had already executed (duplicate PSN)",
	"out_of_seq_request":     "requests past the expected PSN (PSN gap) seen by the responder",
	"rcvd_rnr_err":           "RNR NAKs received by the requester",
	"send_rnr_err":           "RNR NAKs sent by the responder",
	"rcvd_seq_err":           "PSN sequence error NAKs received by the requester",
	"ack_deferred":           "ACKs the responder withheld (no AckReq)",
	"retry_exceeded_err":     "QPs that ran out of retry_cnt",
	"retry_rnr_exceeded_err": "QPs that ran out of rnr_retry",
	"completer_retry_err":    "requester restarts from an older PSN",
	"send_err":               "packets the transport refused",
	"link_downed":            "times the port went down",
	"rdma_sends":             "SEND messages started by the requester",
	"rdma_recvs":             "SEND messages completed by the responder",
	"cnp_rcvd":               "congestion notification packets received",
	"retransmit_timeouts":    "retransmit timer expiries with work outstanding",
	"implied_naks":           "ACKs that skipped an unanswered READ or atomic",
	"replayed_responses":     "READ/atomic responses replayed for a duplicate request",
	"replays_limited":        "duplicate READs not replayed (too many without progress)",
	"naks_limited":           "PSN sequence NAKs not sent (per-QP rate limit)",
	"ghost_responses":        "responses for PSNs never sent, ignored",
	"fast_retransmits":       "go-back-N retransmissions started by the requester's own round-trip estimate, before the retransmit timer",
	"read_response_gaps":     "READ responses that skipped a PSN, re-requested at once",
	"read_replies_kept":      "later READs whose whole replies came behind a gap, placed and not asked for again",
	"ipv4_id_resync":         "IPv4 Identification windows re-anchored",
	"mcast_no_member":        "multicast datagrams for a group no QP is attached to (ignored)",
	"mcast_skipped":          "attached QPs that skipped a multicast datagram for their type or state (no drop, as rdma_rxe)",
	"doorbell_batches":       "batches of posts kept for other posts to join them (DoorbellBatch)",
	"drop_length":            "packets dropped: shorter than their headers and ICRC",
	"drop_header":            "packets dropped: bad transport version, padding or length",
	"drop_bad_opcode":        "packets dropped: reserved or unsupported opcode",
	"drop_qp":                "packets dropped: no such QP",
	"drop_qp_type":           "packets dropped: opcode transport does not match the QP type",
	"drop_state":             "packets dropped: QP not in a state that accepts them",
	"drop_address":           "packets dropped: address is not the QP's path",
	"drop_pkey":              "packets dropped: P_Key mismatch",
	"drop_qkey":              "packets dropped: Q_Key mismatch",
	"drop_icrc":              "packets dropped: invariant CRC mismatch",
	"drop_ipv4_id":           "packets dropped: ICRC holds only with an IPv4 Identification the peer cannot have sent",
	"drop_overrun":           "packets dropped: receive queue full (socket buffer or in-memory queue)",
}

// counterHelpText is the HELP of an engine counter's metric.
func counterHelpText(c string) string {
	what := counterHelp[c]
	if what == "" {
		what = "see the engine's documentation"
	}
	if rxeCounters[c] {
		return "rdma_rxe counter " + c + ": " + what + "."
	}
	return "rxed engine counter " + c + ": " + what + " (rdma_rxe has no such counter)."
}

// engineCollector serves the engine's counters as they are at scrape
// time: the engine keeps them, the page only reads them. The set of names
// is fixed when the engine starts, so the descriptors are made once.
type engineCollector struct {
	counters func() map[string]uint64
	descs    map[string]*prometheus.Desc
}

func newEngineCollector(counters func() map[string]uint64) *engineCollector {
	c := &engineCollector{counters: counters, descs: map[string]*prometheus.Desc{}}
	for name := range counters() {
		c.descs[name] = prometheus.NewDesc(MetricName(name), counterHelpText(name), nil, nil)
	}
	return c
}

func (c *engineCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

func (c *engineCollector) Collect(ch chan<- prometheus.Metric) {
	for name, v := range c.counters() {
		if d := c.descs[name]; d != nil {
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v))
		}
	}
}

// Exchanges (the exchange label) and results (the result label) of the
// session histograms.
const (
	exchangeTCP    = "tcp"     // perftest's TCP exchange (perftest.go)
	exchangeRDMACM = "rdma_cm" // perftest -R (rdmacm_session.go)

	resultCompleted = "completed"
	resultFailed    = "failed"
)

// sessionMetrics are the histograms the session code observes.
type sessionMetrics struct {
	setup    *prometheus.HistogramVec // exchange
	duration *prometheus.HistogramVec // exchange, result
}

// newMetrics builds the daemon's registry: the engine's counters, the IB
// CM's (metrics_cm.go), the daemon's own counters and gauges (read from
// the fields that keep them), the session histograms, and the process and
// Go runtime collectors. A registry per daemon, not the default one, so
// that several daemons can run in one process (the tests do).
func (d *Daemon) newMetrics() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}), collectors.NewGoCollector())
	reg.MustRegister(newEngineCollector(d.dev.Counters))
	reg.MustRegister(newCMCollector(d.dev))

	gauge := func(name, help string, v func() float64) {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, v))
	}
	counter := func(name, help string, v func() uint64) {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, func() float64 { return float64(v()) }))
	}
	gauge("rxed_sessions_active", "perftest sessions in progress.", func() float64 { return float64(d.active.Load()) })
	gauge("rxed_session_qps", "QPs of running sessions connected to a client's QP.", func() float64 { return float64(d.traffic.trackedQPs()) })
	counter("rxed_sessions_total", "perftest sessions accepted.", d.total.Load)
	counter("rxed_sessions_completed_total", "perftest sessions that ran to the end.", d.completed.Load)
	counter("rxed_sessions_failed_total", "perftest sessions that ended in an error.", d.failed.Load)
	counter("rxed_sessions_refused_busy_total", "clients refused at the session limit (global or per source).", d.refusedBusy.Load)
	counter("rxed_sessions_refused_address_total", "clients refused by the --allow list.", d.refusedAddr.Load)
	counter("rxed_sessions_refused_gid_total", "clients refused because the GID they announced is not theirs (unproved).", d.refusedGID.Load)
	counter("rxed_sessions_idle_reclaimed_total", "established sessions ended by the idle timeout.", d.reclaimed.Load)
	counter("rxed_sessions_handshake_timeouts_total", "exchanges that did not finish within the handshake timeout.", d.hsTimeouts.Load)
	counter("rxed_budget_drops_total", "datagrams not sent: a session's send budget (anti-amplification or --session-bytes) was spent.", d.traffic.budgetDrops.Load)
	counter("rxed_read_cap_drops_total", "RDMA READ requests dropped for asking more than --max-read.", d.traffic.readCapDrops.Load)

	exports := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "rxed_export_bytes", Help: "Size of each exported region."}, []string{"export", "kind"})
	for _, e := range d.exports {
		exports.WithLabelValues(e.Spec.Name, e.Spec.Kind.String()).Set(float64(e.MR.Len()))
	}
	reg.MustRegister(exports)

	d.sessMetrics.setup = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "rxed_session_setup_seconds",
		Help: "Connection setup: from accepting a client (its TCP connection, or its rdma_cm REQ) to its session established (every QP in RTS, keys exchanged).",
		// Local exchanges take milliseconds; a lost CM MAD costs seconds.
		Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
	}, []string{"exchange"})
	d.sessMetrics.duration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "rxed_session_duration_seconds",
		Help:    "Sessions from accepting the client to the session's end, by result.",
		Buckets: []float64{.01, .1, .5, 1, 5, 10, 30, 60, 300, 900, 3600, 14400},
	}, []string{"exchange", "result"})
	for _, x := range []string{exchangeTCP, exchangeRDMACM} {
		d.sessMetrics.setup.WithLabelValues(x)
		for _, r := range []string{resultCompleted, resultFailed} {
			d.sessMetrics.duration.WithLabelValues(x, r)
		}
	}
	reg.MustRegister(d.sessMetrics.setup, d.sessMetrics.duration)
	return reg
}

// established marks s's exchange over: its idle clock starts and its
// setup time is observed.
func (d *Daemon) established(s *session) {
	now := d.cfg.Now()
	d.reg.establish(s, now)
	d.sessMetrics.setup.WithLabelValues(s.exchange).Observe(now.Sub(s.start).Seconds())
}

// observeEnd records s's duration (the session is over).
func (d *Daemon) observeEnd(s *session, failed bool) {
	r := resultCompleted
	if failed {
		r = resultFailed
	}
	d.sessMetrics.duration.WithLabelValues(s.exchange, r).Observe(d.cfg.Now().Sub(s.start).Seconds())
}

// Metrics renders the daemon's page in Prometheus text format 0.0.4, as
// GET /metrics serves it.
func (d *Daemon) Metrics() string {
	mfs, err := d.gather()
	var b bytes.Buffer
	enc := expfmt.NewEncoder(&b, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, mf := range mfs {
		_ = enc.Encode(mf)
	}
	if err != nil {
		b.WriteString("# gather error: " + err.Error() + "\n")
	}
	return b.String()
}

// metricsHandler serves GET and HEAD /metrics from the daemon's registry.
func (d *Daemon) metricsHandler() http.Handler {
	h := d.pageHandler() // scrapes.go
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// slogPromLogger passes promhttp's errors (a collector failing) to the
// daemon's log.
type slogPromLogger struct{ d *Daemon }

func (l slogPromLogger) Println(v ...any) {
	l.d.log.Warn("metrics: " + strings.TrimSpace(fmt.Sprintln(v...)))
}
