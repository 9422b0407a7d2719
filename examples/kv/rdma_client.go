package kv

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"time"

	"github.com/rxed/rxed/pkg/ib"
	"github.com/rxed/rxed/pkg/qp"
	"github.com/rxed/rxed/pkg/rdmacm"
)

// ErrConnLost is wrapped by every error of a client whose connection
// ended (the server closed or restarted, or stopped answering): Reconnect
// and go on.
var ErrConnLost = errors.New("connection lost")

// ConnLostError says which server went away and why.
type ConnLostError struct {
	Server netip.AddrPort
	Cause  error
}

func (e *ConnLostError) Error() string {
	return fmt.Sprintf("kv: connection to %v lost (server closed, restarted or unreachable): %v; reconnect to go on", e.Server, e.Cause)
}

func (e *ConnLostError) Unwrap() []error { return []error{ErrConnLost, e.Cause} }

// ClientStats counts what a client's GETs did.
type ClientStats struct {
	Gets, Puts, Deletes uint64
	Reads               uint64 // RDMA READs posted
	ReadAheads          uint64 // bucket READs posted with a READ of the bucket's extent beside them (one round trip for both)
	BytesRead           uint64 // bytes those READs brought (the engine copied them into our buffer)
	BytesCopiedOut      uint64 // value bytes copied from our buffer into results
	RetryWriting        uint64 // bucket read with an odd version
	RetryTorn           uint64 // bucket or inline value whose checksum failed
	RetryStale          uint64 // extent whose checksum is not the bucket's (changed after the bucket was read)
	Probes              uint64 // zero-length WRITEs posted because a response was late (probeResponse)
}

// Retries is the number of re-reads.
func (s ClientStats) Retries() uint64 { return s.RetryWriting + s.RetryTorn + s.RetryStale }

// RDMAClientConfig configures DialRDMA. Zero values take the defaults.
type RDMAClientConfig struct {
	// Local is the device address to connect from; invalid: the first
	// of the server's family.
	Local netip.Addr
	// ACKTimeout is the QP's local ACK timeout exponent (default 14:
	// 67 ms, so a dead server is noticed within about half a second).
	ACKTimeout uint8
	// MaxRetries bounds the re-reads of one GET (default 100000).
	MaxRetries int
	// Spin is how the client waits for its READs and replies: it spins
	// on its CQ this long before it sleeps (ib.HybridWaiter's base
	// budget, which adapts up to four times it); 0 is
	// ib.DefaultHybridSpin. Negative: it sleeps at once (CQ.WaitPoll),
	// which costs a thread wake-up per READ: with one client and a
	// server in another process, a GET then took 78-118 us at the
	// median instead of 12 (docs/performance.md, session X).
	Spin time.Duration
	// ReadAhead is how much of a bucket's extent a GET reads beside the
	// bucket, in the same round trip (readahead.go): 0, the length of the
	// last value the client found out of line (none after an inline one
	// or before any); negative, none (bucket, then value: two round trips
	// for a value out of line); positive, always that many bytes (capped
	// at the server's extent size), for a client that knows its values'
	// size, whose first GET then takes one round trip too.
	ReadAhead int
}

// RDMAClient is one client connection: its own RC QP, CQ and buffer. Not
// safe for concurrent use: open one per goroutine.
type RDMAClient struct {
	dev    *ib.Device
	server netip.AddrPort
	cfg    RDMAClientConfig

	pd     *ib.PD
	cq     *ib.CQ
	mr     *ib.MR
	buf    []byte
	qp     *ib.QP
	conn   *rdmacm.Conn
	h      hello
	id     uint32
	wcs    []ib.WC
	waiter ib.HybridWaiter // one per client: it keeps its adapted budget

	// probeAfter is how long a call waits for its response before it
	// probes the server's QP (probeResponse); probing: a probe is
	// outstanding.
	probeAfter time.Duration
	probing    bool
	probe      probeDeadline // the wait's deadline (waitSome)

	stats ClientStats

	// readAhead is how many bytes of a bucket's extent a GET reads beside
	// the bucket (readahead.go); 0: the bucket alone.
	readAhead int

	// afterBucketRead, if set (tests), runs between a GET's bucket READ
	// and its value READ, or after a read-ahead: a writer injected there
	// makes the read stale.
	afterBucketRead func()
}

// Client buffer layout: bucket | value | request | response.
func (c *RDMAClient) offValue() int { return BucketSize }
func (c *RDMAClient) offReq() int   { return BucketSize + int(c.h.extentSize) }
func (c *RDMAClient) offResp() int  { return c.offReq() + int(c.h.maxMsg) }

