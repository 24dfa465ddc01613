/*
 * stream.h - one transformer layer at a time over cached activations, for
 * layer-streamed calibration (importance.c): the residual stream of the
 * calibration windows is kept in memory, layer l runs over it (statistics
 * hooks see what the engine's hooks see), and its output is layer l+1's
 * input. A layer can run with units masked (query heads' attention outputs
 * or FFN channels multiplied by 0 before o_proj / down_proj, exactly their
 * removal), with its KV heads merged, or with hidden channels masked (what
 * ac_prune's narrower hidden width computes); the final norm + LM head's
 * loss; and the backward of a layer and of the loss with respect to the
 * residual stream (no weight gradients), for gradient-based sensitivity.
 *
 * Mixture-of-experts layers run as in the engine; their experts can be
 * masked (ac_block_mod.expert_mask: removed from the routing, as ac_prune
 * removes them). The backward of MoE layers needs fp32 weights
 * (block_grad.h).
 *
 * Hybrid (nemotron_h) models run every layer kind through the same recipe
 * executor as the engine (block_cpu.h): Mamba-2 layers (in_proj, causal
 * conv, selective scan, gated norm, out_proj; each window's conv and SSM
 * state from zero, so windows never leak into each other), squared-ReLU
 * MLPs, attention, and MoE layers with the sigmoid router, the shared
 * expert and LatentMoE's projections. Their backward runs on the fp32
 * executor of block_grad.h; on a 16-bit (resident) model each layer's
 * matrices are converted for it as it is reached (the routed experts one
 * at a time), as the frozen trainer converts them.
 *
 * Masks act on activations, never on weights: the model is only read, so
 * it may be resident (BF16/F16 matrices in the mapped checkpoint,
 * ac_model_load_resident); the GEMMs go through ac_linear_w as in the
 * engine, and the backward converts 16-bit weight rows per tile.
 *
 * Same arithmetic as engine.c's forward (kernels_cpu.h), windows always
 * start at position 0 (no KV cache: a window's keys are its own rows).
 * Ownership: ac_stream owns its scratch buffers (ac_stream_free); the model
 * is borrowed.
 */
#ifndef AC_STREAM_H
#define AC_STREAM_H

#include "runtime/block_cpu.h"
#include "runtime/engine.h"
#include "core/err.h"
#include "format/model.h"

typedef struct {
    const ac_model *m;
    int B, n, wdt; /* at most B windows of n tokens per call; the model's matrix dtype */
    float *xn, *q, *kt, *vt, *att, *g, *u, *x0, *scores, *cos_t, *sin_t, *logits;
    int *pos;
    /* mixture-of-experts layers (NULL in a dense model): the routing
     * order's ints */
    int *rows;
    /* the slots MoE and hybrid (nemotron_h) layers add (NULL otherwise;
     * ac_block_cpu_kind_alloc: routing weights, an expert's rows and SwiGLU,
     * Mamba-2's, the shared expert's, LatentMoE's); a hybrid's per-layer conv
     * and SSM state pointers, every layer's at one buffer (conv_buf, ssm_buf:
     * windows start at position 0, so each call restarts the state and
     * nothing reads it back) */
    float *kind_slot[AC_T_COUNT], *conv_buf, *ssm_buf;
    float **conv_s, **ssm_s;
    ac_wscratch ws; /* 16-bit weights: the GEMMs' scratch */
    /* backward (ac_stream_want_grad), NULL otherwise: the final norm's xhat
     * and 1/rms, a layer's input copy, the block executor's tape (one layer)
     * and scratch (block_grad.h), a tile of converted weight rows */
    float *xh1, *r1, *x1, *dxn, *dw, *tape, *bscr, *wtile;
    int wtile_rows;
    /* a hybrid's backward on 16-bit weights (NULL otherwise): layer l's
     * matrices converted to fp32 for the fp32 executor (wscr, the view wl),
     * the routed experts one at a time (escr; ac_block_grad_layer_f32) */
    float *wscr, *escr;
    ac_layer_w wl;
    int wl_at; /* wl is layer wl_at - 1's (0: none yet) */
} ac_stream;

/* What differs from the model's layer in one call: the recipe's structure
 * points as masks (block_cpu.h). */
typedef ac_block_mod ac_stream_mod;

int ac_stream_init(ac_stream *s, const ac_model *m, int B, int n, ac_err *e);
/* Also allocate what ac_stream_layer_backward and ac_stream_nll_grad need. */
int ac_stream_want_grad(ac_stream *s, ac_err *e);
void ac_stream_free(ac_stream *s);
/* x[B*n][H] (B <= s->B windows of s->n tokens): x = layer l (x), in place.
 * hk (may be NULL) sees normed/head_out/ffn_act/layer_io as in the engine. */
void ac_stream_layer(ac_stream *s, int l, float *x, int B, const ac_stream_mod *mod, const ac_engine_hooks *hk);
/* Rows of the token embedding: x[N][H] for tok[N]; -1 on an id outside the vocabulary. */
int ac_stream_embed(const ac_model *m, const int *tok, long N, float *x, ac_err *e);
/* Sum over the B windows of the cross-entropy of predicting tok[b][t+1]
 * from row (b, t) of the final residual x, t < n-1 (x is not modified);
 * *count predictions. mod: only its hidden mask is used (may be NULL). */
double ac_stream_nll(ac_stream *s, const float *x, const int *tok, int B, const ac_stream_mod *mod, long *count);
/* As ac_stream_nll (no mask), and dx[B*n][H] = d(summed loss)/dx. With
 * rng (a seed, advanced), the gradient is taken for labels drawn from the
 * model's own distribution instead of tok (the returned loss stays tok's):
 * its outer product is the Fisher / Gauss-Newton matrix in expectation. */
double ac_stream_nll_grad(ac_stream *s, const float *x, const int *tok, int B, unsigned *rng, float *dx);
/* dx[B*n][H]: the gradient at layer l's output on input x_in (unmodified
 * layer) becomes the gradient at its input, in place (the layer's forward
 * is recomputed from x_in). Any number B of windows (s->B at a time). */
void ac_stream_layer_backward(ac_stream *s, int l, const float *x_in, float *dx, int B);

#endif
