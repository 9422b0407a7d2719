package oob

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
)

// The rxed extension of perftest's exchange.
//
// perftest's exchange has no room for a refusal, a credential or a proof
// that the GID a client announces is its own, and rxed serve needs all
// three (a client that announces someone else's GID turns the daemon into
// a reflector). The extension lives where perftest does not look:
//
//   - The 16-byte version message is a C string; perftest reads it with
//     atof up to the NUL and never looks at the padding. An rxed end that
//     speaks the extension puts extMagic at byte extOff of its version
//     message, then the extension version, a status and flags. A perftest
//     peer ignores it and sends zeros there, so each side knows whether the
//     other speaks it, and a server can answer "busy" or "refused" to an
//     rxed client in the version reply (a perftest client just sees the
//     connection closed). An rxed client also announces its test (verb,
//     latency or bandwidth) in the trailer's last byte, so a server that
//     does not run that test refuses it here, with the reason, rather than
//     at a later step the client cannot interpret. A plain server that
//     knows its test (SessionConfig.Test, rxed perf) refuses a client of
//     another test the same way (ExtOtherTest, its own test in the same
//     byte) and answers every other client as perftest does.
//   - Token mode: when the server's version reply sets extFlagToken, both
//     sides exchange two more messages right after the versions (before the
//     system data): hello (a nonce each way), then auth (HMAC-SHA256 of the
//     shared token over both nonces each way), so a passive observer of one
//     exchange cannot replay it and the client knows the server holds the
//     token too.
//   - Address proof: after the barriers (both sides' QPs are connected),
//     an rxed client sends the 16-byte nonce the server RDMA-WROTE into its
//     buffer over RoCE (zeros when the server sent none), and the server
//     answers with a grant carrying the export's rkey and address, which it
//     left out of the key messages until then, and the export's length,
//     which a client checks its message size against. A client that
//     cannot read what was sent to the GID it announced never learns the
//     rkey.
//
// Both ends must enable it (SessionConfig.Ext); otherwise nothing changes
// on the wire.
const (
	extOff       = 8 // where the extension starts in the version message
	extMagic     = "RXED"
	extVersion   = 1
	extFlagToken = 1 << 0 // client: holds a token; server: requires one

	// Message sizes of the extension's own exchanges.
	ExtHelloLen = 32 // magic "RXEH", 12 reserved, 16-byte nonce
	ExtAuthLen  = 40 // magic "RXEA", status, 3 reserved, 32-byte HMAC
	ExtProofLen = 32 // magic "RXEP", 12 reserved, 16-byte nonce
	ExtGrantLen = 32 // magic "RXEG", status, 3 reserved, rkey u32 BE, 4 reserved, vaddr u64 BE, length u64 BE (0: not said)
)

// ExtStatus is the outcome a server announces in the extension.
type ExtStatus uint8

// Extension statuses.
const (
	ExtOK ExtStatus = iota
	// ExtBusy: every session slot (or every slot of the client's address)
	// is taken; try again later.
	ExtBusy
	// ExtRefused: the server does not serve this client (address not
	// allowed, token missing or wrong, unverified GID).
	ExtRefused
	// ExtTokenRequired: the server runs in token mode and the client
	// announced no token.
	ExtTokenRequired
	// ExtBadToken: the client's token proof did not verify.
	ExtBadToken
	// ExtUnverifiedGID: the client did not echo the nonce sent to the GID
	// it announced.
	ExtUnverifiedGID
	// ExtUnsupportedTest: the server does not run the test the client
	// announced (rxed serve answers bandwidth WRITE, READ and atomic
	// clients only).
	ExtUnsupportedTest
	// ExtReadOnlyExport: the client announced a WRITE or atomic test and
	// the server's export is read-only.
	ExtReadOnlyExport
	// ExtOtherTest: the server (rxed perf, SessionConfig.Test) runs
	// another test than the client announced; the reply's test byte says
	// which (see checkTest).
	ExtOtherTest
)

func (s ExtStatus) String() string {
	switch s {
	case ExtOK:
		return "ok"
	case ExtBusy:
		return "server busy"
	case ExtRefused:
		return "refused"
	case ExtTokenRequired:
		return "the server requires a token (--token or --token-file)"
	case ExtBadToken:
		return "the server did not accept our token"
	case ExtUnverifiedGID:
		return "the server could not verify that the announced GID is ours (it sent a nonce over RoCE to it)"
	case ExtReadOnlyExport:
		return "the server's export is read-only (run a read test)"
	case ExtOtherTest:
		return "the server runs another test (run the same test on both sides)"
	case ExtUnsupportedTest:
		return "the server does not run this test (rxed serve answers write, read and atomic bandwidth clients; run rxed perf as the server for latency and send tests)"
	}
	return fmt.Sprintf("status %d", uint8(s))
}