// DialRDMA connects to the kv server at server (its rdma_cm address).
func DialRDMA(ctx context.Context, dev *ib.Device, server netip.AddrPort, cfg *RDMAClientConfig) (*RDMAClient, error) {
	c := &RDMAClient{dev: dev, server: server, wcs: make([]ib.WC, 4)}
	if cfg != nil {
		c.cfg = *cfg
	}
	if c.cfg.ACKTimeout == 0 {
		c.cfg.ACKTimeout = 14
	}
	if c.cfg.MaxRetries == 0 {
		c.cfg.MaxRetries = 100000
	}
	c.waiter.Spin = c.cfg.Spin
	c.probeAfter = qp.RetransmitTimeout(c.cfg.ACKTimeout)
	c.readAhead = max(c.cfg.ReadAhead, 0)
	var err error
	if c.pd, err = dev.AllocPD(); err != nil {
		return nil, err
	}
	if c.cq, err = dev.CreateCQ(16); err != nil {
		_ = c.pd.Dealloc()
		return nil, err
	}
	if err := c.connect(ctx); err != nil {
		c.free()
		return nil, err
	}
	return c, nil
}

// connect makes a QP and dials; on success c.h describes the table and
// c.buf is sized for it.
func (c *RDMAClient) connect(ctx context.Context) error {
	q, err := c.pd.CreateQP(ib.QPInitAttr{Type: ib.RC, SendCQ: c.cq, RecvCQ: c.cq,
		Cap: ib.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		return err
	}
	conn, err := rdmacm.Dial(ctx, q, c.server, &rdmacm.ConnParam{Local: c.cfg.Local, InitiatorDepth: readsInFlight,
		RetryCount: 7, RNRRetryCount: 7, ACKTimeout: c.cfg.ACKTimeout, Timeout: 10 * time.Second})
	if err != nil {
		_ = q.Destroy()
		if isBusyReject(err) {
			// Not ErrConnLost nor a bare "rejected: consumer defined
			// (28)": the server is up and at its cap (busy.go).
			return fmt.Errorf("kv: %v refused the connection: %w (its connection cap, MaxConns; %w); reconnect later", c.server, ErrServerBusy, err)
		}
		return fmt.Errorf("kv: connecting to %v: %w", c.server, err)
	}
	h, err := parseHello(conn.PrivateData())
	if err != nil {
		c.qp, c.conn = q, conn
		c.dropConn()
		return err
	}
	need := BucketSize + int(h.extentSize) + int(h.maxMsg) + respHdrLen
	if len(c.buf) < need {
		if c.mr != nil {
			_ = c.mr.Dereg()
			c.mr = nil
		}
		c.buf = make([]byte, need)
		if c.mr, err = c.pd.RegMR(c.buf, ib.AccessLocalWrite); err != nil {
			c.qp, c.conn = q, conn
			c.dropConn()
			return err
		}
	}
	c.qp, c.conn, c.h = q, conn, h
	return nil
}

// Reconnect drops the connection (if any is left) and dials the server
// again, learning its table anew (a restarted server has a new rkey).
func (c *RDMAClient) Reconnect(ctx context.Context) error {
	c.dropConn()
	return c.connect(ctx)
}

// Epoch identifies the server instance the client is connected to.
func (c *RDMAClient) Epoch() uint64 { return c.h.epoch }

// Stats returns the client's counters.
func (c *RDMAClient) Stats() ClientStats { return c.stats }

func (c *RDMAClient) dropConn() {
	if c.conn != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = c.conn.Disconnect(ctx)
		cancel()
		c.conn = nil
	}
	if c.qp != nil {
		_ = c.qp.Destroy()
		c.qp = nil
	}
	c.probing = false
	for c.cq.Poll(c.wcs) > 0 { // flushed work of the old QP
	}
}

func (c *RDMAClient) free() {
	c.dropConn()
	if c.mr != nil {
		_ = c.mr.Dereg()
	}
	_ = c.cq.Destroy()
	_ = c.pd.Dealloc()
	c.probe.release()
}

// Close disconnects and frees the client.
func (c *RDMAClient) Close() error {
	c.free()
	return nil
}

func (c *RDMAClient) lost(cause error) error {
	return &ConnLostError{Server: c.server, Cause: cause}
}

// usable fails fast when the connection already ended.
func (c *RDMAClient) usable() error {
	if c.conn == nil {
		return c.lost(errors.New("not connected"))
	}
	select {
	case <-c.conn.Done():
		return c.lost(c.conn.Err())
	default:
		return nil
	}
}

// probeID is the work request ID of a probe (a zero-length RDMA WRITE);
// the other work requests of a client have ID 0.
const probeID = 1 << 63

// errProbeDue ends a wait for a response that took probeAfter.
var errProbeDue = errors.New("kv: no response yet: probing the server")

