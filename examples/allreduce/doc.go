// Package allreduce is a ring allreduce (sum of float32 vectors) over rxed
// and, for comparison, over TCP: the NCCL/Gloo ring algorithm of N-1
// reduce-scatter steps then N-1 all-gather steps, one chunk (a 1/N of the
// vector) per step to the next rank.
//
// Over RDMA each rank advertises one receive slot per rank (the REP's
// private data: address, rkey, size, count) to the rank before it; that
// rank RDMA WRITEs step t's chunk with immediate data into slot t mod
// ranks, and the immediate (the step number) tells the receiver which
// chunk arrived. No slot is handed back: the ring's own order keeps the
// previous rank at most ranks-1 steps ahead, so a slot is always used
// before it is written again (slotsFor says why). Over TCP the same steps
// are a length-prefixed message on a stream.
//
// Reduction order: chunk c is summed as (((x_c + x_{c+1}) + x_{c+2}) + ...)
// over ranks c, c+1, ... mod N, which Reference reproduces, so results are
// compared bit for bit.
//
// Failures: connection setup checks that every neighbour runs the same
// rank count and vector length (a mismatch is refused with the reason on
// both sides); a rank that fails disconnects its neighbours, who fail in
// turn, and every wait has a deadline.
package allreduce
