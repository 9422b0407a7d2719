package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"
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
	addr := fs.String("metrics", DefaultMetricsAddr, "the daemon's metrics `address` (host:port) or URL")
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
	url := *addr
	if !strings.Contains(url, "://") {
		url = "http://" + url + "/metrics"
	}
	m, err := fetchMetrics(url, *timeout)
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

// fetchMetrics reads a Prometheus text page and returns its unlabelled
// samples with the rxed_ prefix removed (labelled ones keep their labels).
func fetchMetrics(url string, timeout time.Duration) (map[string]uint64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("bad metrics address %q: %v", url, err)
	}
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

func parseMetrics(r io.Reader) (map[string]uint64, error) {
	m := map[string]uint64{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			return nil, fmt.Errorf("metrics line %q has no value", line)
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil || v < 0 {
			return nil, fmt.Errorf("metrics line %q: bad value", line)
		}
		m[strings.TrimPrefix(line[:i], "rxed_")] = uint64(v)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(m) == 0 {
		return nil, fmt.Errorf("the metrics page is empty (is this rxed?)")
	}
	return m, nil
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