// ErrBusy: the server refused the session because it is at its session
// limit.
var ErrBusy = errors.New("server busy")

// ErrRefused: the server refused the session for another reason (see the
// message).
var ErrRefused = errors.New("refused by the server")

// ExtConfig enables the rxed extension (see above).
type ExtConfig struct {
	// Token is the shared secret: a client proves it holds it, a server
	// with a token refuses clients that do not. Empty: no token.
	Token []byte
	// Test is what a client runs, announced in its version message (nil:
	// not announced). Servers ignore it.
	Test *Test
	// Serves is a server's verdict on the test a client announced: ExtOK
	// serves it, another status refuses the client in the version reply.
	// nil (or a client that announced none) serves every test.
	Serves func(Test) ExtStatus
}

// extState is what the extension negotiated.
type extState struct {
	on     bool // both sides speak it
	tokens bool // token mode ran and verified
	nonceC [16]byte
	nonceS [16]byte
}

// Ext reports whether both sides speak the rxed extension (known after
// ExchangeVersions).
func (s *Session) Ext() bool { return s.ext.on }

// TokenVerified reports whether the peer proved it holds the token.
func (s *Session) TokenVerified() bool { return s.ext.tokens }

// putExt writes the extension trailer into a version message.
func putExt(b []byte, st ExtStatus, flags byte) {
	copy(b[extOff:], extMagic)
	b[extOff+4] = extVersion
	b[extOff+5] = byte(st)
	b[extOff+6] = flags
}

// parseExt reads the trailer of a peer's version message; ok is false
// when the peer does not speak the extension.
func parseExt(b []byte) (st ExtStatus, flags byte, ok bool) {
	if len(b) < extOff+7 || string(b[extOff:extOff+4]) != extMagic || b[extOff+4] != extVersion {
		return 0, 0, false
	}
	return ExtStatus(b[extOff+5]), b[extOff+6], true
}

// The trailer's last byte: a client's test, extTestSet|verb|extTestLat
// (0: none announced, as from a perftest peer or an older rxed).
const (
	extTestOff = extOff + 7
	extTestSet = 1 << 7
	extTestLat = 1 << 2
)

func putExtTest(b []byte, t Test) {
	v := extTestSet | byte(t.Verb&3)
	if t.Latency {
		v |= extTestLat
	}
	b[extTestOff] = v
}

// parseExtTest reads the test a client announced in its trailer.
func parseExtTest(b []byte) (Test, bool) {
	if len(b) <= extTestOff || b[extTestOff]&extTestSet == 0 {
		return Test{}, false
	}
	v := b[extTestOff]
	return Test{Verb: Verb(v & 3), Latency: v&extTestLat != 0}, true
}

// extVersionMsg encodes our version message, with the trailer when the
// extension is on.
func (s *Session) versionMsg(out []byte, st ExtStatus, flags byte) error {
	if err := EncodeVersion(out, s.cfg.version()); err != nil {
		return err
	}
	if s.cfg.Ext != nil {
		if len(s.cfg.version()) >= extOff {
			return fmt.Errorf("oob: version %q leaves no room for the rxed extension", s.cfg.version())
		}
		putExt(out, st, flags)
		if s.role == Client && s.cfg.Ext.Test != nil {
			putExtTest(out, *s.cfg.Ext.Test)
		}
	}
	return nil
}

// extClientVersions is ExchangeVersions' tail on an extension client: the
// server's trailer says whether it speaks the extension, and may refuse.
func (s *Session) extClientVersions(ctx context.Context, in []byte) error {
	st, flags, ok := parseExt(in)
	if !ok {
		return nil
	}
	s.ext.on = true
	switch {
	case st == ExtBusy:
		return s.fail(errorf(s.s.peer, ErrBusy, "refused the session: server busy (every session slot is taken; try again later)"))
	case st == ExtOtherTest:
		return s.fail(otherTestError(s.s.peer, in, s.cfg.Ext.Test))
	case st != ExtOK:
		return s.fail(errorf(s.s.peer, ErrRefused, "refused the session: %v", st))
	case flags&extFlagToken != 0:
		return s.tokenExchange(ctx)
	}
	return nil
}

