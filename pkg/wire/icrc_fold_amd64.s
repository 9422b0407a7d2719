//go:build amd64 && !purego

#include "textflag.h"

// Offsets into foldK (icrc_fold_amd64.go).
#define K2048 ·foldK+0(SB)
#define K512 ·foldK+64(SB)
#define K128 ·foldK+128(SB)
#define K64 ·foldK+144(SB)
#define MU ·foldK+160(SB)

// FOLD moves the 512-bit accumulator acc on by the distance of the
// constants in Z0 and adds the 64 bytes in data (tmp is clobbered).
#define FOLD(acc, tmp, data) \
	VPCLMULQDQ $0x11, Z0, acc, tmp \
	VPCLMULQDQ $0x00, Z0, acc, acc \
	VPTERNLOGD $0x96, data, tmp, acc

// func foldAVX512(reg uint32, first *[8]uint64, p []byte) uint32
//
// foldAVX512 runs the CRC register reg over the 64 bytes at first and then
// over p (len(p) a multiple of 16) and returns the register (neither is
// complemented). Long inputs go through four 512-bit accumulators, 256
// bytes a step, so that four chains of carry-less multiplies run side by
// side; they are folded into one, the 64-byte blocks left follow, then the
// four 128-bit lanes are folded into one, the 16-byte blocks left follow,
// and a Barrett reduction takes the 128-bit remainder to 32 bits.
TEXT ·foldAVX512(SB), NOSPLIT, $0-44
	MOVL reg+0(FP), DX
	MOVQ first+8(FP), AX
	MOVQ p_base+16(FP), SI
	MOVQ p_len+24(FP), CX

	// The block is read a quadword at a time, as the caller stored it:
	// one 64-byte load from eight fresh stores waits for them to drain
	// to the cache (about 40 ns here) instead of taking each from the
	// store buffer.
	VMOVD        DX, X0
	VMOVQ        0(AX), X1
	VPINSRQ      $1, 8(AX), X1, X1
	VMOVQ        16(AX), X2
	VPINSRQ      $1, 24(AX), X2, X2
	VMOVQ        32(AX), X3
	VPINSRQ      $1, 40(AX), X3, X3
	VMOVQ        48(AX), X4
	VPINSRQ      $1, 56(AX), X4, X4
	VPXOR        X0, X1, X1
	VINSERTI32X4 $1, X2, Z1, Z1
	VINSERTI32X4 $2, X3, Z1, Z1
	VINSERTI32X4 $3, X4, Z1, Z1

	CMPQ CX, $448
	JB   one

	VMOVDQU64 0(SI), Z2
	VMOVDQU64 64(SI), Z3
	VMOVDQU64 128(SI), Z4
	ADDQ      $192, SI
	SUBQ      $192, CX
	VMOVDQU64 K2048, Z0

fold256:
	VMOVDQU64 0(SI), Z11
	VMOVDQU64 64(SI), Z12
	VMOVDQU64 128(SI), Z13
	VMOVDQU64 192(SI), Z14
	FOLD(Z1, Z5, Z11)
	FOLD(Z2, Z6, Z12)
	FOLD(Z3, Z7, Z13)
	FOLD(Z4, Z8, Z14)
	ADDQ $256, SI
	SUBQ $256, CX
	CMPQ CX, $256
	JAE  fold256

	VMOVDQU64 K512, Z0
	FOLD(Z1, Z5, Z2)
	FOLD(Z1, Z5, Z3)
	FOLD(Z1, Z5, Z4)
	JMP  more64

one:
	VMOVDQU64 K512, Z0

more64:
	CMPQ CX, $64
	JB   lanes

fold64:
	VMOVDQU64 (SI), Z11
	FOLD(Z1, Z5, Z11)
	ADDQ $64, SI
	SUBQ $64, CX
	CMPQ CX, $64
	JAE  fold64

lanes:
	VEXTRACTI32X4 $1, Z1, X2
	VEXTRACTI32X4 $2, Z1, X3
	VEXTRACTI32X4 $3, Z1, X4
	VZEROUPPER

	MOVOU     K128, X0
	MOVOA     X1, X5
	PCLMULQDQ $0x00, X0, X1
	PCLMULQDQ $0x11, X0, X5
	PXOR      X5, X1
	PXOR      X2, X1
	MOVOA     X1, X5
	PCLMULQDQ $0x00, X0, X1
	PCLMULQDQ $0x11, X0, X5
	PXOR      X5, X1
	PXOR      X3, X1
	MOVOA     X1, X5
	PCLMULQDQ $0x00, X0, X1
	PCLMULQDQ $0x11, X0, X5
	PXOR      X5, X1
	PXOR      X4, X1

	CMPQ CX, $16
	JB   reduce

fold16:
	MOVOU     (SI), X10
	MOVOA     X1, X5
	PCLMULQDQ $0x00, X0, X1
	PCLMULQDQ $0x11, X0, X5
	PXOR      X5, X1
	PXOR      X10, X1
	ADDQ      $16, SI
	SUBQ      $16, CX
	CMPQ      CX, $16
	JAE       fold16

reduce:
	// 128 -> 64 bits: the low quadword times x^64 (K128's high half),
	// added to the high quadword.
	PCMPEQB   X3, X3
	PCLMULQDQ $0x01, X1, X0
	PSRLDQ    $8, X1
	PXOR      X0, X1

	// 64 -> 32 bits.
	MOVOA     X1, X2
	MOVQ      K64, X0
	PSRLQ     $32, X3
	PSRLDQ    $4, X2
	PAND      X3, X1
	PCLMULQDQ $0x00, X0, X1
	PXOR      X2, X1

	// Barrett: subtract floor(r * mu / x^64) * P.
	MOVOU     MU, X0
	MOVOA     X1, X2
	PAND      X3, X1
	PCLMULQDQ $0x10, X0, X1
	PAND      X3, X1
	PCLMULQDQ $0x00, X0, X1
	PXOR      X2, X1

	PEXTRD $1, X1, AX
	MOVL   AX, ret+40(FP)
	RET
