package oob

import (
	"net"
	"time"
)

// A wait that Options.Timeout does not bound (an idle perftest server
// reading the client's key message after its whole run) is bounded by the
// connection's TCP keepalive instead. perftest's own sockets
// (perftest_communication.c: socket, connect or accept, then blocking
// read and write, no SO_KEEPALIVE, no SO_RCVTIMEO) wait for ever on a
// client whose host vanished; Go's default keepalive (15 s idle, then 9
// probes 15 s apart) ends that after about 2.5 minutes with "connection
// timed out", a bound nobody chose. Here the connection is probed after
// Options.KeepAlive of silence, then every second, and fails after
// Options.KeepAliveProbes unanswered probes: a bound an operator can
// compute from --timeout (keepAliveBound). A live peer's kernel answers
// the probes whatever its process does (a run of hours is not cut short);
// a process that died on a live host closes the connection itself (its
// kernel sends FIN or RST), so only a host that is gone, or cut off, is
// found this way.

const (
	// keepAliveInterval is the wait between probes (TCP_KEEPINTVL; the
	// kernel counts keepalive times in whole seconds).
	keepAliveInterval = time.Second
	// DefaultKeepAliveProbes is how many unanswered probes end the
	// connection when Options.KeepAliveProbes is zero.
	DefaultKeepAliveProbes = 5
)

// keepAlive is the keepalive of the exchange's connection; ok is false
// when Options.KeepAlive is negative (none of ours).
func (o *Options) keepAlive() (cfg net.KeepAliveConfig, ok bool) {
	idle := time.Duration(0)
	probes := 0
	if o != nil {
		idle, probes = o.KeepAlive, o.KeepAliveProbes
	}
	if idle < 0 {
		return net.KeepAliveConfig{}, false
	}
	if idle == 0 {
		idle = o.timeout()
		if idle <= 0 { // no per-step bound: the waits are still bounded
			idle = DefaultTimeout
		}
	}
	if probes <= 0 {
		probes = DefaultKeepAliveProbes
	}
	return net.KeepAliveConfig{Enable: true, Idle: max(idle, time.Second), Interval: keepAliveInterval, Count: probes}, true
}

// keepAliveBound is how long a silent peer can hold a wait: the idle
// time, then every probe unanswered.
func keepAliveBound(cfg net.KeepAliveConfig) time.Duration {
	return cfg.Idle + time.Duration(cfg.Count)*cfg.Interval
}

// setKeepAlive applies o's keepalive to c if it is a TCP connection (a
// test's net.Pipe has none), and bounds unacknowledged data by the same
// time where the system can (setUserTimeout): while data waits for its
// ACK the kernel sends no keepalive, and its retransmissions alone give
// up after some 15 minutes. It returns the bound, 0 if none was set.
func setKeepAlive(c net.Conn, o *Options) time.Duration {
	tc, isTCP := c.(*net.TCPConn)
	cfg, ok := o.keepAlive()
	if !isTCP || !ok {
		return 0
	}
	if err := tc.SetKeepAliveConfig(cfg); err != nil {
		o.logger().Debug("oob: TCP keepalive not set", "peer", c.RemoteAddr(), "err", err)
		return 0
	}
	bound := keepAliveBound(cfg)
	if err := setUserTimeout(tc, bound); err != nil {
		o.logger().Debug("oob: TCP_USER_TIMEOUT not set", "peer", c.RemoteAddr(), "err", err)
	}
	return bound
}
