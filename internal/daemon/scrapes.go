package daemon

import (
	"errors"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
)

// Scrapes and the device's end. A gather of the registry reads the
// device's counters and its CM's state; release closes the device only
// once no page is being made, and no page reads anything afterwards.
//
// Why the page, not the HTTP handler: http.Server.Shutdown gives up
// after its deadline without a way to wait for the handlers still
// running, and the page's timeout (http.TimeoutHandler, what promhttp's
// Timeout option is) makes it on a goroutine of its own, which the
// handler leaves behind when it times out or its client goes. So Run
// cannot join every handler, but it can fence what runs the daemon's
// code: the page (the gather, then the encoding and promhttp's error
// log) holds scrapeMu for reading, and release takes it for writing,
// which waits for the pages in progress (bounded: the collectors only
// read counters, and the page is written into TimeoutHandler's buffer,
// not to the network), and sets scrapesOff. A handler that outlives Run
// then answers 503 Service Unavailable ("the daemon has stopped") and
// touches nothing. The fence once held the
// gather only, and the encoding after it, logging each family it could
// not write to the daemon's logger, ran on after Run had returned.

// errStopped is what a gather returns once the daemon has stopped.
var errStopped = errors.New("the daemon has stopped")

// pageTimeout bounds the making of one page (promhttp's Timeout).
const pageTimeout = 10 * time.Second

// gather is the registry's Gather while the device is open, for
// Metrics.
func (d *Daemon) gather() ([]*dto.MetricFamily, error) {
	d.scrapeMu.RLock()
	defer d.scrapeMu.RUnlock()
	return d.gatherFenced()
}

// gatherFenced is gather for a caller that holds scrapeMu.
func (d *Daemon) gatherFenced() ([]*dto.MetricFamily, error) {
	if d.scrapesOff || d.registry == nil {
		return nil, errStopped
	}
	if d.gathering != nil {
		d.gathering()
	}
	return d.registry.Gather()
}

// pageHandler makes the page (GET or HEAD) inside the fence, within
// pageTimeout.
func (d *Daemon) pageHandler() http.Handler {
	page := promhttp.HandlerFor(prometheus.GathererFunc(d.gatherFenced), promhttp.HandlerOpts{
		ErrorLog:      slogPromLogger{d},
		ErrorHandling: promhttp.ContinueOnError,
	})
	fenced := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d.scrapeMu.RLock()
		defer d.scrapeMu.RUnlock()
		if d.scrapesOff {
			// A target shutting down, as a scraper expects it (promhttp
			// would answer the failed gather with a 500 and log it).
			http.Error(w, errStopped.Error(), http.StatusServiceUnavailable)
			return
		}
		page.ServeHTTP(w, r)
		if d.scraped != nil {
			d.scraped()
		}
	})
	return http.TimeoutHandler(fenced, pageTimeout, "Exceeded configured timeout of "+pageTimeout.String()+".\n")
}

// endScrapes waits for the pages in progress and stops later ones from
// reading anything; release calls it before it closes the device.
func (d *Daemon) endScrapes() {
	if !d.scrapeMu.TryLock() {
		// A page is being made (the hook's cue: only then is there
		// something to wait for).
		if d.awaitingScrapes != nil {
			d.awaitingScrapes()
		}
		d.scrapeMu.Lock()
	}
	d.scrapesOff = true
	d.scrapeMu.Unlock()
}
