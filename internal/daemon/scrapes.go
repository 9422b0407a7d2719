package daemon

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Scrapes and the device's end. A gather of the registry reads the
// device's counters and its CM's state; release closes the device only
// once no gather runs, and no gather reads anything afterwards.
//
// Why the gathers, not the HTTP handlers: http.Server.Shutdown gives up
// after its deadline without a way to wait for the handlers still
// running, and promhttp's Timeout runs the gather on a goroutine of its
// own that its handler leaves behind when it times out. So Run cannot
// join every handler, but it can fence what reads the device: release
// takes scrapeMu for writing, which waits for the gathers in progress
// (bounded: the collectors only read counters), and sets scrapesOff. A
// handler that outlives Run then serves an error and touches nothing.

// errStopped is what a gather returns once the daemon has stopped.
var errStopped = errors.New("the daemon has stopped")

// gather is the registry's Gather while the device is open.
func (d *Daemon) gather() ([]*dto.MetricFamily, error) {
	d.scrapeMu.RLock()
	defer d.scrapeMu.RUnlock()
	if d.scrapesOff || d.registry == nil {
		return nil, errStopped
	}
	if d.gathering != nil {
		d.gathering()
	}
	return d.registry.Gather()
}

// gatherer is gather for promhttp.
func (d *Daemon) gatherer() prometheus.Gatherer { return prometheus.GathererFunc(d.gather) }

// endScrapes waits for the gathers in progress and stops later ones from
// reading anything; release calls it before it closes the device.
func (d *Daemon) endScrapes() {
	if d.awaitingScrapes != nil {
		d.awaitingScrapes()
	}
	d.scrapeMu.Lock()
	d.scrapesOff = true
	d.scrapeMu.Unlock()
}
