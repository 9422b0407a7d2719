package daemon

import (
	"fmt"
	"net/http"
	"sort"
	"strings"
)

// MetricPrefix starts every metric name the daemon serves.
const MetricPrefix = "rxed_"

// MetricName turns a counter name into a Prometheus metric name:
// MetricPrefix plus the name with every character outside [a-zA-Z0-9_]
// replaced by '_'.
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
	return b.String()
}

// Metrics renders the daemon's counters in Prometheus text format 0.0.4.
func (d *Daemon) Metrics() string {
	var b strings.Builder
	counters := d.dev.Counters()
	names := make([]string, 0, len(counters))
	for k := range counters {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		m := MetricName(k)
		fmt.Fprintf(&b, "# HELP %s Engine counter %s (rdma_rxe's name where rxe has one).\n# TYPE %s counter\n%s %d\n", m, k, m, m, counters[k])
	}
	gauge := func(name, help string, v int64) {
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s gauge\n%s %d\n", name, help, name, name, v)
	}
	counter := func(name, help string, v uint64) {
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s counter\n%s %d\n", name, help, name, name, v)
	}
	gauge("rxed_sessions_active", "perftest sessions in progress.", d.active.Load())
	counter("rxed_sessions_total", "perftest sessions accepted.", d.total.Load())
	counter("rxed_sessions_completed_total", "perftest sessions that ran to the end.", d.completed.Load())
	counter("rxed_sessions_failed_total", "perftest sessions that ended in an error.", d.failed.Load())
	counter("rxed_sessions_refused_busy_total", "clients refused at the session limit (global or per source).", d.refusedBusy.Load())
	counter("rxed_sessions_refused_address_total", "clients refused by the --allow list.", d.refusedAddr.Load())
	counter("rxed_sessions_refused_gid_total", "clients refused because the GID they announced is not theirs (unproved).", d.refusedGID.Load())
	counter("rxed_sessions_idle_reclaimed_total", "established sessions ended by the idle timeout.", d.reclaimed.Load())
	counter("rxed_sessions_handshake_timeouts_total", "exchanges that did not finish within the handshake timeout.", d.hsTimeouts.Load())
	if d.traffic != nil {
		counter("rxed_budget_drops_total", "datagrams not sent: a session's send budget (anti-amplification or --session-bytes) was spent.", d.traffic.budgetDrops.Load())
		counter("rxed_read_cap_drops_total", "RDMA READ requests dropped for asking more than --max-read.", d.traffic.readCapDrops.Load())
	}
	b.WriteString("# HELP rxed_export_bytes Size of each exported region.\n# TYPE rxed_export_bytes gauge\n")
	for _, e := range d.exports {
		fmt.Fprintf(&b, "rxed_export_bytes{export=%q,kind=%q} %d\n", e.Spec.Name, e.Spec.Kind.String(), e.MR.Len())
	}
	return b.String()
}

func (d *Daemon) serveMetrics(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	_, _ = w.Write([]byte(d.Metrics()))
}