// wait waits for n completions and fails on the first bad one. With
// probe set (the wait for a response), it probes the server's QP each
// time the wait takes c.probeAfter (see probeResponse).
func (c *RDMAClient) wait(ctx context.Context, n int, probe bool) error {
	for n > 0 {
		k, err := c.waitSome(ctx, n, probe)
		if err != nil {
			if errors.Is(err, errProbeDue) {
				if err := c.probeResponse(); err != nil {
					return err
				}
				continue
			}
			// Work is still outstanding: this QP cannot be trusted to
			// pair completions with requests any more.
			c.dropConn()
			return c.lost(err)
		}
		for _, wc := range c.wcs[:k] {
			if wc.Status != ib.WCSuccess {
				return c.lost(c.completionCause(wc))
			}
			if wc.ID == probeID {
				c.probing = false // not one of the n
				continue
			}
			n--
		}
	}
	return nil
}

// waitSome returns up to n completions; with probe set it gives up
// after c.probeAfter with errProbeDue (c.probe: no allocation, no timer
// unless the wait sleeps); a GET's READs need no probe (their QP retries
// them).
func (c *RDMAClient) waitSome(ctx context.Context, n int, probe bool) (int, error) {
	if !probe {
		return c.waiter.Wait(ctx, c.cq, c.wcs[:n])
	}
	k, err := c.waiter.Wait(c.probe.begin(ctx, c.probeAfter), c.cq, c.wcs[:n])
	due := c.probe.end()
	if err != nil && ctx.Err() == nil && due {
		return 0, errProbeDue
	}
	return k, err
}

// probeResponse asks whether the server is still there when a response
// is late. A request's SEND completes once the server's QP acknowledged
// it, which it does before its handler answers; a server whose host died
// between the two leaves the client waiting on a receive, for which its
// QP retries nothing. A signaled zero-length RDMA WRITE (as the server's
// keepalive sends the other way; every connected QP takes remote writes)
// has the client's QP ask the server's: a live one acknowledges it and
// the wait goes on, a dead one leaves it to run out of retries, and its
// RETRY_EXC_ERR ends the wait with ErrConnLost. One probe is outstanding
// at a time; a late one's completion is skipped by a later wait.
func (c *RDMAClient) probeResponse() error {
	if c.probing {
		return nil
	}
	if err := c.qp.PostSend(ib.SendWR{ID: probeID, Opcode: ib.WRRDMAWrite, Flags: ib.SendSignaled}); err != nil {
		return c.lost(err)
	}
	c.probing = true
	c.stats.Probes++
	return nil
}

// completionCause is why a failed completion ended the connection: the
// rdma_cm connection's end if it ended, else the completion's status.
func (c *RDMAClient) completionCause(wc ib.WC) error {
	cause := fmt.Errorf("work completion %v", wc.Status)
	if c.conn != nil {
		select {
		case <-c.conn.Done():
			cause = fmt.Errorf("%w (%v)", c.conn.Err(), wc.Status)
		default:
		}
	}
	return cause
}

// span is one READ: n bytes of the server's table at raddr into our
// buffer at off.
type span struct {
	off   int
	raddr uint64
	n     int
}

// read posts one READ per span (at most readsInFlight) in one post and
// waits for them. Only the last is signaled: an RC QP completes in order,
// so its completion says the others are done too.
func (c *RDMAClient) read(ctx context.Context, spans ...span) error {
	if err := c.usable(); err != nil {
		return err
	}
	var wrs [readsInFlight]ib.SendWR
	var sges [readsInFlight]ib.SGE
	total := 0
	for k, sp := range spans {
		sges[k] = ib.SGE{Addr: c.mr.IOVA() + uint64(sp.off), Length: uint32(sp.n), LKey: c.mr.LKey()}
		wrs[k] = ib.SendWR{Opcode: ib.WRRDMARead, SGL: sges[k : k+1], RemoteAddr: sp.raddr, RKey: c.h.rkey}
		total += sp.n
	}
	wrs[len(spans)-1].Flags = ib.SendSignaled
	if err := c.qp.PostSend(wrs[:len(spans)]...); err != nil {
		return c.lost(err)
	}
	c.stats.Reads += uint64(len(spans))
	c.stats.ReadAheads += uint64(len(spans) - 1) // a span beside the first is a read-ahead (readBucket)
	c.stats.BytesRead += uint64(total)
	return c.wait(ctx, 1, false)
}

