package kv

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// rawRequest is a request header naming keyLen and valLen, whatever
// follows it.
func rawRequest(o op, id uint32, keyLen uint8, valLen uint32) []byte {
	h := make([]byte, reqHdrLen)
	h[0], h[1] = byte(o), keyLen
	putU32(h[4:], valLen)
	putU32(h[8:], id)
	return h
}

// readResponse reads one response (header and value) within 10 s.
func readResponse(t *testing.T, c net.Conn, r *bufio.Reader) (response, []byte) {
	t.Helper()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(10*time.Second)))
	var h [respHdrLen]byte
	_, err := io.ReadFull(r, h[:])
	require.NoError(t, err, "the server answers")
	resp, err := parseResponseHdr(h[:])
	require.NoError(t, err)
	v := make([]byte, resp.valLen)
	_, err = io.ReadFull(r, v)
	require.NoError(t, err)
	return resp, v
}

// A request longer than the server's largest message (a value longer
// than the extent, a key longer than MaxKey) is refused with the status
// that says why, and the connection goes on: the server reads the body
// past and answers. One whose header claims more than a server would
// ever read past (up to 4 GiB) is answered, then the connection is
// closed; nothing is allocated for it. Bug (workload audit): the server
// dropped the connection without a word, so a TCP client's PUT of a
// value one byte too long failed with "connection lost (server closed,
// restarted or unreachable)" and had to reconnect.
func TestTCPServerRefusesOversizedRequests(t *testing.T) {
	r := newRig(t)
	ctx := ctxT(t)

	// Through the client: ErrValueLen, and the same client goes on (one
	// byte over the extent is within the largest message, which has room
	// for a key of MaxKey; 100 over is not).
	cl := r.tcpClient()
	require.ErrorIs(t, cl.Put(ctx, []byte("k"), make([]byte, testTable.ExtentSize+1)), ErrValueLen)
	require.ErrorIs(t, cl.Put(ctx, []byte("k"), make([]byte, testTable.ExtentSize+100)), ErrValueLen)
	require.NoError(t, cl.Put(ctx, []byte("k"), []byte("v")))
	v, err := cl.Get(ctx, []byte("k"))
	require.NoError(t, err)
	require.Equal(t, "v", string(v))

	c, err := net.Dial("tcp", r.tcpAddr)
	require.NoError(t, err)
	defer c.Close()
	br := bufio.NewReader(c)
	over := uint32(testTable.ExtentSize + 100)
	_, err = c.Write(append(append(rawRequest(opPut, 7, 1, over), 'k'), make([]byte, over)...))
	require.NoError(t, err)
	resp, _ := readResponse(t, c, br)
	require.Equal(t, statusBadValue, resp.status)
	require.Equal(t, uint32(7), resp.id)

	_, err = c.Write(append(append(rawRequest(opPut, 8, 200, 400), bytes.Repeat([]byte("k"), 200)...), make([]byte, 400)...))
	require.NoError(t, err)
	resp, _ = readResponse(t, c, br)
	require.Equal(t, statusBadKey, resp.status)
	require.Equal(t, uint32(8), resp.id)

	// The connection still serves.
	_, err = c.Write(append(rawRequest(opGet, 9, 1, 0), 'k'))
	require.NoError(t, err)
	resp, v = readResponse(t, c, br)
	require.Equal(t, statusOK, resp.status)
	require.Equal(t, "v", string(v))

	// A header claiming 4 GiB: answered, then closed.
	_, err = c.Write(rawRequest(opPut, 10, 1, 0xFFFFFFFF))
	require.NoError(t, err)
	resp, _ = readResponse(t, c, br)
	require.Equal(t, statusBadValue, resp.status)
	require.Equal(t, uint32(10), resp.id)
	_, err = br.ReadByte()
	require.ErrorIs(t, err, io.EOF, "the server closed the connection")
}
