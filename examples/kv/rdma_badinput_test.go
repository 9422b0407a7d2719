package kv

import (
	"context"
	"testing"
	"time"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/stretchr/testify/require"
)

// sendRaw sends msg as a request over c's connection and waits for the
// response, or for the failure of either completion.
func sendRaw(ctx context.Context, c *RDMAClient, msg []byte) (response, error) {
	copy(c.buf[c.offReq():], msg)
	if err := c.qp.PostRecv(ib.RecvWR{SGL: []ib.SGE{{Addr: c.mr.IOVA() + uint64(c.offResp()), Length: respHdrLen, LKey: c.mr.LKey()}}}); err != nil {
		return response{}, err
	}
	if err := c.qp.PostSend(ib.SendWR{Opcode: ib.WRSend, Flags: ib.SendSignaled,
		SGL: []ib.SGE{{Addr: c.mr.IOVA() + uint64(c.offReq()), Length: uint32(len(msg)), LKey: c.mr.LKey()}}}); err != nil {
		return response{}, err
	}
	if err := c.wait(ctx, 2, true); err != nil {
		return response{}, err
	}
	return parseResponseHdr(c.buf[c.offResp() : c.offResp()+respHdrLen])
}

// Garbage sent to the RDMA server's handler (a message shorter than a
// header, lengths that disagree with the message, an unknown op, a key
// too long) is answered with a refusal and the connection goes on; a SEND
// longer than the server's receive buffer fails that connection alone
// (the server's receive completes in error and it frees the connection:
// the client's error wraps ErrConnLost), and the server serves others.
func TestRDMAServerRefusesGarbage(t *testing.T) {
	r := newRig(t)
	ctx := ctxT(t)
	c := r.rdmaClient()
	require.NoError(t, c.Put(ctx, []byte("k"), []byte("v")))

	long := append(rawRequest(opPut, 5, 40, 1), make([]byte, 41)...)
	for _, tc := range []struct {
		name string
		msg  []byte
		want status
	}{
		{"short", []byte{1, 2, 3}, statusBadRequest},
		{"lengths beyond the message", rawRequest(opPut, 2, 5, 100), statusBadRequest},
		{"unknown op", append(rawRequest(99, 3, 1, 0), 'k'), statusBadRequest},
		{"key too long", long, statusBadKey},
		{"empty", nil, statusBadRequest},
	} {
		resp, err := sendRaw(ctx, c, tc.msg)
		require.NoError(t, err, tc.name)
		require.Equal(t, tc.want, resp.status, tc.name)
	}
	v, err := c.Get(ctx, []byte("k"))
	require.NoError(t, err, "the connection goes on")
	require.Equal(t, "v", string(v))
	require.NoError(t, c.Put(ctx, []byte("k"), []byte("w")))

	other := r.rdmaClient()
	require.Equal(t, 2, r.rdma.Conns())
	_, err = sendRaw(ctx, c, make([]byte, r.rdma.maxMsg()+1))
	require.ErrorIs(t, err, ErrConnLost, "a SEND over the server's receive buffer")
	require.Eventually(t, func() bool { return r.rdma.Conns() == 1 }, 20*time.Second, time.Millisecond, "the server freed that connection")
	v, err = other.Get(ctx, []byte("k"))
	require.NoError(t, err)
	require.Equal(t, "w", string(v))
	require.NoError(t, other.Put(ctx, []byte("k2"), []byte("x")), "the server's handler goes on")
}
