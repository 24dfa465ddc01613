/*
 * kernels_amx_int.h - the BF16 GEMM on Intel AMX tiles (AMX-BF16): the prefill
 * GEMMs of a model whose weights stay BF16 in their mapped file.
 *
 * Numerics: the activations X are rounded to BF16 (round-to-nearest-even),
 * products are exact in fp32 and sums accumulate in fp32 (as PyTorch's BF16
 * matmul on CPU and llama.cpp's BF16 path do). Weights are read in place.
 * Threads: the output rows are split over up to ac_kernels_threads() pthreads,
 * one per 2^24 multiply-adds of the call (ac_kthreads_gemm, kthreads_int.h).
 */
#ifndef AC_KERNELS_AMX_H
#define AC_KERNELS_AMX_H

#include <stddef.h>
#include <stdint.h>

/* 1 when this CPU has AMX-BF16 and the kernel granted this process the
 * tile state (arch_prctl); checked once. */
int ac_amx_available(void);
/* Elements (uint16_t) of the packing scratch ac_amx_linear needs for X[N,in]
 * with up to `threads` threads (X in BF16, one weight strip per thread). */
size_t ac_amx_pack_size(int N, int in, int threads);
/* Y[N,out] = X[N,in] W[out,in]^T, plus Y's previous values when acc, plus
 * b[out] when b != NULL; W is BF16. Needs in % 32 == 0 and out % 16 == 0
 * (returns -1, Y untouched, otherwise) and ac_amx_available(). xpack:
 * ac_amx_pack_size(N, in, threads) elements of scratch. */
int ac_amx_linear(float *Y, const float *X, const uint16_t *W, const float *b, int N, int in, int out, int acc,
                  uint16_t *xpack, int threads);

#endif
