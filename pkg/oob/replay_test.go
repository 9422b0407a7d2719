package oob

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// replayPeer plays one side of a recorded exchange over c: it writes what
// that side sent, segment by segment in capture order, reads what the other
// side sent and demands the same bytes, then expects the other side to
// close. It runs in its own goroutine, so it reports instead of failing.
func replayPeer(c net.Conn, events []tcpEvent, asClient bool) error {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	var off int
	for i, e := range events {
		if e.FromClient == asClient {
			if _, err := c.Write(e.Data); err != nil {
				return fmt.Errorf("event %d: write: %w", i, err)
			}
			continue
		}
		got := make([]byte, len(e.Data))
		if _, err := io.ReadFull(c, got); err != nil {
			return fmt.Errorf("event %d (stream offset %d): read %d bytes: %w", i, off, len(e.Data), err)
		}
		if !bytes.Equal(got, e.Data) {
			return fmt.Errorf("event %d (stream offset %d): got %q, capture has %q", i, off, got, e.Data)
		}
		off += len(got)
	}
	var one [1]byte
	if n, err := c.Read(one[:]); !errors.Is(err, io.EOF) {
		return fmt.Errorf("after the exchange: read %d bytes, %v; want EOF", n, err)
	}
	return nil
}

// replayClient dials address and replays the client side of events on the
// connection; the channel gets replayPeer's result.
func replayClient(address string, events []tcpEvent) <-chan error {
	done := make(chan error, 1)
	go func() {
		conn, err := net.Dial("tcp", address)
		if err != nil {
			done <- err
			return
		}
		done <- replayPeer(conn, events, true)
	}()
	return done
}

// replayServer listens on a free loopback port and replays the server side
// of events to the first connection; the channel gets replayPeer's result.
func replayServer(t *testing.T, events []tcpEvent) (net.Listener, <-chan error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			done <- err
			return
		}
		done <- replayPeer(conn, events, false)
	}()
	return ln, done
}

// TestReplayPerftest runs our server against the recorded client stream and
// our client against the recorded server stream of every perftest capture.
// Given the recorded side's own values, ours must send byte-identical data.
func TestReplayPerftest(t *testing.T) {
	for _, c := range captureCases(t) {
		if c.pingpong {
			continue
		}
		st := readOOBStreams(t, c.pcap)
		client := walkPerftest(t, st.ClientToServer, c.test)
		server := walkPerftest(t, st.ServerToClient, c.test)
		cfg := &SessionConfig{Options: Options{Timeout: 5 * time.Second}}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()

		run := func(t *testing.T, s *Session, me, peer perftestSide) {
			n, err := s.Negotiate(ctx, me.MTU)
			require.NoError(t, err)
			require.Equal(t, Negotiated{RemoteVersion: "6.06", SysData: me.Sys, MTU: me.MTU}, n)
			connected := false
			remotes, err := s.Connect(ctx, c.test, []Key{me.Key}, func(r []Key) error {
				require.Equal(t, []Key{peer.Key}, r)
				connected = true
				return nil
			})
			require.NoError(t, err)
			require.True(t, connected)
			require.Equal(t, []Key{peer.Key}, remotes)
			var my BWReport
			if me.Report != nil {
				my = *me.Report
			}
			rep, err := s.Finish(ctx, c.test, me.Key, my)
			require.NoError(t, err)
			if peer.Report != nil {
				require.Equal(t, math64bits(*peer.Report), math64bits(rep))
			}
		}

		t.Run(c.name+"/our_server", func(t *testing.T) {
			ln, err := ListenPerftest("127.0.0.1:0", cfg)
			require.NoError(t, err)
			defer ln.Close()
			done := replayClient(ln.Addr().String(), st.Events)
			s, err := ln.Accept(ctx)
			require.NoError(t, err)
			require.Equal(t, Server, s.Role())
			run(t, s, server, client)
			require.NoError(t, <-done)
		})
		t.Run(c.name+"/our_client", func(t *testing.T) {
			ln, done := replayServer(t, st.Events)
			defer ln.Close()
			s, err := DialPerftest(ctx, ln.Addr().String(), cfg)
			require.NoError(t, err)
			require.Equal(t, Client, s.Role())
			run(t, s, client, server)
			require.NoError(t, <-done)
		})
	}
}

// math64bits compares reports bit for bit (the server's report is
// uninitialised memory and may hold NaNs).
func math64bits(r BWReport) []byte { return AppendBWReport(nil, r, 8, true) }

func TestReplayPingpong(t *testing.T) {
	for _, c := range captureCases(t) {
		if !c.pingpong {
			continue
		}
		st := readOOBStreams(t, c.pcap)
		client, err := ParsePingpongDest(st.ClientToServer[:PingpongMsgLen])
		require.NoError(t, err)
		server, err := ParsePingpongDest(st.ServerToClient)
		require.NoError(t, err)
		opts := &Options{Timeout: 5 * time.Second}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()

		t.Run(c.name+"/our_server", func(t *testing.T) {
			ln, err := ListenPingpong("127.0.0.1:0", opts)
			require.NoError(t, err)
			defer ln.Close()
			done := replayClient(ln.Addr().String(), st.Events)
			got, err := ln.Exchange(ctx, server, func(r PingpongDest) error {
				require.Equal(t, client, r)
				return nil
			})
			require.NoError(t, err)
			require.Equal(t, client, got)
			require.NoError(t, <-done)
		})
		t.Run(c.name+"/our_client", func(t *testing.T) {
			ln, done := replayServer(t, st.Events)
			defer ln.Close()
			got, err := DialPingpong(ctx, ln.Addr().String(), client, nil, opts)
			require.NoError(t, err)
			require.Equal(t, server, got)
			require.NoError(t, <-done)
		})
	}
}
