/*
 * ssm_cpu_int.h - the Mamba-2 mixer's ops on the CPU, forward and backward,
 * fp32 with the recurrence run step by step (no chunked SSD): the causal
 * depthwise conv with SiLU, the selective scan, the grouped gated RMSNorm,
 * and nemotron_h's squared ReLU. block_cpu.c (forward) and block_grad.c
 * (backward) call them for the recipe's AC_OP_SSM_CONV, AC_OP_SSM_SCAN,
 * AC_OP_GATED_NORM and AC_OP_RELU2 (block.h has their definitions).
 *
 * Rows: B sequences of n rows each, sequence-major. Strided inputs: the
 * conv reads columns [off, off + C) of rows `ld` floats wide (in_proj's
 * output), the scan reads dt from column dt_off of such rows and writes
 * its gradient there, the gated norm reads z from columns [0, di).
 *
 * Decode state (the engine's, per layer): conv_state [B][K-1][C], the last
 * K-1 conv inputs of each sequence; ssm_state [B][heads][P][Ns]. With
 * cont, a call continues from them; without, it starts from zeros. Either
 * way they are left holding the state after the call's last row.
 *
 * Ownership: nothing is allocated; the caller passes every buffer.
 */
#ifndef AC_SSM_CPU_H
#define AC_SSM_CPU_H

#include <stddef.h>

#include "format/model.h"

/* The shapes of one Mamba-2 mixer and the per-head / per-channel
 * parameters (not owned). */
typedef struct {
    int nh, P, Ns, G, K; /* heads, head dim, state size, groups, conv kernel */
    const float *conv_w; /* [C][K] */
    const float *conv_b; /* [C] or NULL */
    const float *dt_bias, *a_log, *d; /* [nh] */
    const float *norm_w;              /* [nh*P] */
    float eps;
    /* Head gates [nh] and head-dim gates [P] (NULL: none, as 1): channel h*P + p of the gated norm weighs m =
     * head_gate[h] * dim_gate[p] in its group's statistic, sum m v^2 / sum m, and its output is multiplied by m;
     * gates in {0,1} are the norm of the model without the gated-off heads and dims (the differentiable search's
     * Mamba head and mamba_head_dim gates) */
    const float *dim_gate, *head_gate;
} ac_ssm;

/* Layer l's mixer (a layer with ssm_heads > 0). */
ac_ssm ac_ssm_of(const ac_arch *a, const ac_layer_w *w, int l);
/* di = nh*P; C = di + 2*G*Ns; the in_proj width di + C + nh. */
int ac_ssm_di(const ac_ssm *s);
int ac_ssm_c(const ac_ssm *s);
int ac_ssm_si(const ac_ssm *s);

/* out[B*n][C] = silu(conv(in)) where in is columns [di, di+C) of zx. */
void ac_ssm_conv_fwd(const ac_ssm *s, float *out, const float *zx, int B, int n, float *conv_state, int cont);
/* y[B*n][di] = scan(xbc, dt of zx). S: the state buffers: ssm_state
 * ([B][nh][P][Ns], with cont read first) or, with ssm_state NULL, P*Ns
 * floats of work (zeros first). */
void ac_ssm_scan_fwd(const ac_ssm *s, float *y, const float *xbc, const float *zx, int B, int n, float *ssm_state,
                     int cont, float *work);
/* out[N][di] = groupnorm(y * silu(z)) * norm_w (with dim_gate, as above). */
void ac_ssm_gated_norm_fwd(const ac_ssm *s, float *out, const float *y, const float *zx, int N);
/* out[n] = relu(in)^2. */
void ac_relu2_fwd(float *out, const float *in, size_t n);

/* Backward (from position 0, no cached state). Gradients of parameters
 * (dconv_w, dconv_b, ddt_bias, da_log, dd, dnorm_w) accumulate when not
 * NULL; the activations' gradients are written:
 * conv: dzx's columns [di, di+C) from dout (the gradient of its output);
 * scan: dxbc whole, dzx's dt columns, from dy; work: ac_ssm_scan_work;
 * gated norm: dy whole and dzx's z columns, from dout;
 * relu2: din from dout and the input. */
void ac_ssm_conv_bwd(const ac_ssm *s, float *dzx, float *dconv_w, float *dconv_b, const float *dout, const float *zx,
                     int B, int n);
size_t ac_ssm_scan_work(const ac_ssm *s, int n);
void ac_ssm_scan_bwd(const ac_ssm *s, float *dxbc, float *dzx, float *ddt_bias, float *da_log, float *dd,
                     const float *dy, const float *xbc, const float *zx, int B, int n, float *work);
/* ddim_gate [P] and dhead_gate [nh] (NULL: none) accumulate the gates' gradients. */
void ac_ssm_gated_norm_bwd(const ac_ssm *s, float *dy, float *dzx, float *dnorm_w, float *ddim_gate, float *dhead_gate,
                           const float *dout, const float *y, const float *zx, int N);
void ac_relu2_bwd(float *din, const float *dout, const float *in, size_t n);

#endif
