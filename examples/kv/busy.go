package kv

import (
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/rxed/rxed/pkg/rdmacm"
	"github.com/rxed/rxed/pkg/wire/mad"
)

// ErrServerBusy is wrapped by the error of a client the server turned
// away at its connection cap (RDMAServerConfig.MaxConns,
// TCPServerConfig.MaxConns; rxed kv serve --max-conns): the server is up
// and refused this connection, which is not ErrConnLost (a crash, a
// restart, a dead network). The connection is gone; a later Reconnect may
// find room.
var ErrServerBusy = errors.New("server busy: too many clients")

// busyRejectReason is the private data of the RDMA server's REJ (reason
// 28, consumer defined, as rdma_reject sends) of a client over its cap: a
// client recognises the refusal by it. rdma_cm passes a REJ's private data
// to the consumer as it is (RDMA_CM_EVENT_REJECTED's private_data, zero
// padded to 148 bytes), so a librdmacm client sees the same text, and an
// older rxed server already sent it.
const busyRejectReason = "kv: too many clients"

// isBusyReject says whether err is the RDMA server's refusal of a client
// over its cap.
func isBusyReject(err error) bool {
	var rej *rdmacm.RejectError
	if !errors.As(err, &rej) || rej.Reason != mad.REJConsumerDefined {
		return false
	}
	d := rej.PrivateData
	for len(d) > 0 && d[len(d)-1] == 0 {
		d = d[:len(d)-1]
	}
	return string(d) == busyRejectReason
}

// busyResponse is what the TCP server writes on a connection over its cap
// before it closes it: one well-formed response header with statusBusy,
// no value, request ID 0 (the server has read no request; IDs start at 1
// on a fresh client). A client that knows statusBusy takes it as the
// answer to whatever it sent; an older one sees a response to request 0
// while it waited for its own and reports ErrConnLost, as it did when the
// server closed the connection without a word.
var busyResponse = appendResponse(nil, statusBusy, 0, nil)

// refuseBusy answers c, over the cap, with busyResponse and closes it, in
// the accept loop: no goroutine, no buffer (a flood of connections costs
// the accept loop only). The write of 12 bytes to a fresh socket does not
// block (an empty send buffer); the deadline bounds it anyway. If the
// client's request is already in c's receive buffer, the close resets the
// connection (tcp_close with unread data), but the response was queued
// before the reset and the client, which writes its request in one piece
// before it reads, reads it first (TestTCPServerBusyAnswerSurvivesAReset).
func refuseBusy(c net.Conn) {
	_ = c.SetWriteDeadline(time.Now().Add(busyWriteTime))
	_, _ = c.Write(busyResponse)
	_ = c.Close()
}

// busyWriteTime bounds refuseBusy's write.
const busyWriteTime = 100 * time.Millisecond

// busyError is the TCP client's ErrServerBusy, naming the server.
func busyError(addr string) error {
	return fmt.Errorf("kv: %s refused the connection: %w (its connection cap, MaxConns); reconnect later", addr, ErrServerBusy)
}
