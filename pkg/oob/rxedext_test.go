package oob

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// extPair runs fn for a client and a server session over one net.Pipe
// and returns both errors.
func extPair(t *testing.T, ccfg, scfg *SessionConfig, client, server func(ctx context.Context, s *Session) error) (cerr, serr error) {
	t.Helper()
	a, b := net.Pipe()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cs := NewSession(a, Client, ccfg)
	ss := NewSession(b, Server, scfg)
	done := make(chan error, 1)
	go func() { done <- server(ctx, ss); ss.CloseWithoutExchange() }()
	cerr = client(ctx, cs)
	cs.CloseWithoutExchange()
	return cerr, <-done
}

func negotiate(ctx context.Context, s *Session) error {
	_, err := s.Negotiate(ctx, 3)
	return err
}

func TestExtNegotiation(t *testing.T) {
	opts := Options{Timeout: 5 * time.Second}
	plain := &SessionConfig{Options: opts}
	ext := &SessionConfig{Options: opts, Ext: &ExtConfig{}}
	for _, tc := range []struct {
		name           string
		client, server *SessionConfig
		on             bool
	}{
		{"both plain", plain, plain, false},
		{"rxed client, perftest server", ext, plain, false},
		{"perftest client, rxed server", plain, ext, false},
		{"both rxed", ext, ext, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var con, son bool
			cerr, serr := extPair(t, tc.client, tc.server,
				func(ctx context.Context, s *Session) error { err := negotiate(ctx, s); con = s.Ext(); return err },
				func(ctx context.Context, s *Session) error { err := negotiate(ctx, s); son = s.Ext(); return err })
			require.NoError(t, cerr)
			require.NoError(t, serr)
			require.Equal(t, tc.on, con)
			require.Equal(t, tc.on, son)
		})
	}
}

// TestExtServerAnswersPerftestLikePerftest: a perftest client sees the
// same version reply from an extension server as from a plain one.
func TestExtServerAnswersPerftestLikePerftest(t *testing.T) {
	a, b := net.Pipe()
	ss := NewSession(b, Server, &SessionConfig{Ext: &ExtConfig{}})
	go func() { _, _ = ss.ExchangeVersions(context.Background()) }()
	var v [VersionMsgLen]byte
	require.NoError(t, EncodeVersion(v[:], PerftestVersion))
	_, err := a.Write(v[:])
	require.NoError(t, err)
	var got [VersionMsgLen]byte
	_, err = a.Read(got[:])
	require.NoError(t, err)
	require.Equal(t, v, got)
	a.Close()
}

func TestExtRefuse(t *testing.T) {
	ext := &SessionConfig{Ext: &ExtConfig{}}
	for _, st := range []ExtStatus{ExtBusy, ExtRefused} {
		cerr, serr := extPair(t, ext, ext, negotiate, func(ctx context.Context, s *Session) error { return s.Refuse(ctx, st) })
		require.NoError(t, serr)
		require.Error(t, cerr)
		if st == ExtBusy {
			require.ErrorIs(t, cerr, ErrBusy)
			require.ErrorContains(t, cerr, "server busy")
		} else {
			require.ErrorIs(t, cerr, ErrRefused)
		}
	}
	// A perftest client only sees the connection closed.
	cerr, serr := extPair(t, &SessionConfig{}, ext, negotiate, func(ctx context.Context, s *Session) error { return s.Refuse(ctx, ExtBusy) })
	require.NoError(t, serr)
	require.ErrorIs(t, cerr, ErrClosed)
}