// Get returns key's value, read with one-sided RDMA READs: the server
// runs no code for it.
func (c *RDMAClient) Get(ctx context.Context, key []byte) ([]byte, error) {
	if err := checkKey(key); err != nil {
		return nil, err
	}
	c.stats.Gets++
	nb := int(c.h.nbuckets)
	start := home(key, nb)
	retries := 0
	for p := 0; p < int(c.h.maxProbe); {
		i := (start + p) % nb
		val, next, err := c.getAt(ctx, i, key)
		switch {
		case err != nil:
			return nil, err
		case next == stepFound:
			return val, nil
		case next == stepAbsent:
			return nil, ErrNotFound
		case next == stepNextBucket:
			p++
			continue
		}
		// stepRetry: read bucket i again.
		retries++
		if retries > c.cfg.MaxRetries {
			return nil, ErrContention
		}
		if retries%64 == 0 {
			runtime.Gosched()
		}
	}
	return nil, ErrNotFound
}

type step int

const (
	stepFound step = iota
	stepAbsent
	stepNextBucket
	stepRetry
)

// getAt reads bucket i and, when it holds key out of line, its extent:
// beside the bucket when the client reads ahead, after it otherwise.
func (c *RDMAClient) getAt(ctx context.Context, i int, key []byte) ([]byte, step, error) {
	ahead := min(c.readAhead, int(c.h.extentSize))
	if err := c.readBucket(ctx, i, ahead); err != nil {
		return nil, 0, err
	}
	b := bucket(c.buf[:BucketSize])
	switch b.check(int(c.h.extentSize)) {
	case verdictEmpty:
		return nil, stepAbsent, nil
	case verdictWriting:
		c.stats.RetryWriting++
		return nil, stepRetry, nil
	case verdictTorn, verdictBadLength:
		c.stats.RetryTorn++
		return nil, stepRetry, nil
	}
	if b.flags()&flagTombstone != 0 || string(b.key()) != string(key) {
		return nil, stepNextBucket, nil
	}
	n := b.valLen()
	var val []byte
	if b.flags()&flagInline != 0 {
		val = b.inline()
		if crc32c(val) != b.valCRC() {
			c.stats.RetryTorn++
			return nil, stepRetry, nil
		}
	} else {
		want := b.valCRC()
		if c.afterBucketRead != nil {
			c.afterBucketRead()
		}
		if n > ahead {
			if err := c.read(ctx, span{c.offValue() + ahead, c.h.extentAddr(i) + uint64(ahead), n - ahead}); err != nil {
				return nil, 0, err
			}
		}
		val = c.buf[c.offValue() : c.offValue()+n]
		if crc32c(val) != want {
			c.stats.RetryStale++
			return nil, stepRetry, nil
		}
	}
	c.readAhead = c.nextReadAhead(b.flags()&flagInline != 0, n)
	c.stats.BytesCopiedOut += uint64(n)
	return append([]byte(nil), val...), stepFound, nil
}

// Put stores val under key (a SEND to the server, which answers by SEND).
func (c *RDMAClient) Put(ctx context.Context, key, val []byte) error {
	if err := checkKey(key); err != nil {
		return err
	}
	if len(val) > int(c.h.extentSize) {
		return ErrValueLen
	}
	c.stats.Puts++
	return c.call(ctx, opPut, key, val)
}

// Delete removes key.
func (c *RDMAClient) Delete(ctx context.Context, key []byte) error {
	if err := checkKey(key); err != nil {
		return err
	}
	c.stats.Deletes++
	return c.call(ctx, opDelete, key, nil)
}

// call sends one request and waits for the response: the receive for
// the response is posted before the request leaves.
func (c *RDMAClient) call(ctx context.Context, o op, key, val []byte) error {
	if err := c.usable(); err != nil {
		return err
	}
	c.id++
	req := appendRequest(c.buf[c.offReq():c.offReq()], o, c.id, key, val)
	if err := c.qp.PostRecv(ib.RecvWR{SGL: []ib.SGE{{Addr: c.mr.IOVA() + uint64(c.offResp()), Length: respHdrLen, LKey: c.mr.LKey()}}}); err != nil {
		return c.lost(err)
	}
	if err := c.qp.PostSend(ib.SendWR{Opcode: ib.WRSend, Flags: ib.SendSignaled,
		SGL: []ib.SGE{{Addr: c.mr.IOVA() + uint64(c.offReq()), Length: uint32(len(req)), LKey: c.mr.LKey()}}}); err != nil {
		return c.lost(err)
	}
	if err := c.wait(ctx, 2, true); err != nil {
		return err
	}
	r, err := parseResponseHdr(c.buf[c.offResp() : c.offResp()+respHdrLen])
	if err != nil {
		return err
	}
	if r.id != c.id {
		return fmt.Errorf("kv: response to request %d while waiting for %d", r.id, c.id)
	}
	return r.status.err()
}
