package kv

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// The request/response messages, the same bytes in an RDMA SEND and on a
// TCP stream (where each message is preceded by nothing else: the header
// says how long the rest is).
//
//	request:  op u8 | keyLen u8 | 0 u16 | valLen u32 | id u32 | key | value
//	response: status u8 | 0 u8 u16   | valLen u32 | id u32 | value
const (
	reqHdrLen  = 12
	respHdrLen = 12
)

type op uint8

const (
	opGet    op = 1 // TCP only: over RDMA a GET is READs
	opPut    op = 2
	opDelete op = 3
	opStats  op = 4 // the server application's counters (Stats)
)

type status uint8

const (
	statusOK status = iota
	statusNotFound
	statusFull
	statusBadKey
	statusBadValue
	statusBadRequest
	// statusBusy is the TCP server's only message on a connection over
	// its cap (busy.go): never the answer to a request it read.
	statusBusy
)

var errBadRequest = errors.New("kv: malformed request")

func statusOf(err error) status {
	switch {
	case err == nil:
		return statusOK
	case errors.Is(err, ErrNotFound):
		return statusNotFound
	case errors.Is(err, ErrFull):
		return statusFull
	case errors.Is(err, ErrKeyLen):
		return statusBadKey
	case errors.Is(err, ErrValueLen):
		return statusBadValue
	}
	return statusBadRequest
}

func (s status) err() error {
	switch s {
	case statusOK:
		return nil
	case statusNotFound:
		return ErrNotFound
	case statusFull:
		return ErrFull
	case statusBadKey:
		return ErrKeyLen
	case statusBadValue:
		return ErrValueLen
	case statusBadRequest:
		return errBadRequest
	case statusBusy:
		return ErrServerBusy
	}
	return fmt.Errorf("kv: unknown status %d from the server", s)
}

// request is a parsed request; key and val alias the message.
type request struct {
	op       op
	id       uint32
	key, val []byte
}

func appendRequest(b []byte, o op, id uint32, key, val []byte) []byte {
	var h [reqHdrLen]byte
	h[0] = byte(o)
	h[1] = byte(len(key))
	putU32(h[4:], uint32(len(val)))
	putU32(h[8:], id)
	b = append(b, h[:]...)
	b = append(b, key...)
	return append(b, val...)
}

// reqBodyLen reads the length of what follows a request header.
func reqBodyLen(h []byte) int { return int(h[1]) + int(binary.LittleEndian.Uint32(h[4:])) }

func parseRequest(b []byte) (request, error) {
	if len(b) < reqHdrLen {
		return request{}, errBadRequest
	}
	kl, vl := int(b[1]), int(binary.LittleEndian.Uint32(b[4:]))
	if len(b) != reqHdrLen+kl+vl {
		return request{}, errBadRequest
	}
	return request{op: op(b[0]), id: binary.LittleEndian.Uint32(b[8:]),
		key: b[reqHdrLen : reqHdrLen+kl], val: b[reqHdrLen+kl:]}, nil
}

func appendResponse(b []byte, s status, id uint32, val []byte) []byte {
	var h [respHdrLen]byte
	h[0] = byte(s)
	putU32(h[4:], uint32(len(val)))
	putU32(h[8:], id)
	b = append(b, h[:]...)
	return append(b, val...)
}

// response is a parsed response header.
type response struct {
	status status
	valLen int
	id     uint32
}

func parseResponseHdr(b []byte) (response, error) {
	if len(b) < respHdrLen {
		return response{}, errors.New("kv: short response from the server")
	}
	return response{status: status(b[0]), valLen: int(binary.LittleEndian.Uint32(b[4:])), id: binary.LittleEndian.Uint32(b[8:])}, nil
}

func putU32(b []byte, v uint32) { binary.LittleEndian.PutUint32(b, v) }
func putU64(b []byte, v uint64) { binary.LittleEndian.PutUint64(b, v) }