func TestExtToken(t *testing.T) {
	srv := &SessionConfig{Ext: &ExtConfig{Token: []byte("s3cret")}}
	for _, tc := range []struct {
		name   string
		client *SessionConfig
		cwant  error
		msg    string
	}{
		{"right token", &SessionConfig{Ext: &ExtConfig{Token: []byte("s3cret")}}, nil, ""},
		{"wrong token", &SessionConfig{Ext: &ExtConfig{Token: []byte("guess")}}, ErrRefused, "did not accept our token"},
		{"no token", &SessionConfig{Ext: &ExtConfig{}}, ErrRefused, "requires a token"},
		{"perftest client", &SessionConfig{}, ErrClosed, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var verified bool
			cerr, serr := extPair(t, tc.client, srv, negotiate,
				func(ctx context.Context, s *Session) error {
					err := negotiate(ctx, s)
					verified = s.TokenVerified()
					return err
				})
			if tc.cwant == nil {
				require.NoError(t, cerr)
				require.NoError(t, serr)
				require.True(t, verified)
				return
			}
			require.ErrorIs(t, cerr, tc.cwant)
			require.ErrorContains(t, cerr, tc.msg)
			require.Error(t, serr)
			require.False(t, verified)
		})
	}
	// A client with a token refuses a server that proves a different one.
	cerr, serr := extPair(t, &SessionConfig{Ext: &ExtConfig{Token: []byte("a")}}, &SessionConfig{Ext: &ExtConfig{Token: []byte("a")}},
		negotiate, func(ctx context.Context, s *Session) error {
			s.cfg.Ext = &ExtConfig{Token: []byte("b")}
			return negotiate(ctx, s)
		})
	require.Error(t, cerr)
	require.Error(t, serr)
}

func TestExtAddressProof(t *testing.T) {
	ext := &SessionConfig{Ext: &ExtConfig{}}
	nonce := [16]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}
	want := Grant{RKey: 0xdeadbeef, VAddr: 0x7f0000001000, Len: 64 << 10} // issue 15: the length travels too
	decide := func(n [16]byte) (Grant, ExtStatus) {
		if n != nonce {
			return Grant{}, ExtUnverifiedGID
		}
		return want, ExtOK
	}
	var got Grant
	cerr, serr := extPair(t, ext, ext,
		func(ctx context.Context, s *Session) (err error) { got, err = s.ProveAddress(ctx, nonce); return err },
		func(ctx context.Context, s *Session) error { return s.CheckAddress(ctx, decide) })
	require.NoError(t, cerr)
	require.NoError(t, serr)
	require.Equal(t, want, got)

	cerr, serr = extPair(t, ext, ext,
		func(ctx context.Context, s *Session) (err error) {
			got, err = s.ProveAddress(ctx, [16]byte{})
			return err
		},
		func(ctx context.Context, s *Session) error { return s.CheckAddress(ctx, decide) })
	require.ErrorIs(t, cerr, ErrRefused)
	require.ErrorContains(t, cerr, "verify that the announced GID")
	require.ErrorIs(t, serr, ErrRefused)
}

// TestAnswerRefusalWritesNothing: a reply that fails closes the
// connection without a key message (the client reads EOF, not a key).
func TestAnswerRefusalWritesNothing(t *testing.T) {
	boom := errors.New("no")
	cerr, serr := extPair(t, nil, nil,
		func(ctx context.Context, s *Session) error { _, err := s.HandShake(ctx, Key{QPN: 1}); return err },
		func(ctx context.Context, s *Session) error {
			k, err := s.Answer(ctx, func(k Key) (Key, error) { return Key{}, boom })
			if k.QPN != 1 {
				return errors.New("Answer did not return the client's key")
			}
			return err
		})
	require.ErrorIs(t, serr, boom)
	require.ErrorIs(t, cerr, ErrClosed)
}

// TestExtAnnouncedTest (issue 15): an rxed client announces its test in
// the version message; a server that does not run it refuses in the
// version reply, and the client's error says why (it used to read "sent
// 0 bytes" at the key message). A perftest server never sees the
// announcement (its bytes are past the version string's NUL).
func TestExtAnnouncedTest(t *testing.T) {
	opts := Options{Timeout: 5 * time.Second}
	bwOnly := func(seen *[]Test) func(Test) ExtStatus {
		return func(tt Test) ExtStatus {
			*seen = append(*seen, tt)
			if tt.Latency || tt.Verb == VerbSend {
				return ExtUnsupportedTest
			}
			return ExtOK
		}
	}
	for _, tc := range []struct {
		test    *Test
		refused bool
	}{
		{&Test{Verb: VerbWrite}, false},
		{&Test{Verb: VerbAtomic}, false},
		{&Test{Verb: VerbWrite, Latency: true}, true},
		{&Test{Verb: VerbSend}, true},
		{nil, false}, // an rxed client that announces nothing is served
	} {
		var seen []Test
		ccfg := &SessionConfig{Options: opts, Ext: &ExtConfig{Test: tc.test}}
		scfg := &SessionConfig{Options: opts, Ext: &ExtConfig{Serves: bwOnly(&seen)}}
		cerr, serr := extPair(t, ccfg, scfg, negotiate, negotiate)
		if tc.test == nil {
			require.Empty(t, seen)
		} else {
			require.Equal(t, []Test{*tc.test}, seen)
		}
		if !tc.refused {
			require.NoError(t, cerr, "%v", tc.test)
			require.NoError(t, serr, "%v", tc.test)
			continue
		}
		require.ErrorIs(t, cerr, ErrRefused, "%v", tc.test)
		require.ErrorContains(t, cerr, "does not run this test")
		require.ErrorIs(t, serr, ErrRefused)
	}
	// The announcement is invisible to a plain (perftest) server.
	cerr, serr := extPair(t, &SessionConfig{Options: opts, Ext: &ExtConfig{Test: &Test{Verb: VerbSend, Latency: true}}},
		&SessionConfig{Options: opts}, negotiate, negotiate)
	require.NoError(t, cerr)
	require.NoError(t, serr)
}

