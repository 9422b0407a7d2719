package transport

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// ParseFaultSpec parses the fault description of rxed's --fault flag: a
// comma-separated list of key=value items, for example
//
//	loss=0.1,dup=0.05,reorder=0.05,corrupt=0.01,delay=1ms,seed=7
//
// Keys: loss, dup, reorder, corrupt (probabilities in [0,1], or percentages
// such as 10%); delay, jitter, hold (Go durations: base delay, uniform jitter,
// longest reorder hold); depth (datagrams that overtake a reordered one);
// seed (int64); dir (send, receive or recv, both); queue (receive queue
// length). An empty spec means no faults. Unknown or repeated keys, missing
// values and out-of-range values are errors.
func ParseFaultSpec(spec string) (FaultConfig, error) {
	var cfg FaultConfig
	spec = strings.TrimSpace(spec)
	if spec == "" {
		return cfg, nil
	}
	seen := make(map[string]bool)
	for item := range strings.SplitSeq(spec, ",") {
		key, val, ok := strings.Cut(strings.TrimSpace(item), "=")
		key, val = strings.ToLower(strings.TrimSpace(key)), strings.TrimSpace(val)
		if !ok || key == "" || val == "" {
			return FaultConfig{}, fmt.Errorf("transport: fault spec %q: item %q is not key=value", spec, item)
		}
		if seen[key] {
			return FaultConfig{}, fmt.Errorf("transport: fault spec %q: %s given twice", spec, key)
		}
		seen[key] = true
		var err error
		switch key {
		case "loss":
			cfg.Loss, err = parseProbability(val)
		case "dup":
			cfg.Dup, err = parseProbability(val)
		case "reorder":
			cfg.Reorder, err = parseProbability(val)
		case "corrupt":
			cfg.Corrupt, err = parseProbability(val)
		case "delay":
			cfg.Delay, err = time.ParseDuration(val)
		case "jitter":
			cfg.Jitter, err = time.ParseDuration(val)
		case "hold":
			cfg.ReorderHold, err = time.ParseDuration(val)
		case "depth":
			cfg.ReorderDepth, err = strconv.Atoi(val)
		case "queue":
			cfg.QueueLen, err = strconv.Atoi(val)
		case "seed":
			cfg.Seed, err = strconv.ParseInt(val, 10, 64)
		case "dir":
			switch strings.ToLower(val) {
			case "both":
				cfg.Direction = DirBoth
			case "send":
				cfg.Direction = DirSend
			case "receive", "recv":
				cfg.Direction = DirReceive
			default:
				err = fmt.Errorf("want send, receive or both")
			}
		default:
			return FaultConfig{}, fmt.Errorf("transport: fault spec %q: unknown key %q", spec, key)
		}
		if err != nil {
			return FaultConfig{}, fmt.Errorf("transport: fault spec %q: %s=%s: %w", spec, key, val, err)
		}
	}
	if err := cfg.Validate(); err != nil {
		return FaultConfig{}, err
	}
	return cfg, nil
}

func parseProbability(s string) (float64, error) {
	scale := 1.0
	if t, ok := strings.CutSuffix(s, "%"); ok {
		s, scale = t, 100
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, err
	}
	return v / scale, nil
}

// String formats the fields ParseFaultSpec understands (not DelayFunc or
// Clock), so that ParseFaultSpec(cfg.String()) gives cfg back.
func (c FaultConfig) String() string {
	var b strings.Builder
	add := func(k, v string) {
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(k)
		b.WriteByte('=')
		b.WriteString(v)
	}
	for _, p := range []struct {
		k string
		v float64
	}{{"loss", c.Loss}, {"dup", c.Dup}, {"reorder", c.Reorder}, {"corrupt", c.Corrupt}} {
		if p.v != 0 {
			add(p.k, strconv.FormatFloat(p.v, 'g', -1, 64))
		}
	}
	for _, p := range []struct {
		k string
		v time.Duration
	}{{"delay", c.Delay}, {"jitter", c.Jitter}, {"hold", c.ReorderHold}} {
		if p.v != 0 {
			add(p.k, p.v.String())
		}
	}
	if c.ReorderDepth != 0 {
		add("depth", strconv.Itoa(c.ReorderDepth))
	}
	if c.QueueLen != 0 {
		add("queue", strconv.Itoa(c.QueueLen))
	}
	if c.Seed != 0 {
		add("seed", strconv.FormatInt(c.Seed, 10))
	}
	if c.Direction != DirBoth {
		add("dir", c.Direction.String())
	}
	return b.String()
}
