package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/rxed/rxed/internal/daemon"
)

func init() {
	register(&command{
		name:    "stat",
		summary: "show the counters of a running rxed serve (from its /metrics)",
		run:     runStat,
	})
}

// DefaultMetricsAddr is where `rxed stat` looks by default, the address
// the shipped systemd unit gives `rxed serve --metrics`.
const DefaultMetricsAddr = "127.0.0.1:9479"

func runStat(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("stat", flag.ContinueOnError)
	addr := fs.String("metrics", DefaultMetricsAddr, "the daemon's metrics `address` (host:port, host:port/path) or URL")
	asJSON := fs.Bool("json", false, "print {\"counter\": value} JSON")
	all := fs.Bool("all", false, "also show counters that are zero")
	timeout := fs.Duration("timeout", 5*time.Second, "give up after this `duration`")
	rest, code, ok := parseArgs(fs, args, stderr)
	if !ok {
		return code
	}
	if len(rest) > 0 {
		fmt.Fprintf(stderr, "rxed stat: unexpected argument %q\n", rest[0])
		return 2
	}
	m, err := fetchMetrics(metricsURL(*addr), *timeout)
	if err != nil {
		return fail(stderr, "stat", err)
	}
	names := make([]string, 0, len(m))
	for k, v := range m {
		if v != 0 || *all {
			names = append(names, k)
		}
	}
	sort.Strings(names)
	if *asJSON {
		out := make(map[string]uint64, len(names))
		for _, k := range names {
			out[k] = m[k]
		}
		b, _ := json.MarshalIndent(out, "", "  ")
		fmt.Fprintf(stdout, "%s\n", b)
		return 0
	}
	width := 0
	for _, k := range names {
		width = max(width, len(k))
	}
	for _, k := range names {
		fmt.Fprintf(stdout, "%-*s %d\n", width, k, m[k])
	}
	return 0
}

// fetchMetrics reads the daemon's Prometheus text page (statValues).
func fetchMetrics(url string, timeout time.Duration) (map[string]uint64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("bad metrics address %q: %v", url, err)
	}
	// The classic text format, which the parser reads (not OpenMetrics).
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("no daemon answering at %s: %v", url, rootCause(err))
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s answered %s", url, resp.Status)
	}
	return parseMetrics(resp.Body)
}

// parseMetrics reads a Prometheus text page and returns the daemon's
// values by the names `rxed stat` prints: a counter rxed_C_total as C
// (rdma_rxe's name for the engine's, daemon.CounterName; so the IB CM's
// rxed_cm_C_total as cm_C, which sorts them together), a gauge
// without the rxed_ prefix, a histogram as its observation count
// (NAME_count). Labelled samples keep their labels, as
// name{label="value"}. The process_ and go_ collectors' metrics are not
// the daemon's counters and are left out.
func parseMetrics(r io.Reader) (map[string]uint64, error) {
	p := expfmt.NewTextParser(model.LegacyValidation)
	mfs, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("not a Prometheus metrics page: %v", err)
	}
	m := map[string]uint64{}
	for name, mf := range mfs {
		if !strings.HasPrefix(name, daemon.MetricPrefix) {
			continue
		}
		short := strings.TrimPrefix(name, daemon.MetricPrefix)
		for _, s := range mf.GetMetric() {
			var v float64
			key := short
			switch mf.GetType() {
			case dto.MetricType_COUNTER:
				key, _ = daemon.CounterName(name)
				v = s.GetCounter().GetValue()
			case dto.MetricType_GAUGE:
				v = s.GetGauge().GetValue()
			case dto.MetricType_HISTOGRAM:
				key += "_count"
				v = float64(s.GetHistogram().GetSampleCount())
			case dto.MetricType_UNTYPED:
				v = s.GetUntyped().GetValue()
			default:
				continue
			}
			if v < 0 || math.IsNaN(v) || math.IsInf(v, 0) {
				return nil, fmt.Errorf("metric %s: bad value %v", name, v)
			}
			m[key+labelString(s.GetLabel())] = uint64(v)
		}
	}
	if len(m) == 0 {
		return nil, fmt.Errorf("the metrics page has no rxed_ metric (is this rxed?)")
	}
	return m, nil
}

// labelString renders labels as the text format does: {a="x",b="y"},
// sorted by name; "" when there are none.
func labelString(ls []*dto.LabelPair) string {
	if len(ls) == 0 {
		return ""
	}
	parts := make([]string, len(ls))
	for i, l := range ls {
		parts[i] = l.GetName() + "=" + strconv.Quote(l.GetValue())
	}
	sort.Strings(parts)
	return "{" + strings.Join(parts, ",") + "}"
}

// rootCause drops the URL-and-operation wrappers of net/http errors.
func rootCause(err error) error {
	for {
		u, ok := err.(interface{ Unwrap() error })
		if !ok || u.Unwrap() == nil {
			return err
		}
		err = u.Unwrap()
	}
}

// metricsURL is the page --metrics names: a host:port is its /metrics
// over HTTP; a URL, or a host:port/path without a scheme (HTTP), is
// taken as given, except that one with no path (or "/") means its
// /metrics too, as Prometheus's scrape target does.
func metricsURL(addr string) string {
	scheme, rest, ok := strings.Cut(addr, "://")
	if !ok {
		scheme, rest = "http", addr
	}
	if host := strings.TrimSuffix(rest, "/"); !strings.Contains(host, "/") {
		return scheme + "://" + host + "/metrics"
	}
	return scheme + "://" + rest
}
