package main

import (
	"bytes"
	"os"
	"strings"
	"testing"
)

// TestDemo runs `rxed demo` end to end over loopback UDP and checks that
// every operation was verified and the exit status is 0.
func TestDemo(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"demo"}, &out, &errb); code != 0 {
		t.Fatalf("rxed demo exited %d\nstdout:\n%s\nstderr:\n%s", code, out.String(), errb.String())
	}
	for _, want := range []string{"RDMA WRITE", "RDMA READ", "SEND+IMM", "CMP_SWP", "FETCH_ADD", "all checks passed"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	if strings.Count(out.String(), "verified") != 5 {
		t.Errorf("want 5 verified operations:\n%s", out.String())
	}
}

// TestDemoBadAddress fails fast with a non-zero status.
func TestDemoBadAddress(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"demo", "--addr", "not-an-ip"}, &out, &errb); code == 0 {
		t.Fatal("demo with a bad address exited 0")
	}
	if code := run([]string{"demo", "--fault", "loss=2"}, &out, &errb); code == 0 {
		t.Fatal("demo with a bad fault spec exited 0")
	}
}

// TestDemoUnderFaults: the demo's checks still pass with lossy, corrupting
// engines (RC retransmits), and the pcap option writes a capture.
func TestDemoUnderFaults(t *testing.T) {
	var out, errb bytes.Buffer
	pcap := t.TempDir() + "/demo.pcap"
	code := run([]string{"demo", "--port", "0", "--fault", "loss=0.2,dup=0.1,reorder=0.1,corrupt=0.02,seed=7", "--pcap", pcap}, &out, &errb)
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, out.String(), errb.String())
	}
	if fi, err := os.Stat(pcap); err != nil || fi.Size() < 1000 {
		t.Fatalf("pcap: %v %v", fi, err)
	}
}