// TestPlainServerRefusesAnotherTest: a plain server that knows its test
// (SessionConfig.Test, rxed perf) refuses an rxed client that announces
// another at the version step, both ends naming the two tests; a client of
// the same test, a client that announces none and a perftest client get
// perftest's version reply byte for byte, and the extension stays off.
// Bug (newcomer walkthrough, item 6): a write server and a read client ran
// and reported RDMA_Write numbers.
func TestPlainServerRefusesAnotherTest(t *testing.T) {
	opts := Options{Timeout: 5 * time.Second}
	write, read, writeLat := Test{Verb: VerbWrite}, Test{Verb: VerbRead}, Test{Verb: VerbWrite, Latency: true}
	server := &SessionConfig{Options: opts, Test: &write}
	for _, client := range []*Test{&read, &writeLat} {
		cerr, serr := extPair(t, &SessionConfig{Options: opts, Ext: &ExtConfig{Test: client}}, server, negotiate, negotiate)
		require.ErrorIs(t, cerr, ErrRefused, "%v", client)
		require.ErrorContains(t, cerr, "refused the session: it runs ib_write_bw, we run "+client.String()+"; run the same test on both sides")
		require.ErrorIs(t, serr, ErrRefused)
		require.ErrorContains(t, serr, "runs "+client.String()+", this server ib_write_bw: refused the client")
	}
	for _, client := range []*SessionConfig{
		{Options: opts, Ext: &ExtConfig{Test: &write}}, // the same test
		{Options: opts, Ext: &ExtConfig{}},             // announces none
		{Options: opts},                                // perftest
	} {
		var con, son bool
		cerr, serr := extPair(t, client, server,
			func(ctx context.Context, s *Session) error { err := negotiate(ctx, s); con = s.Ext(); return err },
			func(ctx context.Context, s *Session) error { err := negotiate(ctx, s); son = s.Ext(); return err })
		require.NoError(t, cerr)
		require.NoError(t, serr)
		require.False(t, con)
		require.False(t, son)
	}

	// On the wire: a perftest client's version message gets the plain
	// version reply, as without Test.
	a, b := net.Pipe()
	defer a.Close()
	ss := NewSession(b, Server, &SessionConfig{Options: opts, Test: &read})
	go func() { _, _ = ss.ExchangeVersions(context.Background()); ss.CloseWithoutExchange() }()
	var msg, reply, want [VersionMsgLen]byte
	require.NoError(t, EncodeVersion(msg[:], "6.06"))
	require.NoError(t, EncodeVersion(want[:], PerftestVersion))
	_, err := a.Write(msg[:])
	require.NoError(t, err)
	_, err = io.ReadFull(a, reply[:])
	require.NoError(t, err)
	require.Equal(t, want, reply)
}

// TestOtherTestStatusWithoutTheServersTest: a refusal whose test byte is
// missing still reads as a clear refusal.
func TestOtherTestStatusWithoutTheServersTest(t *testing.T) {
	var reply [VersionMsgLen]byte
	putExt(reply[:], ExtOtherTest, 0)
	require.EqualError(t, otherTestError("p", reply[:], &Test{Verb: VerbRead}),
		"oob: peer p refused the session: the server runs another test (run the same test on both sides)")
}
