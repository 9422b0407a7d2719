package daemon

import (
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/rdmacm"
)

// The IB CM's counters (rdmacm.Counters: the device's cm.Manager, and
// rdma_cm's own rej_src_mismatch) are served as rxed_cm_C_total, C under
// pkg/cm's name: rxed_cm_rx_req_total is REQs received, what cm.c's sysfs
// shows as /sys/class/infiniband/rxe0/ports/1/cm_rx_msgs/req on a kernel
// host.
// `rxed stat` prints them as cm_C (CounterName).

// CMCounterPrefix starts the counter name (after MetricPrefix) of every
// CM counter: its metric is MetricName(CMCounterPrefix + C).
const CMCounterPrefix = "cm_"

// cmMessages are the CM messages pkg/cm sends and receives, under its
// names (cm.c's counter attributes less LAP and APR, which neither
// serves on RoCE: they count as rx_unknown_attr), with the spec's.
var cmMessages = []struct{ name, spec string }{
	{"req", "REQ"}, {"mra", "MRA"}, {"rej", "REJ"}, {"rep", "REP"}, {"rtu", "RTU"},
	{"dreq", "DREQ"}, {"drep", "DREP"}, {"sidr_req", "SIDR_REQ"}, {"sidr_rep", "SIDR_REP"},
}

// cmFamilies are pkg/cm's per-message counter families, as cm.c's
// counter groups: the prefix, then what a message's counter counts.
var cmFamilies = []struct{ prefix, group, what string }{
	// Longer prefixes first: rx_dup_req is not rx_ of "dup_req".
	{"tx_retries_", "cm_tx_retries", "MADs resent after their response timeout"},
	{"rx_dup_", "cm_rx_duplicates", "MADs received again (a retransmission of one already handled)"},
	{"rx_", "cm_rx_msgs", "MADs received and parsed, duplicates and ones dropped later included"},
	{"tx_", "cm_tx_msgs", "MADs sent, retransmissions included"},
}

// cmCounterHelp says what each of pkg/cm's other counters counts (its
// counters.go), and pkg/rdmacm's own (its source.go, listen_backlog.go).
var cmCounterHelp = map[string]string{
	"rx_malformed":           "received MADs dropped: truncated, wrong length or a field out of range",
	"rx_bad_header":          "received MADs dropped: not base version 1, class CM, class version 2, method SEND",
	"rx_unknown_attr":        "received MADs dropped: an attribute the CM does not serve (ClassPortInfo, LAP, APR: not on RoCE, as cm.c) or an undefined one",
	"rx_unknown_comm_id":     "received MADs dropped: no connection has the comm IDs the message names",
	"rx_wrong_state":         "received MADs dropped: the connection exists but does not expect the message now",
	"rx_dreq_bad_qpn":        "DREQs dropped: they name another QPN than the connection's (as cm.c)",
	"tx_errors":              "MADs the CM could not hand to QP 1",
	"rej_invalid_service_id": "REJs with reason 8 (invalid service ID) and SIDR_REPs with status unsupported sent: nobody listens on the service ID",
	"rej_stale_conn":         "REJs with reason 10 (stale connection) sent",
	"rej_no_resources":       "REJs with reason 3 (no resources) sent: too many connections between their REQ and RTU",
	"req_dropped":            "REQs dropped without a REJ for their retransmission to be taken as new: the rdma_cm listener's backlog was full",
	"timeouts":               "REQs, REPs, DREQs or SIDR_REQs unanswered after all their retries",
	"timewait_exits":         "connections that left timewait, their comm ID free again",
	"comm_est":               "passive connections established by their QP's first request (COMM_EST) before the RTU arrived",
	"rej_src_mismatch":       "REQs refused with REJ 28 and SIDR_REQs with SIDR_REP REJECT by rdma_cm: their rdma_cm header names another source address than the one they came from",
	"req_evicted":            "queued requests an rdma_cm listener's full backlog refused (REJ 28, SIDR_REP REJECT) to make room for a request from a source holding fewer",
	"req_source_full":        "REQs dropped without a REJ (SIDR_REQs refused) by an rdma_cm listener: their source address held the cap ListenOptions.MaxPerSource set (none by default)",
	"req_expired":            "queued requests an rdma_cm listener refused (REJ 28; SIDR_REP REJECT for a UD request) instead of handing them to Accept or keeping their place: their active side had given up (its retries all over), or they had waited 2 minutes",
}

// cmKnownCounters are the counters served even before they count
// anything (as zero), so that a rate has its start: every message of
// every family and the named ones.
func cmKnownCounters() []string {
	var names []string
	for _, f := range cmFamilies {
		for _, m := range cmMessages {
			names = append(names, f.prefix+m.name)
		}
	}
	for c := range cmCounterHelp {
		names = append(names, c)
	}
	return names
}

// cmCounterHelpText is the HELP of a CM counter's metric.
func cmCounterHelpText(c string) string {
	if what := cmCounterHelp[c]; what != "" {
		return "IB CM counter " + c + ": " + what + "."
	}
	for _, f := range cmFamilies {
		msg, ok := strings.CutPrefix(c, f.prefix)
		if !ok {
			continue
		}
		for _, m := range cmMessages {
			if m.name == msg {
				return "IB CM counter " + c + ": " + m.spec + " " + f.what + " (cm.c's " + f.group + "/" + msg + ")."
			}
		}
	}
	return "IB CM counter " + c + ": see pkg/cm's counters.go."
}

// cmCollector serves the device's CM counters as they are at scrape
// time. The Manager adds a counter when it first counts it, so the set of
// names can grow: the collector is unchecked (Describe sends nothing) and
// serves the known names (zero until counted) plus any other the Manager
// has. A device without a running connection manager has no CM metrics.
type cmCollector struct {
	counters func() map[string]uint64
	known    map[string]*prometheus.Desc // read-only after newCMCollector
}

func newCMCollector(dev *ib.Device) *cmCollector {
	c := &cmCollector{
		counters: func() map[string]uint64 { return rdmacm.Counters(dev) },
		known:    map[string]*prometheus.Desc{},
	}
	for _, name := range cmKnownCounters() {
		c.known[name] = cmDesc(name)
	}
	return c
}

func cmDesc(name string) *prometheus.Desc {
	return prometheus.NewDesc(MetricName(CMCounterPrefix+name), cmCounterHelpText(name), nil, nil)
}

// Describe sends nothing: an unchecked collector (the names can grow).
func (c *cmCollector) Describe(chan<- *prometheus.Desc) {}

func (c *cmCollector) Collect(ch chan<- prometheus.Metric) {
	counts := c.counters()
	if counts == nil {
		return
	}
	for name, d := range c.known {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(counts[name]))
	}
	for name, v := range counts {
		if c.known[name] == nil {
			ch <- prometheus.MustNewConstMetric(cmDesc(name), prometheus.CounterValue, float64(v))
		}
	}
}
