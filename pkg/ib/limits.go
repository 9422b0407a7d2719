package ib

import "github.com/rxed/rxed/pkg/qp"

// Size limits of the verbs objects, rdma_rxe's (rxe_param.h); QueryDevice
// reports them too.
const (
	MaxCQE    = qp.MaxCQE    // largest CQ ((1 << RXE_MAX_LOG_CQE) - 1)
	MaxSRQWR  = qp.MaxSRQWR  // deepest SRQ (RXE_MAX_SRQ_WR)
	MaxSRQSGE = qp.MaxSRQSGE // SGEs per SRQ receive (RXE_MAX_SRQ_SGE)
)
