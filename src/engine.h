/*
 * engine.h - the transformer forward pass (CPU, fp32) over an ac_model,
 * heterogeneous layers included, with a KV cache so the same call serves
 * prefill (n tokens) and decode (n = 1).
 *
 * Memory: ac_engine_init allocates every activation buffer and the KV cache
 * once for (max_batch, max_ctx); forward never allocates. The engine borrows
 * the model (it must outlive the engine). Optional activation statistics
 * (ac_stats) are accumulated during forward for importance scoring.
 */
#ifndef AC_ENGINE_H
#define AC_ENGINE_H

#include "err.h"
#include "model.h"

typedef struct {
    int n_layers, hidden;
    double **head;    /* [l][n_heads]: sum over tokens of ||head output||^2 */
    double **ffn;     /* [l][ffn]: sum over tokens of |silu(g)*u| */
    double *hidden_a; /* [H]: sum over tokens and norms of |normed x| */
    double *layer;    /* [l]: sum over tokens of 1 - cos(x_in, x_out) */
    float **ffn_gram; /* [l][ffn*ffn]: A^T A of FFN activations, or NULL (opt-in) */
    /* Minitron importance as NVIDIA Model-Optimizer's hooks gather it (opt-in,
     * NULL otherwise): per sequence the mean over its tokens of |x| per
     * channel, squared, summed over sequences (the reader takes the sqrt). */
    double **mt_attn; /* [l][n_heads*head_dim]: o_proj input */
    double **mt_ffn;  /* [l][ffn]: down_proj input */
    double **mt_norm; /* [2l] input_layernorm, [2l+1] post_attention_layernorm outputs, [H] */
    double *mt_tmp;   /* scratch, widest of the above */
    long tokens;
} ac_stats;

int ac_stats_init(ac_stats *s, const ac_arch *a, ac_err *e);
/* Also accumulate the Gram matrix of each layer's FFN activations (for
 * least-squares repair); memory ffn^2 floats per layer. */
int ac_stats_want_gram(ac_stats *s, const ac_arch *a, ac_err *e);
/* Also gather the Minitron statistics (mt_*); a few widths per layer. */
int ac_stats_want_minitron(ac_stats *s, const ac_arch *a, ac_err *e);
void ac_stats_free(ac_stats *s);

typedef struct {
    const ac_model *m;
    int max_batch, max_ctx;
    float *x, *x0, *xn, *q, *att, *g, *u, *kt, *vt, *scores, *logits;
    float **kc, **vc;     /* per layer [max_batch][max_ctx][kv_heads*head_dim] */
    float *cos_t, *sin_t; /* [max_ctx][head_dim/2] */
    int *pos;
    ac_stats *stats;      /* borrowed; NULL = no statistics */
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
