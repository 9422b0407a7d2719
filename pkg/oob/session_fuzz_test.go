package oob

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// scriptConn is a net.Conn whose peer sent exactly in and then closed:
// reads return in and then io.EOF, writes are kept. It never blocks, so a
// server session over it runs to its end in one goroutine.
type scriptConn struct {
	in  *bytes.Reader
	out bytes.Buffer
}

func (c *scriptConn) Read(b []byte) (int, error)         { return c.in.Read(b) }
func (c *scriptConn) Write(b []byte) (int, error)        { return c.out.Write(b) }
func (c *scriptConn) Close() error                       { return nil }
func (c *scriptConn) LocalAddr() net.Addr                { return scriptAddr{} }
func (c *scriptConn) RemoteAddr() net.Addr               { return scriptAddr{} }
func (c *scriptConn) SetDeadline(time.Time) error        { return nil }
func (c *scriptConn) SetReadDeadline(t time.Time) error  { return nil }
func (c *scriptConn) SetWriteDeadline(t time.Time) error { return nil }

type scriptAddr struct{}

func (scriptAddr) Network() string { return "script" }
func (scriptAddr) String() string  { return "192.0.2.1:18515" }

// fuzzServerKey is what the scripted server announces.
var fuzzServerKey = Key{QPN: 0x12, PSN: 0x345, RKey: 0x6789, VAddr: 1 << 40, OutReads: 1}

// serveScript runs the server side of a write bandwidth session, as rxed
// serve does (the extension with a token or without, or plain perftest),
// against a client that sent in; it returns the first failed step's error
// and the session.
func serveScript(in []byte, mode byte) (*Session, error) {
	cfg := &SessionConfig{Options: Options{Timeout: time.Minute}}
	switch mode % 3 {
	case 1:
		cfg.Ext = &ExtConfig{}
	case 2:
		cfg.Ext = &ExtConfig{Token: []byte("s3cret")}
	}
	s := NewSession(&scriptConn{in: bytes.NewReader(in)}, Server, cfg)
	ctx := context.Background()
	t := Test{Verb: VerbWrite}
	if _, err := s.Negotiate(ctx, 3); err != nil {
		return s, err
	}
	if _, err := s.Answer(ctx, func(Key) (Key, error) { return fuzzServerKey, nil }); err != nil {
		return s, err
	}
	for range t.Barriers() {
		if _, err := s.HandShake(ctx, fuzzServerKey); err != nil {
			return s, err
		}
	}
	if s.Ext() {
		err := s.CheckAddress(ctx, func([16]byte) (Grant, ExtStatus) { return Grant{RKey: 1, VAddr: 2, Len: 3}, ExtOK })
		if err != nil {
			return s, err
		}
	}
	_, err := s.Finish(ctx, t, fuzzServerKey, BWReport{})
	return s, err
}

// clientTranscript records what a client session writes in a whole
// write bandwidth session against serveScript's flow, over loopback TCP
// (both ends write "done" before reading it: a net.Pipe would block).
func clientTranscript(t testing.TB, mode byte) []byte {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	a, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	defer a.Close()
	b, err := ln.Accept()
	require.NoError(t, err)
	defer b.Close()
	var rec bytes.Buffer
	ccfg := &SessionConfig{Options: Options{Timeout: 10 * time.Second}}
	scfg := &SessionConfig{Options: Options{Timeout: 10 * time.Second}}
	if mode%3 == 1 {
		ccfg.Ext, scfg.Ext = &ExtConfig{}, &ExtConfig{}
	}
	ctx := context.Background()
	test := Test{Verb: VerbWrite}
	done := make(chan error, 1)
	go func() {
		s := NewSession(b, Server, scfg)
		_, err := s.Negotiate(ctx, 3)
		if err == nil {
			_, err = s.Connect(ctx, test, []Key{fuzzServerKey}, nil)
		}
		if err == nil && s.Ext() {
			err = s.CheckAddress(ctx, func([16]byte) (Grant, ExtStatus) { return Grant{}, ExtOK })
		}
		if err == nil {
			_, err = s.Finish(ctx, test, fuzzServerKey, BWReport{})
		}
		done <- err
	}()
	c := NewSession(teeConn{a, &rec}, Client, ccfg)
	ck := Key{QPN: 0x22, PSN: 0x1, RKey: 0x99, VAddr: 4096, OutReads: 1}
	_, err = c.Negotiate(ctx, 3)
	if err == nil {
		_, err = c.Connect(ctx, test, []Key{ck}, nil)
	}
	if err == nil && c.Ext() {
		_, err = c.ProveAddress(ctx, [16]byte{})
	}
	if err == nil {
		_, err = c.Finish(ctx, test, ck, BWReport{Size: 65536, Iters: 5000, BWPeak: 1, BWAvg: 1, MsgRateAvg: 1})
	}
	require.NoError(t, err)
	require.NoError(t, <-done)
	return rec.Bytes()
}

// teeConn records what is written to a conn.
type teeConn struct {
	net.Conn
	rec *bytes.Buffer
}

func (c teeConn) Write(b []byte) (int, error) {
	c.rec.Write(b)
	return c.Conn.Write(b)
}

// TestServerSessionReplaysAClient: a client's recorded bytes, played to
// the scripted server, run the whole session (the fuzz target's seeds are
// these transcripts), and every shorter prefix fails with ErrClosed but
// the one without the final "done", which a peer may leave out.
func TestServerSessionReplaysAClient(t *testing.T) {
	for _, mode := range []byte{0, 1} {
		in := clientTranscript(t, mode)
		s, err := serveScript(in, mode)
		require.NoError(t, err, "mode %d", mode)
		require.Equal(t, int64(len(in)), s.BytesRead())
		for n := range len(in) {
			_, err := serveScript(in[:n], mode)
			if n == len(in)-len(PerftestDoneMsg) {
				require.NoError(t, err, "mode %d, without the done message", mode)
				continue
			}
			require.ErrorIs(t, err, ErrClosed, "mode %d, prefix %d of %d", mode, n, len(in))
		}
	}
}

// FuzzServerSession plays arbitrary bytes as a client's side of a perftest
// session to a server (plain, with the rxed extension, in token mode): it
// never panics, and each failure is one of the package's step errors with
// the cause a peer can produce (closed, malformed, an old version, a
// refusal), never a timeout or a bare error (the peer's bytes end in a
// close, so no step may wait). The server never reads past what the client
// sent, and a run that succeeds read every message.
func FuzzServerSession(f *testing.F) {
	for _, mode := range []byte{0, 1} {
		in := clientTranscript(f, mode)
		f.Add(mode, in)
		f.Add(mode+1, in)
	}
	f.Add(byte(0), []byte{})
	f.Fuzz(func(t *testing.T, mode byte, in []byte) {
		s, err := serveScript(in, mode)
		require.LessOrEqual(t, s.BytesRead(), int64(len(in)))
		if err == nil {
			return
		}
		var se *stepError
		require.True(t, errors.As(err, &se), "not a step error: %v", err)
		causes := []error{ErrClosed, ErrMalformed, ErrVersion, ErrRefused}
		n := 0
		for _, c := range causes {
			if errors.Is(err, c) {
				n++
			}
		}
		require.Equal(t, 1, n, "%v", err)
		require.NotErrorIs(t, err, io.EOF)
	})
}
