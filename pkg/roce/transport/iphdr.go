package transport

// Header lengths of the frames the pcap recorder synthesises (the IP and
// UDP headers themselves come from wire.Flow.PutHeaders: the ones the ICRC
// was computed over).
const (
	ethHeaderLen  = 14
	ipv4HeaderLen = 20
	ipv6HeaderLen = 40
	udpHeaderLen  = 8
)
