//go:build linux

package interop

import (
	"fmt"
	"strings"
	"time"
)

// perftest's rdma_cm mode (-R): no TCP at all. The control connection and the test QPs are
// both set up by rdma_cm on {port} (a CM service ID, not a TCP port), perftest's exchange runs
// as RC SENDs on the control connection, and the client is given the server's RoCE IPv4
// address. The cells reuse the perftest rows of Tools with "-R" in {args} (both sides).
//
// What the runner must do differently for them (IsRDMACMPerf reports it), see
// /work/helpers/perf-needs.md:
//   - readiness: there is no TCP listener to probe; wait for the server's
//     "Waiting for client to connect" line (both rxed and perftest print it once they listen),
//     or a fixed delay (the rxe lab waited 4 s);
//   - the serve cell: ServeRxed plus "--rdma-cm-port {port}" (TCP -p and the rdma_cm port live
//     in different spaces, so the TCP listener on the same number may stay).

// IsRDMACMPerf reports whether c is a perftest -R cell of rdmacmPerfCells.
func IsRDMACMPerf(c Cell) bool {
	return c.CM == nil && strings.Contains(" "+c.Args+" ", " -R ")
}

// ServeRxedRDMACM is ServeRxed with rxed serve's rdma_cm listener on the cell's port.
const ServeRxedRDMACM = ServeRxed + " --rdma-cm-port {port}"

// rdmacmPerfCells are the -R cells, both directions except serve (rxed server only), at
// MTU 1024 (rdma_cm takes the path MTU from the route: the guests' 1500-byte links give 1024).
func rdmacmPerfCells() []Cell {
	var cells []Cell
	for _, t := range []string{"write_bw", "read_bw", "send_bw"} {
		cells = append(cells, Cell{Name: fmt.Sprintf("%s_R/4096B", t), Tool: t, Size: 4096, Iters: bwIters(4096),
			MTU: 1024, Args: "-R", Timeout: 90 * time.Second})
	}
	cells = append(cells,
		Cell{Name: "write_lat_R/2B", Tool: "write_lat", Size: 2, Iters: 100, MTU: 1024, Args: "-R", Timeout: 90 * time.Second},
		// rxed serve --rdma-cm-port against ib_write_bw -R: two clients in a row, then SIGTERM,
		// the exported file checked as in the TCP serve cells (ServeRxedRDMACM).
		Cell{Name: "serve_R/write_bw", Tool: "write_bw", Size: 65536, Iters: 30, MTU: 1024, Args: "-R", Serve: true,
			Timeout: 90 * time.Second},
	)
	return cells
}
