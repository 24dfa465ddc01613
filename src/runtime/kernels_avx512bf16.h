/*
 * kernels_avx512bf16.h - the BF16 GEMM on AVX512-BF16 dot products
 * (VDPBF16PS): the prefill GEMMs of a model whose weights stay BF16 in their
 * mapped file, on CPUs that have AVX512-BF16 but no AMX (AMD Zen 4 and
 * later, Intel Cooper Lake; kernels_amx_int.h takes Sapphire Rapids and later).
 *
 * Numerics: as kernels_amx_int.h. The activations X are rounded to BF16
 * (round-to-nearest-even), each product of two BF16 values is exact in
 * fp32 and the sums accumulate in fp32, 16 partial sums per output added
 * at the end (so the order differs from sgemm's, not the precision).
 * Weights are read in place, row by row (a row of W is one output's dot
 * product); only X is converted, once per call, into the caller's scratch.
 * Threads: the output columns are split over up to `threads` pthreads, one
 * per 2^24 multiply-adds of the call (ac_kthreads_gemm, kthreads_int.h).
 */
#ifndef AC_KERNELS_AVX512BF16_H
#define AC_KERNELS_AVX512BF16_H

#include <stddef.h>
#include <stdint.h>

/* 1 when this CPU has AVX512F, AVX512BW and AVX512-BF16 and the OS saves the ZMM
 * state (XCR0); checked once. */
int ac_avx512bf16_available(void);
/* Elements (uint16_t) of the scratch ac_avx512bf16_linear needs for X[N,in]:
 * N rows of `in` padded to a multiple of 32. */
size_t ac_avx512bf16_pack_size(int N, int in);
/* Y[N,out] = X[N,in] W[out,in]^T, plus Y's previous values when acc, plus
 * b[out] when b != NULL; W is BF16, any shape. Returns -1 (Y untouched)
 * when the CPU lacks AVX512-BF16 or N, in or out is not positive. xpack:
 * ac_avx512bf16_pack_size(N, in) elements of scratch. */
int ac_avx512bf16_linear(float *Y, const float *X, const uint16_t *W, const float *b, int N, int in, int out, int acc,
                         uint16_t *xpack, int threads);
/* The k chunk of wide inputs (the .c file says why; 1024, rounded up to a
 * multiple of 32; inputs up to twice the chunk keep whole rows): 0 keeps
 * whole rows always. Same results either way, bit for bit. Process-wide and
 * not thread-safe: for bench_gemm_bf16's side-by-side run and the tests. */
void ac_avx512bf16_set_kchunk(int k);

#endif
