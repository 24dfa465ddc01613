/*
 * block_cpu.h - the CPU forward of a block recipe (block.h): each op of the
 * recipe mapped to the CPU kernels (kernels_cpu.h; fp32 activations, weights
 * fp32 or 16-bit in place through ac_linear_w). Used by the engine (prefill
 * and decode through a KV cache, fp32 and BF16 models) and by layer-streamed
 * calibration (windows from position 0, with masks that simulate a pruned
 * layer).
 *
 * Ownership: ac_block_cpu only points at buffers, the model, the masks and
 * the hooks; its owner (the engine, the stream) allocates and frees them.
 */
#ifndef AC_BLOCK_CPU_H
#define AC_BLOCK_CPU_H

#include "runtime/block.h"
#include "runtime/engine.h"
#include "runtime/kernels_cpu.h"
#include "format/model.h"

/* What differs from the model's layer in one call (NULL / 0 = nothing): the
 * structure points of the recipe as masks on activations (never on
 * weights, so the model may be resident). */
typedef struct {
    const float *head_mask; /* [n_heads]: multiplies each query head's attention output before o_proj */
    const float *ffn_mask;  /* [ffn]: multiplies silu(g)*u before down_proj */
    int kv_merge;           /* > 0: KV heads mean-pooled to this many (a divisor), as ac_prune merges */
    /* Hidden width: hid_mask[H] is 1 on the hid_kept kept channels, 0 on the
     * others; the residual stream must be 0 on masked channels (the caller
     * multiplies the embedding rows by the mask); RMSNorms then average over
     * the kept channels and each residual add is masked again. */
    const float *hid_mask;
    int hid_kept;
    /* MoE layers: expert_mask[E] 0 removes an expert from the routing (its
     * logit -inf: the softmax and top-k run over the others), as ac_prune
     * removes it */
    const float *expert_mask;
    /* nemotron_h Mamba layers: ssm_mask[ssm_heads] gates each head inside
     * the gated norm (ssm_cpu_int.h's head_gate: 0 is the head removed) */
    const float *ssm_mask;
} ac_block_mod;

typedef struct {
    const ac_model *m;
    float *slot[AC_T_COUNT]; /* each sized for N rows of the widest layer (X: the caller's residual) */
    const int *pos;          /* [N] position of each row */
    const float *cos_t, *sin_t;
    /* Keys and values attention reads: with kc (the engine), kc[l] and vc[l]
     * are [B][max_ctx][KV] caches that each call appends its rows to at pos0;
     * without (streamed windows), the K and V slots of this call from 0. */
    float **kc, **vc;
    int max_ctx;
    /* Mamba-2 layers: per layer l the decode state ([B][K-1][SC] conv
     * inputs, [B][heads][P][Ns] SSM states, ssm_cpu_int.h), continued when
     * pos0 > 0 and restarted at 0. Required for hybrid models: the
     * engine's, one per layer; streamed calibration's windows always
     * start at 0, so every layer's points at one shared buffer. */
    float **conv_s, **ssm_s;
    float *scores; /* n * (pos0 + n) floats */
    int *rows;     /* max(N, E) ints (models with MoE layers): the experts in routing order, then the rows
                    * routed to one expert */
    ac_wscratch *ws;
    const ac_block_mod *mod;      /* may be NULL */
    const ac_engine_hooks *hooks; /* may be NULL */
} ac_block_cpu;

/* Layer l of c->m over B sequences of n tokens at position pos0 (rows in
 * the slots, x in c->slot[AC_T_X], updated in place). Calls the hooks'
 * normed, head_out and ffn_act (not begin, layer_io or rows: the caller's). */
void ac_block_cpu_forward(const ac_block_cpu *c, int l, int B, int n, int pos0);
/* Sub-block sb of layer l's recipe alone (nothing when absent in the layer). */
void ac_block_cpu_forward_sub(const ac_block_cpu *c, int l, int sb, int B, int n, int pos0);

/* Scratch of one expert (ac_block_cpu_expert): xe [N][H], g and u [N][Fe],
 * rows [N], and ac_linear_w's. */
typedef struct {
    float *xe, *g, *u;
    int *rows;
    ac_wscratch *ws;
} ac_expert_scratch;

/* One expert e of a mixture of experts as the CPU engine runs it (the
 * EXPERTS op of ac_block_cpu_forward; the CPU cost tables time it too,
 * costmeasure.c): the rows i of in[N][H] whose routing weight r[i*E + e]
 * is non-zero gathered, through the expert's SwiGLU, silu(X wg^T) *
 * (X wu^T) (wg NULL: nemotron_h's relu(X wu^T)^2), its down projection wd,
 * and added into x[N][H] scaled by that weight. Weights stored in wdt
 * (ac_linear_w): wg and wu [Fe][H], wd [H][Fe]. hk (may be NULL): its
 * expert_act and expert_out hooks, called with layer l. Returns the rows
 * routed to the expert. */
int ac_block_cpu_expert(float *x, const float *in, const float *r, int N, int H, int E, int e, const void *wg,
                        const void *wu, const void *wd, int wdt, int Fe, const ac_expert_scratch *s,
                        const ac_engine_hooks *hk, int l);

/* The slots a model's MoE and hybrid (nemotron_h) layer kinds add to the
 * dense ones (block.h), each for N rows of the widest layer, into ks (all
 * NULL on entry): R, XE, EG, EU (MoE layers: routing weights, an expert's
 * gathered rows, hidden wide or LatentMoE's latent where wider, and its
 * SwiGLU), ZX, XBC, Y, YN (Mamba-2 layers), SU, SG (the shared expert of a
 * hybrid's MoE layers), XL, YL (LatentMoE); none in a dense model. Returns
 * the widest GEMM input among them (at least 1: for ac_wscratch_alloc), 0
 * when out of memory. The owner frees them with ac_block_cpu_kind_free
 * (NULL entries skipped) and puts them in an executor's slots with
 * ac_block_cpu_kind_slots. */
size_t ac_block_cpu_kind_alloc(const ac_arch *a, size_t N, float *ks[AC_T_COUNT]);
void ac_block_cpu_kind_free(float *ks[AC_T_COUNT]);
/* slot[t] = ks[t] for every set ks[t]. */
void ac_block_cpu_kind_slots(float *slot[AC_T_COUNT], float *const ks[AC_T_COUNT]);

/* RMSNorm over the kept hidden channels of mod (plain ac_rmsnorm without a
 * hidden mask): the final norm before the head uses it too. */
void ac_block_cpu_norm(float *out, const float *x, const float *w, int N, int H, float eps, const ac_block_mod *mod);

#endif
