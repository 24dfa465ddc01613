/*
 * engine.h - the transformer forward pass (CPU, fp32) over an ac_model,
 * heterogeneous layers included, with a KV cache so the same call serves
 * prefill (n tokens) and decode (n = 1).
 *
 * Memory: ac_engine_init allocates every activation buffer and the KV cache
 * once for (max_batch, max_ctx); forward never allocates. The engine borrows
 * the model (it must outlive the engine); its matrices may be fp32 or stay
 * BF16/F16 in the mapped checkpoint (ac_model_load_resident, kernels_cpu.h). Optional hooks see the
 * activations (importance scoring's statistics, stats.h).
 */
#ifndef AC_ENGINE_H
#define AC_ENGINE_H

#include "core/err.h"
#include "runtime/block.h"
#include "runtime/kernels_cpu.h"
#include "format/model.h"

/* Observation points of the forward pass, for whoever watches activations
 * (activation statistics: stats.c); any may be NULL. N rows of this call. */
typedef struct {
    void *ud;
    /* before the first layer: this call runs B sequences of n tokens (N = B*n rows, sequence-major) */
    void (*begin)(void *ud, int B, int n);
    /* xn[N][H]: the normed input of the attention (block 0) or FFN (block 1) */
    void (*normed)(void *ud, int layer, int block, const float *xn, int N, int H);
    /* att[N][n_heads*hd]: attention output per head, before o_proj */
    void (*head_out)(void *ud, int layer, const float *att, int N, int n_heads, int hd);
    /* act[N][F]: silu(gate) * up, before down_proj */
    void (*ffn_act)(void *ud, int layer, const float *act, int N, int F);
    /* MoE: expert e of layer l ran on the n rows rows[] (their routing weights r[rows[j]*E + e]), its outputs
     * y[n][H] before the weighting */
    void (*expert_out)(void *ud, int layer, int e, const int *rows, int n, const float *r, int E, const float *y,
                       int H);
    /* MoE: the same expert's act[n][Fe], silu(gate) * up (relu(up)^2 in nemotron_h), before its down projection */
    void (*expert_act)(void *ud, int layer, int e, const float *act, int n, int Fe);
    /* x_in, x_out[N][H]: the residual stream before and after the layer */
    void (*layer_io)(void *ud, int layer, const float *x_in, const float *x_out, int N, int H);
    /* after the last layer: N rows went through */
    void (*rows)(void *ud, int N);
    /* nemotron_h Mamba-2 layer: zx[N][width], in_proj's output (z, x, B, C,
     * dt; x is channels d_inner .. 2 d_inner), before the conv */
    void (*ssm_in)(void *ud, int layer, const float *zx, int N, int d_inner, int width);
    /* nemotron_h MoE layer: act[N][Fs], the shared expert's relu(up)^2 before its down projection */
    void (*shared_act)(void *ud, int layer, const float *act, int N, int Fs);
} ac_engine_hooks;

typedef struct {
    const ac_model *m;
    int max_batch, max_ctx;
    float *x, *x0, *xn, *q, *att, *g, *u, *kt, *vt, *scores, *logits;
    int *rows;               /* MoE: max(N, experts) ints */
    float **kc, **vc;        /* per layer [max_batch][max_ctx][kv_heads*head_dim] */
    /* The slots MoE and hybrid (nemotron_h) layers add (block.h's R, XE,
     * EG, EU, ZX, XBC, Y, YN, SU, SG, XL, YL; ac_block_cpu_kind_alloc) and
     * per Mamba layer its decode state (block_cpu.h); NULL else */
    float *kind_slot[AC_T_COUNT];
    float **conv_s, **ssm_s;
    float *cos_t, *sin_t; /* [max_ctx][head_dim/2] */
    int *pos;
    ac_wscratch ws;               /* GEMMs over 16-bit weights (resident models) */
    const ac_engine_hooks *hooks; /* borrowed; NULL = nobody watches */
} ac_engine;

int ac_engine_init(ac_engine *en, const ac_model *m, int max_batch, int max_ctx, ac_err *e);
void ac_engine_free(ac_engine *en);

/* Run tokens[B][n] (row-major) for B sequences, each continuing at position
 * pos0 (the KV cache holds positions < pos0 from earlier calls). Logits land
 * in en->logits: [B*n][V] when last_only == 0, else [B][V] for the last token
 * of each sequence. */
int ac_engine_forward(ac_engine *en, const int *tokens, int B, int n, int pos0, int last_only, ac_err *e);

/* Mean cross-entropy (nats) of predicting tokens[b][t+1] from row (b,t) of
 * en->logits, for t in [from, n-1). Rows must come from a last_only=0 call. */
double ac_engine_nll(const ac_engine *en, const int *tokens, int B, int n, int from, long *count);

#endif