// extServerVersions is ExchangeVersions on an extension server: it reads
// the client's version, answers with the trailer (refusing a client with
// no token in token mode) and runs the token exchange.
func (s *Session) extServerVersions(ctx context.Context) ([]byte, error) {
	var in, out [VersionMsgLen]byte
	if err := s.s.readMsg(ctx, in[:], "perftest version", true); err != nil {
		return nil, s.fail(err)
	}
	_, cflags, ok := parseExt(in[:])
	tokenMode := len(s.cfg.Ext.Token) > 0
	st, flags := ExtOK, byte(0)
	if tokenMode {
		flags = extFlagToken
		if ok && cflags&extFlagToken == 0 {
			st = ExtTokenRequired
		}
	}
	if t, announced := parseExtTest(in[:]); ok && announced && st == ExtOK && s.cfg.Ext.Serves != nil {
		st = s.cfg.Ext.Serves(t)
	}
	if !ok {
		if tokenMode {
			// A perftest client cannot send a token: close before anything
			// else is said.
			return nil, s.fail(errorf(s.s.peer, ErrRefused, "is not an rxed client and the server runs in token mode (perftest clients cannot send a token)"))
		}
		// A perftest client: answer like perftest, no trailer.
		if err := EncodeVersion(out[:], s.cfg.version()); err != nil {
			return nil, err
		}
	} else if err := s.versionMsg(out[:], st, flags); err != nil {
		return nil, err
	}
	if err := s.s.writeMsg(ctx, out[:], "perftest version"); err != nil {
		return nil, s.fail(err)
	}
	if !ok {
		return in[:], nil
	}
	s.ext.on = true
	if st != ExtOK {
		return nil, s.fail(errorf(s.s.peer, ErrRefused, "was refused: %v", st))
	}
	if tokenMode {
		if err := s.tokenExchange(ctx); err != nil {
			return nil, err
		}
	}
	return in[:], nil
}

// Refuse answers a client the server will not serve: it reads the
// client's version message (bounded by the step timeout), answers an rxed
// client with st in the extension trailer, and closes. A perftest client
// only sees the connection closed.
func (s *Session) Refuse(ctx context.Context, st ExtStatus) error {
	defer s.s.close()
	var in, out [VersionMsgLen]byte
	if err := s.s.readMsg(ctx, in[:], "perftest version", true); err != nil {
		return err
	}
	if _, _, ok := parseExt(in[:]); !ok || s.cfg.Ext == nil {
		return nil
	}
	if err := s.versionMsg(out[:], st, 0); err != nil {
		return err
	}
	return s.s.writeMsg(ctx, out[:], "perftest version")
}

// checkTest is the version step of a plain server that knows its test
// (SessionConfig.Test, rxed perf): it reads the client's version message
// and answers as perftest does, unless the client is an rxed client that
// announced another test. That one gets a reply whose trailer says
// ExtOtherTest and, in the test byte a client's trailer uses, the
// server's test; both ends then fail with an error naming both tests,
// where they ran (perftest does so) and reported numbers for a test the
// client did not ask for. A perftest client announces nothing and sees
// nothing new; neither does a client of the same test (no trailer: the
// extension stays off, as with perftest).
func (s *Session) checkTest(ctx context.Context) ([]byte, error) {
	var in, out [VersionMsgLen]byte
	if err := s.s.readMsg(ctx, in[:], "perftest version", true); err != nil {
		return nil, s.fail(err)
	}
	if err := EncodeVersion(out[:], s.cfg.version()); err != nil {
		return nil, err
	}
	theirs, announced := AnnouncedTest(in[:])
	mine := *s.cfg.Test
	if !announced || theirs == mine {
		if err := s.s.writeMsg(ctx, out[:], "perftest version"); err != nil {
			return nil, s.fail(err)
		}
		return in[:], nil
	}
	PutOtherTest(out[:], mine)
	if err := s.s.writeMsg(ctx, out[:], "perftest version"); err != nil {
		return nil, s.fail(err)
	}
	return nil, s.fail(errorf(s.s.peer, ErrRefused, "runs %s, this server %s: refused the client; run the same test on both sides",
		theirs, mine))
}

// AnnounceTest puts the rxed trailer announcing t into msg, a version
// message from EncodeVersion, as an rxed client's (past the NUL, where
// perftest does not look): for exchanges other than a Session's, such
// as perf -R's control connection.
func AnnounceTest(msg []byte, t Test) {
	putExt(msg, ExtOK, 0)
	putExtTest(msg, t)
}

