/*
 * kernels_cpu.h - the fp32 CPU kernels the engine is made of. Shapes are in
 * the comment of each; buffers are row-major and owned by the caller.
 * GEMMs go through cblas (OpenBLAS); the rest is plain C loops.
 *
 * Weights may be fp32 or 16-bit (BF16 / F16, read in place from a mapped
 * checkpoint: ac_linear_w). 16-bit weights are converted to fp32 per tile of
 * rows into a small scratch and multiplied with sgemm (exactly the fp32
 * result of the same weights), except BF16 GEMMs of at least
 * ac_bf16_gemm_rows() rows on a CPU with a BF16 kernel: AMX-BF16
 * (kernels_amx_int.h) or else AVX512-BF16 (kernels_avx512bf16.h), which round
 * the activations to BF16. BF16 decode steps (up to 8 rows) go to a GEMV
 * reading the weights in place (AVX2/FMA, fp32 arithmetic on the exact
 * weights, summed in another order than sgemm) while
 * ac_bf16_gemm_rows() > 0; with 0 every 16-bit GEMM takes the per-tile
 * path (the fp32 engine's arithmetic).
 */
#ifndef AC_KERNELS_CPU_H
#define AC_KERNELS_CPU_H

#include <stddef.h>
#include <stdint.h>

/* Y[N,out] = X[N,in] W[out,in]^T (+ b[out] when b != NULL). */
void ac_linear(float *Y, const float *X, const float *W, const float *b, int N, int in, int out);
/* Y[N,out] += X[N,in] W[out,in]^T  (residual add fused into the GEMM). */
void ac_linear_acc(float *Y, const float *X, const float *W, int N, int in, int out);
/* out[N,H] = x * rsqrt(mean(x^2) + eps) * w, row by row. out may alias x. */
void ac_rmsnorm(float *out, const float *x, const float *w, int N, int H, float eps);
/* Rotate-half RoPE on rows of nh heads of dim hd, positions pos[r] per row;
 * cos/sin tables are [max_pos][hd/2]. x is [N, nh*hd]. */
void ac_rope(float *x, int N, int nh, int hd, const int *pos, const float *cos_t, const float *sin_t);
/* g[i] = silu(g[i]) * u[i]. */
void ac_silu_mul(float *g, const float *u, long n);
/* In-place softmax of a row of n values. */
void ac_softmax(float *x, int n);
/* log(sum(e^x[i])) of n values, summed in double. */
double ac_logsumexp(const float *x, int n);
/* Causal attention of one query head over one sequence's cache.
 * q: n rows (stride q_stride), k/v: S = pos0+n rows (stride kv_stride) of hd
 * values; query row t sees keys 0..pos0+t, or only the last `window` of
 * them when window > 0 (sliding-window attention). out: n rows (stride
 * q_stride). scores: scratch of n*S floats. */
void ac_attention_head(float *out, const float *q, const float *k, const float *v, int n, int pos0, int hd,
                       int q_stride, int kv_stride, int window, float *scores);
/* Inverse frequencies for head_dim hd with optional llama3 scaling. */
void ac_rope_inv_freq(float *inv, int hd, float theta, int llama3, float factor, float lo, float hi, int orig);
/* Set the number of threads the CPU kernels (OpenBLAS, the BF16 GEMMs) use. */
void ac_set_threads(int n);
int ac_kernels_threads(void);
/* Threads of OpenBLAS alone (the BF16 GEMMs keep ac_kernels_threads): the
 * engine runs BLAS on one thread around a BF16-kernel prefill, where the
 * only BLAS calls left are the small attention GEMMs and idle BLAS workers
 * spinning would take cycles from the BF16 kernel's threads. */
void ac_blas_threads(int n);
/* That rule for a call of N rows over weights in wdt (the engine's forward,
 * the cost table's BF16 GEMM and attention points): OpenBLAS set to one
 * thread when wdt is BF16, N rows go to the BF16 kernel and the kernels
 * have more than one thread. Returns whether it did; ac_blas_restore(that)
 * undoes it. */
int ac_blas_one_for_bf16(int wdt, int N);
void ac_blas_restore(int one);
/* The BF16 GEMM kernels. AC_BF16_AUTO: AMX where the CPU has it, else
 * AVX512-BF16, else none (per-tile conversion and sgemm). */
enum { AC_BF16_AUTO = -1, AC_BF16_NONE = 0, AC_BF16_AMX = 1, AC_BF16_AVX512 = 2 };
/* The kernel BF16 GEMMs of at least ac_bf16_gemm_rows() rows use now. */
int ac_bf16_kernel(void);
/* 1 when this CPU can run kernel k (AC_BF16_NONE always). */
int ac_bf16_kernel_available(int k);
/* Choose the kernel (tests, benchmarks); -1 when this CPU lacks it. */
int ac_set_bf16_kernel(int k);
const char *ac_bf16_kernel_name(int k);
/* 1 when BF16 GEMMs of N rows run on a BF16 kernel (activations rounded). */
int ac_bf16_fast_rows(int N);

/* Scratch of ac_linear_w, owned by the caller (the engine): wtile holds a
 * tile of converted weight rows, xpack the BF16 packing of X for the BF16
 * kernels (room for either kernel the CPU has). */
typedef struct {
    float *wtile;
    size_t wtile_n; /* floats */
    uint16_t *xpack;
    size_t xpack_n; /* elements; 0 = no BF16 kernel */
} ac_wscratch;
/* Allocate scratch for ac_linear_w of up to N rows of width up to in;
 * 0, or -1 when out of memory. */
int ac_wscratch_alloc(ac_wscratch *s, int N, int in);
void ac_wscratch_free(ac_wscratch *s);
/* Y[N,out] = X[N,in] W[out,in]^T (+ b[out]), or Y += that when acc, where W
 * is stored in wdt (st_dtype F32, BF16 or F16). */
void ac_linear_w(float *Y, const float *X, const void *W, int wdt, const float *b, int N, int in, int out, int acc,
                 ac_wscratch *s);
/* Row r of a [rows, n] matrix stored in wdt, as fp32, into dst[n]. */
void ac_row_f32(float *dst, const void *W, int wdt, size_t r, int n);
/* BF16 GEMMs with at least this many rows use the BF16 kernel when the CPU
 * has one (default 32: prefill; decode steps keep fp32 activations, on the
 * decode GEMV); 0 = never, and no GEMV either: every 16-bit GEMM per tile,
 * the fp32 engine's arithmetic bit for bit (`--gemm exact`). */
void ac_set_bf16_gemm_rows(int rows);
int ac_bf16_gemm_rows(void);
/* 1 when BF16 GEMMs of N rows go to the decode GEMV (N <= 8, below the
 * BF16 kernel's rows, ac_bf16_gemm_rows() > 0; the CPU still needs
 * AVX2/FMA, else the per-tile path). */
int ac_bf16_gemv_rows(int N);

#endif
