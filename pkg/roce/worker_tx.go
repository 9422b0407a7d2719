package roce

import (
	"net/netip"

	"github.com/rxed/rxed/pkg/mr"
	"github.com/rxed/rxed/pkg/qp"
	"github.com/rxed/rxed/pkg/roce/transport"
	"github.com/rxed/rxed/pkg/wire"
)

// txScratch holds a batch's entries while requestsFirst reorders them.
type txScratch struct {
	bufs, out [][]byte
	g         []transport.Gather
	regs      []mr.Region
}

// TxBuffer implements qp.Env.
func (w *worker) TxBuffer() []byte { return w.txBufs[w.txN] }

// Transmit implements qp.Env: seal the ICRC for the flow and add the
// packet to the batch, sending the batch when it is full or the
// destination changes.
func (w *worker) Transmit(n int, av *qp.AddrVector) error {
	ep, err := w.route(av)
	if err != nil {
		return err
	}
	pkt := w.txBufs[w.txN][:n]
	wire.Flow{Src: ep.Local, Dst: ep.Remote}.Seal(pkt)
	if w.e.gs != nil {
		w.txG[w.txN] = transport.Gather{pkt}
	} else {
		w.txOut[w.txN] = pkt
	}
	w.added()
	return nil
}

// TransmitPayload implements qp.PayloadEnv: with a Conn that sends in
// pieces, the payload leaves from the registered memory itself (the kernel
// copies it once, as it copies the headers); the region reference is
// released when the batch has been sent. Otherwise the payload is copied
// behind the headers and sent like Transmit.
func (w *worker) TransmitPayload(hdrLen int, payload []byte, reg mr.Region, n int, av *qp.AddrVector) error {
	if w.e.gs == nil {
		copy(w.txBufs[w.txN][hdrLen:], payload)
		reg.Release()
		return w.Transmit(n, av)
	}
	ep, err := w.route(av)
	if err != nil {
		reg.Release()
		return err
	}
	buf := w.txBufs[w.txN]
	trailer := buf[hdrLen : n-len(payload)] // pad, then the ICRC slot
	clear(trailer)
	wire.Flow{Src: ep.Local, Dst: ep.Remote}.SealGather(buf[:hdrLen], payload, trailer)
	w.txG[w.txN] = transport.Gather{buf[:hdrLen], payload, trailer}
	w.txRegs[w.txN] = reg
	w.added()
	return nil
}

// route resolves av to the batch's endpoint, flushing the batch first
// when the destination changes (the packet being built moves to the
// front of the next batch).
func (w *worker) route(av *qp.AddrVector) (transport.Endpoint, error) {
	e := w.e
	localEP := e.gidEndpoint(av.SGIDIndex)
	local, remote := localEP.Addr(), av.DGID.Unmap()
	if !local.IsValid() || !remote.IsValid() || local.Is4() != remote.Is4() {
		w.ctr.SendErr.Add(1)
		return transport.Endpoint{}, qp.ErrBadAV
	}
	dport := av.DestPort
	if dport == 0 {
		dport = transport.RoCEv2Port
	}
	// The AV's traffic class and hop limit go into the IP header of
	// every packet on it, as rxe's prepare4/prepare6 put them: the
	// requester's, and the responder's ACKs and READ responses (the QP's
	// primary AV). A change of either is a change of endpoint: the batch
	// is flushed, as the control messages are per send.
	ep := transport.Endpoint{
		Local:        localEP,
		Remote:       netip.AddrPortFrom(remote, dport),
		TrafficClass: av.TrafficClass,
		HopLimit:     av.HopLimit,
	}
	if k := w.txN; k > 0 && ep != w.txEP {
		// The packet was built in txBufs[k]; after the flush it becomes
		// the first of the next batch.
		w.flush()
		w.txBufs[0], w.txBufs[k] = w.txBufs[k], w.txBufs[0]
	}
	w.txEP = ep
	return ep, nil
}

// added counts the packet just put in the batch, sending a full batch,
// or a batch that ends in a NAK.
//
// A NAK leaves at once, not when the received batch that provoked it has
// been handled: the requester goes on sending until it hears of the gap,
// and a go-back-N responder drops all of that (IBA 9.7.5.1.1), so every
// microsecond the NAK waits behind the rest of a received batch (up to
// 64 datagrams, each checked and dropped) is more data sent again.
func (w *worker) added() {
	pkt := w.txBufs[w.txN]
	op := wire.Opcode(pkt[0])
	if op.Info().Flags.Has(wire.FlagResponse) {
		w.txResp = true
	} else if w.txResp {
		w.txMixed = true
	}
	w.txN++
	if w.txN == w.txSize || op == wire.RCAck && wire.AETH(pkt[wire.BTHLen:]).Syndrome().Kind() == wire.SynNAK {
		w.flush()
	}
}

// flush sends the batch.
func (w *worker) flush() {
	w.nowSet = false
	w.unkeep()
	if w.txN == 0 {
		return
	}
	if w.txMixed {
		w.requestsFirst()
	}
	w.txResp, w.txMixed = false, false
	var err error
	if w.e.gs != nil {
		err = w.e.gs.SendGather(w.txG[:w.txN], w.txEP)
		for i := range w.txN {
			w.txRegs[i].Release() // a no-op for packets without a region
			w.txG[i] = transport.Gather{}
		}
	} else {
		err = w.e.conn.Send(w.txOut[:w.txN], w.txEP)
	}
	if err != nil {
		// A transport that sent part of the batch says how much it did
		// not (transport.SendError): send_err counts those, as rdma_rxe
		// counts each packet its send refused, not the whole batch.
		refused := transport.Refused(err, w.txN)
		w.ctr.SendErr.Add(uint64(refused))
		w.e.log.Debug("roce: send failed", "err", err, "n", w.txN, "refused", refused)
	}
	w.txN = 0
}

// requestsFirst moves the batch's requests ahead of its responses,
// keeping the order within each (a QP's responses must stay in PSN order,
// and so must its requests; IBA orders nothing between the two
// directions). The typical batch is an ACK and the answer the application
// posted in the answer window: sent as [answer, ACK] the two are one UDP
// GSO message (a shorter datagram may end a run), which crosses the
// kernel once instead of twice; on loopback that is nearly half the cost
// of a SEND round trip.
func (w *worker) requestsFirst() {
	t := &w.txTmp
	n := w.txN
	gather := w.e.gs != nil
	k := 0
	for pass := 0; pass < 2; pass++ {
		wantResp := pass == 1
		for i := range n {
			if wire.Opcode(w.txBufs[i][0]).Info().Flags.Has(wire.FlagResponse) != wantResp {
				continue
			}
			t.bufs[k], t.regs[k] = w.txBufs[i], w.txRegs[i]
			if gather {
				t.g[k] = w.txG[i]
			} else {
				t.out[k] = w.txOut[i]
			}
			k++
		}
	}
	copy(w.txBufs, t.bufs[:n])
	copy(w.txRegs, t.regs[:n])
	clear(t.bufs[:n])
	clear(t.regs[:n])
	if gather {
		copy(w.txG, t.g[:n])
		clear(t.g[:n])
	} else {
		copy(w.txOut, t.out[:n])
		clear(t.out[:n])
	}
}
