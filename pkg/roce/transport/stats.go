package transport

import "sync/atomic"

// Stats counts what a Conn did. All fields are cumulative since the Conn was
// opened. Fields that do not apply to an implementation stay zero.
type Stats struct {
	SentPackets     uint64 // datagrams handed to the network by Send
	SentBytes       uint64 // their UDP payload bytes
	ReceivedPackets uint64 // datagrams returned by Receive
	ReceivedBytes   uint64 // their UDP payload bytes
	DropOversize    uint64 // received datagrams longer than the caller's buffer or the receive slot
	DropQueueFull   uint64 // MemNetwork: receiver queue full (like a full socket buffer)
	DropRcvbuf      uint64 // UDP on Linux: datagrams the kernel dropped because the socket's receive buffer was full (SO_RXQ_OVFL; learnt from the next datagram received)
	DropNoRoute     uint64 // MemNetwork: nobody listens on the destination
	GSOSends        uint64 // messages sent with UDP_SEGMENT (each carries several datagrams)
	GROReceives     uint64 // coalesced receives split by the UDP_GRO segment size
	// SendRefusedLate: datagrams a Faulty delayed or held back that its
	// inner Conn refused when they came due. No caller's Send returns
	// their refusal (the injector's timer sends them), so the engine adds
	// them to send_err from here.
	SendRefusedLate uint64
}

// StatsReporter is implemented by the Conns of this package that keep
// counters.
type StatsReporter interface {
	Stats() Stats
}

// counters is the lock-free form of Stats embedded in implementations.
type counters struct {
	sentPackets, sentBytes         atomic.Uint64
	receivedPackets, receivedBytes atomic.Uint64
	dropOversize, dropQueueFull    atomic.Uint64
	dropNoRoute, dropRcvbuf        atomic.Uint64
	gsoSends, groReceives          atomic.Uint64
}

func (c *counters) snapshot() Stats {
	return Stats{
		SentPackets:     c.sentPackets.Load(),
		SentBytes:       c.sentBytes.Load(),
		ReceivedPackets: c.receivedPackets.Load(),
		ReceivedBytes:   c.receivedBytes.Load(),
		DropOversize:    c.dropOversize.Load(),
		DropQueueFull:   c.dropQueueFull.Load(),
		DropRcvbuf:      c.dropRcvbuf.Load(),
		DropNoRoute:     c.dropNoRoute.Load(),
		GSOSends:        c.gsoSends.Load(),
		GROReceives:     c.groReceives.Load(),
	}
}
