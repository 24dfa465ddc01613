/*
 * ac_cuda_ssm_int.h - nemotron_h's Mamba-2 mixer ops and its squared ReLU on
 * the device (internal to src/cuda; defined in ac_cuda_ssm.cu, used by the
 * engine, ac_cuda.cu, and the trainer, ac_cuda_train.cu): the causal
 * depthwise conv with SiLU, the selective scan, the grouped gated RMSNorm,
 * relu(x)^2, forward and backward. The device twins of
 * src/runtime/ssm_cpu_int.h, with the same layouts and state conventions
 * (read that header for the notation): rows B sequences of n, sequence-major;
 * the conv reads columns [di, di + C) of in_proj's rows (SI wide), the scan
 * dt from column di + C + h, the gated norm z from columns [0, di).
 *
 * Kernels are simple and correct first, in fp32: the scan is the sequential
 * recurrence (no chunked SSD), one thread per (sequence, head, head channel)
 * walking the tokens in order with its state row [Ns] in device memory; the
 * conv one thread per (sequence, channel) walking the tokens; the backward
 * scan one block per head (threads over head channels and state entries),
 * every step's state of one sequence kept in a work area. GEMMs (in_proj,
 * out_proj) are the callers' (cuBLAS).
 *
 * Every function only launches kernels on stream st (0: the default); the
 * callers check cudaGetLastError. All pointers are device memory; nothing
 * is allocated here.
 */
#ifndef AC_CUDA_SSM_H
#define AC_CUDA_SSM_H

#include <stddef.h>

#ifdef AC_CUDA_EMU
#include "cuda_emu.h"
#else
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#endif

/* One Mamba-2 mixer's shapes and its per-channel / per-head parameters
 * (device pointers, not owned; conv_b may be NULL). */
typedef struct {
    int nh, P, Ns, G, K; /* heads, head dim, state size, groups, conv kernel */
    const float *conv_w; /* [C][K] */
    const float *conv_b; /* [C] or NULL */
    const float *dt_bias, *a_log, *d; /* [nh] */
    const float *norm_w;              /* [nh*P] */
    float eps;
    /* Head gates [nh] on the device (NULL: none, as 1), inside the gated norm as ssm_cpu_int.h's head_gate:
     * channel h*P + p weighs head_gate[h] in its group's statistic, sum m v^2 / sum m, and its output is multiplied
     * by it (the trainer's Mamba head gates; 0 is the head removed) */
    const float *head_gate;
    /* Head-dim gates [P] on the device (NULL: none, as 1): channel h*P + p's weight is head_gate[h] * dim_gate[p]
     * (ssm_cpu_int.h's dim_gate; the trainer's Mamba head-dim gates, 0 is the dim removed from every head) */
    const float *dim_gate;
} acc_ssm;

/* The widest conv kernel the device conv takes (its window lives in registers). */
#define ACC_SSM_MAX_K 16

static inline int acc_ssm_di(const acc_ssm *s) { return s->nh * s->P; }
static inline int acc_ssm_c(const acc_ssm *s) { return s->nh * s->P + 2 * s->G * s->Ns; }
static inline int acc_ssm_si(const acc_ssm *s) { return 2 * s->nh * s->P + 2 * s->G * s->Ns + s->nh; }

/* out[B*n][C] = silu(conv(xBC of zx)). conv_state [B][K-1][C] (NULL: none):
 * with cont the rows before 0 come from it, else zeros; either way it is
 * left holding the last K-1 inputs. */
void acc_ssm_conv_fwd(const acc_ssm *s, float *out, const float *zx, int B, int n, float *conv_state, int cont,
                      cudaStream_t st);
/* y[B*n][di] = the scan of xbc with dt from zx. state [B][nh][P][Ns]: read
 * first with cont, else zeroed; left holding the state after the last row
 * (the trainer passes work of acc_ssm_scan_work_floats). */
void acc_ssm_scan_fwd(const acc_ssm *s, float *y, const float *xbc, const float *zx, int B, int n, float *state,
                      int cont, cudaStream_t st);
/* out[N][di] = groupnorm(y * silu(z)) * norm_w, into outf (fp32) or outb
 * (BF16, a GEMM's input): whichever is not NULL. */
void acc_ssm_gated_norm_fwd(const acc_ssm *s, float *outf, __nv_bfloat16 *outb, const float *y, const float *zx,
                            int N, cudaStream_t st);
/* out[i] = relu(in[i])^2 into outf or outb, as above. */
void acc_relu2_fwd(float *outf, __nv_bfloat16 *outb, const float *in, size_t n, cudaStream_t st);

/* Backward (from position 0, no state), as ssm_cpu_int.h's: parameter
 * gradients accumulate (NULL: not wanted), activation gradients are
 * written. conv: dzx's columns [di, di+C) from dout. scan: dxbc whole and
 * dzx's dt columns from dy; work: acc_ssm_scan_work_floats floats. gated
 * norm: dy whole and dzx's z columns from dout, and prod[N][di] = dout *
 * the normed value times its gate (norm_w's gradient is its column sum:
 * the caller's); with head or dim gates and prodg not NULL, prodg[N][di] =
 * each channel's gate gradient, d loss / d m (the head's is the sum of its
 * P columns over the rows times their dim gates, a dim's the sum over the
 * heads times their head gates: the caller's).
 * relu2: din from dout and the input. */
void acc_ssm_conv_bwd(const acc_ssm *s, float *dzx, float *dconv_w, float *dconv_b, const float *dout,
                      const float *zx, int B, int n, cudaStream_t st);
size_t acc_ssm_scan_work_floats(const acc_ssm *s, int B, int n);
void acc_ssm_scan_bwd(const acc_ssm *s, float *dxbc, float *dzx, float *ddt_bias, float *da_log, float *dd,
                      const float *dy, const float *xbc, const float *zx, int B, int n, float *work, cudaStream_t st);
void acc_ssm_gated_norm_bwd(const acc_ssm *s, float *dy, float *dzx, float *prod, float *prodg, const float *dout,
                            const float *y, const float *zx, int N, cudaStream_t st);
void acc_relu2_bwd(float *din, const float *dout, const float *in, size_t n, cudaStream_t st);

#endif