// AnnouncedTest is the test an rxed client announced in its version
// message msg; false for a perftest client or one that announced none.
func AnnouncedTest(msg []byte) (Test, bool) {
	if _, _, ok := parseExt(msg); !ok {
		return Test{}, false
	}
	return parseExtTest(msg)
}

// PutOtherTest makes reply, the server's version message, refuse a
// client whose announced test is not mine (ExtOtherTest, mine in the
// test byte), as a Session with SessionConfig.Test does.
func PutOtherTest(reply []byte, mine Test) {
	putExt(reply, ExtOtherTest, 0)
	putExtTest(reply, mine)
}

// OtherTest reads a server's version reply: refused is true when the
// server refused our test as not its own, and known when it said which
// it runs (theirs).
func OtherTest(reply []byte) (theirs Test, known, refused bool) {
	st, _, ok := parseExt(reply)
	if !ok || st != ExtOtherTest {
		return Test{}, false, false
	}
	theirs, known = parseExtTest(reply)
	return theirs, known, true
}

// otherTestError is a client's error for ExtOtherTest: the server's test
// from the reply's test byte, and ours.
func otherTestError(peer string, reply []byte, ours *Test) error {
	theirs, ok, _ := OtherTest(reply)
	if !ok || ours == nil {
		return errorf(peer, ErrRefused, "refused the session: %v", ExtOtherTest)
	}
	return errorf(peer, ErrRefused, "refused the session: it runs %s, we run %s; run the same test on both sides",
		theirs, *ours)
}

// tokenMAC is HMAC-SHA256(token, label || first || second).
func tokenMAC(token []byte, label string, first, second [16]byte) []byte {
	m := hmac.New(sha256.New, token)
	m.Write([]byte(label))
	m.Write(first[:])
	m.Write(second[:])
	return m.Sum(nil)
}

const (
	macClientLabel = "rxed token v1 client"
	macServerLabel = "rxed token v1 server"
)

// tokenExchange runs hello and auth (token mode).
func (s *Session) tokenExchange(ctx context.Context) error {
	token := s.cfg.Ext.Token
	mine := &s.ext.nonceC
	if s.role == Server {
		mine = &s.ext.nonceS
	}
	_, _ = rand.Read(mine[:])
	var out, in [ExtHelloLen]byte
	copy(out[:], "RXEH")
	copy(out[16:], mine[:])
	if err := s.exchange(ctx, out[:], in[:], "rxed hello", true); err != nil {
		return err
	}
	if string(in[:4]) != "RXEH" {
		return s.fail(errorf(s.s.peer, ErrMalformed, "sent a malformed rxed hello %s", quoteMsg(in[:])))
	}
	theirs := &s.ext.nonceS
	if s.role == Server {
		theirs = &s.ext.nonceC
	}
	copy(theirs[:], in[16:])
	var aout, ain [ExtAuthLen]byte
	copy(aout[:], "RXEA")
	if s.role == Client {
		copy(aout[8:], tokenMAC(token, macClientLabel, s.ext.nonceS, s.ext.nonceC))
		if err := s.exchange(ctx, aout[:], ain[:], "rxed auth", true); err != nil {
			return err
		}
		if string(ain[:4]) != "RXEA" {
			return s.fail(errorf(s.s.peer, ErrMalformed, "sent a malformed rxed auth %s", quoteMsg(ain[:])))
		}
		if st := ExtStatus(ain[4]); st != ExtOK {
			return s.fail(errorf(s.s.peer, ErrRefused, "refused the session: %v", st))
		}
		if !hmac.Equal(ain[8:], tokenMAC(token, macServerLabel, s.ext.nonceC, s.ext.nonceS)) {
			return s.fail(errorf(s.s.peer, ErrRefused, "does not hold our token (its proof did not verify)"))
		}
		s.ext.tokens = true
		return nil
	}
	// Server: read the client's proof before answering.
	if err := s.s.readMsg(ctx, ain[:], "rxed auth", true); err != nil {
		return s.fail(err)
	}
	ok := string(ain[:4]) == "RXEA" && hmac.Equal(ain[8:], tokenMAC(token, macClientLabel, s.ext.nonceS, s.ext.nonceC))
	if ok {
		copy(aout[8:], tokenMAC(token, macServerLabel, s.ext.nonceC, s.ext.nonceS))
	} else {
		aout[4] = byte(ExtBadToken)
	}
	if err := s.s.writeMsg(ctx, aout[:], "rxed auth"); err != nil {
		return s.fail(err)
	}
	if !ok {
		return s.fail(errorf(s.s.peer, ErrRefused, "sent a token proof that does not verify"))
	}
	s.ext.tokens = true
	return nil
}

