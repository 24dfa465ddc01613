/*
 * block_grad.h - the CPU backward of a block recipe (block.h): a forward
 * that keeps on a per-layer tape what the backward needs, and the backward
 * through it, walking the recipe in reverse. Used by the trainer (weights
 * and gates learn) and by streamed calibration's layer gradients (nothing
 * learns; weights may be 16-bit in place).
 *
 * Structure points are gates (the differentiable search's relaxation):
 * AC_OP_MASK on width Q multiplies each query head by gate[AC_DIM_Q][h], on
 * width F each channel by gate[AC_DIM_F][c], on width SSM (nemotron_h) each
 * Mamba head by gate[AC_DIM_SSM][h]; every RMSNorm is the gated one
 * of backward_cpu.h over gate[AC_DIM_H] (its mean square over the gates'
 * mass, so gates in {0,1} are the narrower hidden width); the residual add
 * that ends sub-block s is scaled by sub_gate[s]. NULL gates are 1.
 * KV merging and hidden masks after residual adds are not differentiated
 * here (the gate search relaxes KV merges through weight overrides).
 * A mixture-of-experts sub-block differentiates ROUTE (softmax, the
 * renormalisation of the top-k; the selection itself is piecewise
 * constant) and EXPERTS (each expert's SwiGLU on its rows, the routing
 * weights), with the gradients of the router and of every expert.
 * Its gates: gate[AC_DIM_E] [E] multiplies each expert's softmax numerator
 * (ac_moe_route_gated: 0 is the expert removed, the softmax, top-k and
 * renormalisation then over the others, as in the pruned model; with the
 * sigmoid router, ac_moe_route_sigmoid's gates: a chosen expert weighs
 * z s, a gate of 0 is never chosen, and d z = s dq on the rows that chose
 * the expert); gate[AC_DIM_FE] [E][FE]
 * (expert e's channels at e*FE) multiplies each expert's silu(gate) * up
 * (relu(up)^2) channel before its down projection.
 *
 * Tape (per layer, ac_block_tape_floats in block.h): the outputs of LINEAR (not the
 * residual add) and ATTENTION ops as the forward leaves them (a ROPE
 * rotates its LINEAR's output in place there), and each RMSNorm's xhat
 * [N][H] and 1/rms [N]. The outputs of the cheap ops (norms, SwiGLU, masks)
 * are recomputed in the backward into the scratch. For the Llama block this
 * is xhat, r, q, k, v, attention output, gate and up projections.
 *
 * Ownership: the caller owns the tape, the scratch, the weights and every
 * gradient buffer; ac_block_grad only points at them.
 */
#ifndef AC_BLOCK_GRAD_H
#define AC_BLOCK_GRAD_H

#include <stddef.h>

#include "runtime/block.h"
#include "core/err.h"
#include "runtime/kernels_cpu.h"
#include "format/model.h"

typedef struct {
    const ac_model *m; /* the arch (and nothing else of it is read: weights come from w) */
    const ac_layer_w *w;
    int wdt;        /* dtype of w's matrices: ST_F32, or 16-bit (then no weight gradients: gw must be NULL) */
    ac_layer_w *gw; /* weight gradients, accumulated; NULL, or NULL fields, for none */
    const float *gate[AC_DIM_COUNT];
    float *dgate[AC_DIM_COUNT]; /* accumulated; NULL for none */
    const float *sub_gate;      /* [n_sub] or NULL; NULL with 16-bit weights (their residual add is unscaled) */
    float *dsub_gate;           /* [n_sub] accumulated, or NULL */
    int B, T;                   /* B sequences of T tokens from position 0 */
    const int *pos;             /* [B*T] */
    const float *cos_t, *sin_t;
    float *tape;     /* this layer's: ac_block_tape_floats(a, l, B*T, 0) */
    float *scratch;  /* ac_block_grad_scratch_floats(a, B, T) */
    ac_wscratch *ws; /* 16-bit weights: forward GEMMs */
    float *wtile;    /* 16-bit weights: wtile_rows rows of the widest input, converted for dX */
    int wtile_rows;
    int *rows; /* MoE layers: max(B*T, experts) ints (routing order, the rows routed to one expert) */
    const float *ssm_dim_gate; /* nemotron_h Mamba layers: head-dim gates [ssm_head_dim] in the gated norm (ac_ssm's
                                * dim_gate), or NULL */
    float *dssm_dim_gate;      /* their gradient, accumulated, or NULL */
    /* 16-bit experts under fp32 GEMMs (the frozen trainer, train.h): with escr non-NULL, w's expert matrices
     * are stored in ewdt and each expert's are converted into escr (ac_block_grad_expert_floats) as its rows
     * reach it, then multiplied as fp32 (exact: the GEMMs of an fp32 copy bit for bit); NULL: they are in wdt */
    float *escr;
    int ewdt;
} ac_block_grad;

/* 0 when every op of a's recipes has a backward here for matrices of
 * dtype wdt; else -1 with the reason (nemotron_h's layers: fp32 weights
 * only, which the frozen trainer gives them by converting a 16-bit model
 * one layer and one expert at a time; softmax-routed MoE layers run on
 * 16-bit ones too). */
int ac_block_grad_supports(const ac_arch *a, int wdt, ac_err *e);

/* Floats of one expert's matrices (gate, up, down; nemotron_h's have no gate) in the widest MoE layer of a: the
 * size of ac_block_grad.escr (0 without experts). */
size_t ac_block_grad_expert_floats(const ac_arch *a);

/* An fp32 view of a 16-bit model's layer, for the executor with wdt ST_F32
 * (the frozen trainer, streamed calibration's hybrid layers): *w = m's
 * layer l with every matrix but the routed experts' (those: escr and ewdt,
 * one expert at a time) converted into scr (exact; fp32 ones kept), and
 * where ov (may be NULL) sets them, ov's attention and MLP matrices and
 * q/k/v biases instead. scr holds ac_block_grad_view_floats(&m->a) floats
 * (the widest layer's); w borrows m, ov and scr. */
size_t ac_block_grad_view_floats(const ac_arch *a);
void ac_block_grad_layer_f32(const ac_model *m, int l, const ac_layer_w *ov, float *scr, ac_layer_w *w);

/* The tape of layer l for N rows is ac_block_tape_floats(a, l, N, 0)
 * (block.h); the scratch for B sequences of T tokens: */
size_t ac_block_grad_scratch_floats(const ac_arch *a, int B, int T);

/* x[N][H] = layer l (x), in place, filling c->tape. */
void ac_block_grad_forward(ac_block_grad *c, int l, float *x);
/* dx[N][H]: the gradient at layer l's output becomes the gradient at its
 * input (same tape as the last forward of l); weight and gate gradients
 * accumulate. */
void ac_block_grad_backward(ac_block_grad *c, int l, float *dx);

#endif