// Grant is the server's answer to an address proof: the export's rkey
// and address, withheld from the key messages until the proof.
type Grant struct {
	RKey  uint32
	VAddr uint64
	// Len is the export's length in bytes (0: the server did not say);
	// a client whose messages do not fit refuses to run.
	Len uint64
}

// ProveAddress is the client's address proof: it sends nonce (what the
// server wrote into our buffer over RoCE, zeros if it wrote nothing) and
// returns the server's grant. Call it after Connect on a session with
// Ext().
func (s *Session) ProveAddress(ctx context.Context, nonce [16]byte) (Grant, error) {
	var out, in [ExtProofLen]byte
	copy(out[:], "RXEP")
	copy(out[16:], nonce[:])
	if err := s.exchange(ctx, out[:], in[:ExtGrantLen], "rxed address proof", true); err != nil {
		return Grant{}, err
	}
	if string(in[:4]) != "RXEG" {
		return Grant{}, s.fail(errorf(s.s.peer, ErrMalformed, "sent a malformed rxed grant %s", quoteMsg(in[:])))
	}
	if st := ExtStatus(in[4]); st != ExtOK {
		return Grant{}, s.fail(errorf(s.s.peer, ErrRefused, "refused the session: %v", st))
	}
	return Grant{RKey: binary.BigEndian.Uint32(in[8:]), VAddr: binary.BigEndian.Uint64(in[16:]), Len: binary.BigEndian.Uint64(in[24:])}, nil
}

// CheckAddress is the server's side of ProveAddress: it reads the
// client's nonce and answers with decide's grant, or with its refusal
// (after which the session is closed and the refusal returned as an
// error).
func (s *Session) CheckAddress(ctx context.Context, decide func(nonce [16]byte) (Grant, ExtStatus)) error {
	var in, out [ExtProofLen]byte
	if err := s.s.readMsg(ctx, in[:], "rxed address proof", true); err != nil {
		return s.fail(err)
	}
	if string(in[:4]) != "RXEP" {
		return s.fail(errorf(s.s.peer, ErrMalformed, "sent a malformed rxed address proof %s", quoteMsg(in[:])))
	}
	var nonce [16]byte
	copy(nonce[:], in[16:])
	g, st := decide(nonce)
	copy(out[:], "RXEG")
	out[4] = byte(st)
	if st == ExtOK {
		binary.BigEndian.PutUint32(out[8:], g.RKey)
		binary.BigEndian.PutUint64(out[16:], g.VAddr)
		binary.BigEndian.PutUint64(out[24:], g.Len)
	}
	if err := s.s.writeMsg(ctx, out[:ExtGrantLen], "rxed grant"); err != nil {
		return s.fail(err)
	}
	if st != ExtOK {
		return s.fail(errorf(s.s.peer, ErrRefused, "was refused: %v", st))
	}
	return nil
}

// Answer is HandShake for a server that decides its reply from the
// client's key: it reads the client's key message, calls reply, and
// writes the key reply returns. When reply fails nothing is written, the
// connection is closed and its error returned.
func (s *Session) Answer(ctx context.Context, reply func(remote Key) (Key, error)) (Key, error) {
	var in, out [KeyMsgLen]byte
	if err := s.s.readMsg(ctx, in[:], "key message", true); err != nil {
		return Key{}, s.fail(err)
	}
	k, err := ParseKey(in[:])
	if err != nil {
		return Key{}, s.fail(errorf(s.s.peer, ErrMalformed, "sent a malformed key message %s: %v", quoteMsg(in[:]), err))
	}
	local, err := reply(k)
	if err != nil {
		return k, s.fail(err)
	}
	if err := local.Encode(out[:]); err != nil {
		return k, s.fail(err)
	}
	if err := s.s.writeMsg(ctx, out[:], "key message"); err != nil {
		return k, s.fail(err)
	}
	return k, nil
}

// BytesRead is how many bytes the peer has sent us over the exchange (for
// anti-amplification budgets).
func (s *Session) BytesRead() int64 { return s.s.bytesIn.Load() }
